"""The request frame of a finished simulation: one row per request with its latency decomposition (ms).

TTFT at the client = network RTT + queue + cold start + prefill; every token travels back over the same path,
so E2E and TPOT are measured at the client too. See ``edgepop simulate``'s documentation for the columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

OUTCOME_NAMES = {1: "ok", 2: "rejected", 3: "failed"}


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
    site_ids = fleet.sites.site_id.to_numpy()
    node_ids = fleet.nodes.node_id.to_numpy()
    return pd.DataFrame({
        "deployment": sim.dep.name,
        "request_id": w.request_id.to_numpy(),
        "model": sim.models, "task": w.task.to_numpy(),
        "user_lat": w.user_lat.to_numpy(), "user_lon": w.user_lon.to_numpy(),
        "user_country": w.user_country.to_numpy(), "user_continent": w.user_continent.to_numpy(),
        "ingress_pop": (sim.dep.ingress_ids[sim.key] if sim.dep.ingress_ids is not None
                        else w.ingress_pop.to_numpy()),
        "serving_site": np.where(site >= 0, site_ids[np.maximum(site, 0)], ""),
        "node": np.where(node >= 0, node_ids[np.maximum(node, 0)], ""),
        "arrival_s": sim.arrival,
        "network_rtt_ms": np.where(site >= 0, net, np.nan),
        "queue_ms": np.where(started, queue, np.nan),
        "cold_start_ms": np.where(started, cold, np.nan),
        "prefill_ms": np.where(started, prefill, np.nan),
        "ttft_ms": np.where(started, ttft, np.nan),
        "tpot_ms": tpot,
        "e2e_ms": np.where(ok, e2e, np.nan),
        "stall_ms": np.where(ok, f(sim.stall_s) * 1e3, np.nan), "stalls": np.asarray(sim.stalls, dtype=np.int64),
        "retry_lost_ms": np.where(started, lost, np.nan), "retries": np.asarray(sim.retries, dtype=np.int16),
        "prompt_tokens": sim.prompt, "output_tokens": np.where(ok, sim.output, 0),
        "batch": (w.batch.to_numpy(dtype=bool) if "batch" in w else np.zeros(sim.n, bool)),
        "cached_tokens": np.asarray(sim.cached, dtype=np.int64),
        "outcome": pd.Series(outcome).map(OUTCOME_NAMES).to_numpy(),
        "error_code": np.asarray(sim.code, dtype=np.int32),
    })
