"""The request frame of a finished simulation: one row per request with its latency decomposition (ms).

TTFT at the client = network RTT + queue + cold start + prefill; every token travels back over the same path,
so E2E and TPOT are measured at the client too. See ``edgepop simulate``'s documentation for the columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The simulator's outcome codes, and their names (0, not ended, is missing)
OUT_NONE, OUT_OK, OUT_REJECTED, OUT_FAILED = 0, 1, 2, 3
OUTCOME_BY_CODE = np.array([None, "ok", "rejected", "failed"], dtype=object)


def request_frame(sim) -> pd.DataFrame:
    """The per-request frame of ``sim`` (a :class:`sim.simulator.Simulation` that has run)."""
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    first_token, finished, joined = f(sim.first_token), f(sim.finished), f(sim.joined)
    backbone, cold = f(sim.backbone_ms), f(sim.cold_ms)
    outcome = np.asarray(sim.outcome, dtype=np.int8)
    site, node = np.asarray(sim.site, dtype=np.int64), np.asarray(sim.node, dtype=np.int64)
    ok = outcome == 1
    net = backbone + sim.access_s * 1e3
    one_way_back = net / 2e3
    ttft = (first_token + one_way_back - sim.arrival) * 1e3
    e2e = (finished + one_way_back - sim.arrival) * 1e3
    gen = sim.output > 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(gen & ok, (finished - first_token) * 1e3 / np.maximum(sim.output - 1, 1), np.nan)
    prefill = (first_token - joined) * 1e3
    queue = (joined - f(sim.at_node)) * 1e3 - cold
    lost = (f(sim.decided) - f(sim.first_decision)) * 1e3
    started = ~np.isnan(first_token)
    fleet, w = sim.dep.fleet, sim.w
    # Ids as object arrays of a few shared strings: the frame turns them into string columns without making one
    # Python str per request.
    site_ids = np.append(fleet.sites.site_id.to_numpy(dtype=object), "")
    node_ids = np.append(fleet.nodes.node_id.to_numpy(dtype=object), "")
    ingress = (sim.dep.ingress_ids.astype(object)[sim.key] if sim.dep.ingress_ids is not None
               else _text(w.ingress_pop))
    # Every array below is new (workload columns are copied), so the frame can own them as they are: building it
    # with copy=False skips consolidating them into 2-D blocks, a second copy of the frame at its peak.
    return pd.DataFrame({
        "deployment": sim.dep.name,
        "request_id": w.request_id.to_numpy(copy=True),
        "model": _text(w.model), "task": _text(w.task),
        "user_lat": w.user_lat.to_numpy(copy=True), "user_lon": w.user_lon.to_numpy(copy=True),
        "user_country": _text(w.user_country), "user_continent": _text(w.user_continent),
        "ingress_pop": ingress,
        "serving_site": site_ids[np.where(site >= 0, site, -1)],
        "node": node_ids[np.where(node >= 0, node, -1)],
        "arrival_s": np.array(sim.arrival, copy=True),
        "network_rtt_ms": np.where(site >= 0, net, np.nan),
        "queue_ms": np.where(started, queue, np.nan),
        "cold_start_ms": np.where(started, cold, np.nan),
        "prefill_ms": np.where(started, prefill, np.nan),
        "ttft_ms": np.where(started, ttft, np.nan),
        "tpot_ms": tpot,
        "e2e_ms": np.where(ok, e2e, np.nan),
        "stall_ms": np.where(ok, f(sim.stall_s) * 1e3, np.nan), "stalls": np.array(sim.stalls, dtype=np.int64),
        "retry_lost_ms": np.where(started, lost, np.nan), "retries": np.array(sim.retries, dtype=np.int16),
        "prompt_tokens": np.array(sim.prompt, copy=True), "output_tokens": np.where(ok, sim.output, 0),
        "batch": (w.batch.to_numpy(dtype=bool, copy=True) if "batch" in w else np.zeros(sim.n, bool)),
        "cached_tokens": np.array(sim.cached, dtype=np.int64),
        "outcome": OUTCOME_BY_CODE[outcome],
        "error_code": np.array(sim.code, dtype=np.int32),
    }, copy=False)


def _text(column: pd.Series):
    """A workload string column as the request frame's string column, without a Python str per row (Arrow-backed
    columns are shared as they are: they are immutable)."""
    return column.astype("str").array


def concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(frames, ignore_index=True)`` that empties ``frames`` column by column as it goes.

    Each column's parts are freed once joined (the request frames keep a block per column), so the peak is one
    copy of the rows plus a column instead of two copies: at a million requests per deployment, ~0.5 GB less.
    Frames with different columns are joined by ``pd.concat`` and left as they are.
    """
    if len(frames) < 2 or any(list(f.columns) != list(frames[0].columns) for f in frames[1:]):
        return pd.concat(frames, ignore_index=True)
    columns = {c: pd.concat([f.pop(c) for f in frames], ignore_index=True) for c in list(frames[0].columns)}
    return pd.DataFrame(columns, copy=False)
