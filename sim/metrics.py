"""Summaries of simulated requests: latency percentiles, SLO attainment, goodput, cost, and edge-vs-central gains."""

from __future__ import annotations

import numpy as np
import pandas as pd

from controlplane.billing import USD_PER_1000_NEURONS, fleet_cost, neurons_array
from controlplane.outcomes import Code
from edgepop.stats import finite, percentiles
from sim.gains import MIN_BIN
from sim.rejections import not_ok_codes
from sim.techniques.metrics import ITL_COLUMNS, itl_percentiles


def slo_met(frame: pd.DataFrame, slo) -> np.ndarray:
    """Per request: ended ok and met its SLO (TTFT and TPOT for generation, E2E for one-shot tasks)."""
    # compared as columns: reading string columns to_numpy() would make a Python str per row
    ok = (frame.outcome == "ok").to_numpy(dtype=bool)
    gen = (frame.task == "text-generation").to_numpy(dtype=bool)
    ttft = frame.ttft_ms.to_numpy()
    tpot = np.nan_to_num(frame.tpot_ms.to_numpy(), nan=0.0)
    e2e = frame.e2e_ms.to_numpy()
    with np.errstate(invalid="ignore"):
        gen_ok = (ttft <= slo.ttft_ms) & (tpot <= slo.tpot_ms)
        one_ok = e2e <= slo.e2e_ms
    return ok & np.where(gen, gen_ok, one_ok)


def deployment_summary(frame: pd.DataFrame, util: pd.DataFrame, fleet, duration_s: float, slo, catalog,
                       gpu_busy_s: float, billing_s: float | None = None) -> dict:
    """The per-deployment block of summary.json.

    ``duration_s`` (arrivals until the last request ended) divides GPU busy time; ``billing_s`` is the window
    the fleet is paid for, the same for every deployment of a run (default ``duration_s``): GPU cost is
    GPU-hours x each GPU type's price per hour over it, and goodput is SLO-met requests over it (the same window
    for every deployment: one long request's drain would otherwise decide a deployment's figure).
    """
    counts = frame.outcome.value_counts().to_dict()
    # Latency figures are the interactive requests'; async batch rows (queueRequest) have their own block.
    batch = frame.batch.to_numpy(dtype=bool) if "batch" in frame else np.zeros(len(frame), bool)
    ok = (frame.outcome == "ok") & ~batch
    met = slo_met(frame, slo)
    gen = frame.task == "text-generation"
    audio = frame.model.isin([s.id for s in catalog if s.unit == "audio-minute"]).to_numpy()
    units = np.where(audio, frame.prompt_tokens.to_numpy() / 60.0, frame.prompt_tokens.to_numpy())
    neurons = neurons_array(catalog, frame.model, units, frame.output_tokens)
    neurons = np.where(frame.outcome == "ok", neurons, 0.0)
    cost = fleet_cost(fleet, billing_s if billing_s is not None else duration_s)
    total_gpus = float(fleet.nodes.gpus.sum())
    errors = frame[frame.error_code > 0].error_code.value_counts().to_dict()
    return {
        "requests": int(len(frame)),
        "outcomes": {k: int(counts.get(k, 0)) for k in ("ok", "rejected", "failed")},
        "error_codes": {str(int(k)): int(v) for k, v in errors.items()},
        "not_ok": not_ok_codes(frame, catalog),  # the same by outcome, with each code's meaning
        "ttft_ms": percentiles(frame.ttft_ms[ok & gen]),
        "ttft_ms_all_tasks": percentiles(frame.ttft_ms[ok]),
        "ttft_ms_counting_failures": counting_failures(frame.ttft_ms[gen & ~batch].to_numpy(dtype=float),
                                                       (frame.outcome[gen & ~batch] == "ok").to_numpy()),
        # the same for the other latencies an SLO may be set on (frontier): shed load must not look fast
        "tpot_ms_counting_failures": _counting(frame.tpot_ms, frame.outcome, gen & ~batch),
        "e2e_ms_counting_failures": _counting(frame.e2e_ms, frame.outcome, ~batch),
        "queue_ms_counting_failures": _counting(frame.queue_ms, frame.outcome, ~batch),
        "generation_requests": int((gen & ~batch).sum()),  # (whatever their outcome: the line above's population)
        "tpot_ms": percentiles(frame.tpot_ms[ok & gen]),
        "itl_ms": itl_percentiles(frame[list(ITL_COLUMNS)][gen.to_numpy() & ~batch]),  # copy those columns only
        "e2e_ms": percentiles(frame.e2e_ms[ok]),
        "e2e_ms_generation": percentiles(frame.e2e_ms[ok & gen]),
        "e2e_ms_one_shot": percentiles(frame.e2e_ms[ok & ~gen]),
        "network_rtt_ms": percentiles(frame.network_rtt_ms[ok]),
        "queue_ms": percentiles(frame.queue_ms[ok]),
        "slo_attainment": attainment(int(met.sum()), len(frame)),
        "slo_met": int(met.sum()),  # (the attainment's numerator: the edge-central difference is taken exactly)
        # (arrivals all at one instant have no span: then the run's own duration)
        "goodput_rps": round(float(met.sum()) / max(billing_s if billing_s else duration_s, 1e-9), 3),
        "gpu_utilisation": round(gpu_busy_s / max(total_gpus * duration_s, 1e-9), 4),
        "gpu_busy_hours": round(gpu_busy_s / 3600, 6),  # GPU time computing, whole run (the drain after arrivals too)
        "mean_slot_utilisation": round(float(util.slot_utilisation.mean()), 4) if len(util) else None,
        # 6 decimals as gpu_busy_hours: a run of seconds bills a fraction of a cent and a GPU-hour, and costs per
        # request are divided from these (at 2 decimals they read 0.00 or moved by several %)
        "gpus": int(total_gpus), "gpu_hours": round(cost["gpu_hours"], 6), "gpu_usd": round(cost["usd"], 6),
        "neurons": round(float(neurons.sum()), 1),
        "neuron_usd": round(float(neurons.sum()) * USD_PER_1000_NEURONS / 1000, 4),
        "per_continent": per_group(frame, "user_continent", slo),
        "faults": fault_block(frame),
        "cold_starts": cold_start_block(frame),
    }


def attainment(met: int, n: int) -> float | None:
    """The share of ``n`` requests meeting the SLO, to 4 decimals, never rounded up to a perfect 1.0 while some
    missed (1 in 20,000 would read 1.0)."""
    if not n:
        return None
    share = round(met / n, 4)
    return 0.9999 if share == 1.0 and met < n else share


def counting_failures(values: np.ndarray, ok: np.ndarray, pcts=(50, 90, 95, 99), method: str = "higher") -> dict:
    """Percentiles where requests that did not end ok count as never answered (later than every answer): what a
    latency SLO sees. A percentile that falls on them is None (it misses any threshold). ``method``: numpy's
    (TTFT's is ``higher``; the other latencies' ``linear``, the answered requests' own)."""
    answered = ok & np.isfinite(values)
    if not answered.any():
        return {f"p{p}": None for p in pcts}
    top = float(values[answered].max())
    late = top + abs(top) + 1e12  # a finite stand-in: linear interpolation towards inf would give inf or NaN
    out = np.percentile(np.where(answered, values, late), pcts, method=method)
    return {f"p{p}": (round(float(x), 3) if x <= top else None) for p, x in zip(pcts, out, strict=True)}


def _counting(values: pd.Series, outcome: pd.Series, population, pcts=(50, 90, 95, 99)) -> dict:
    """:func:`counting_failures` over ``population``, by numpy's linear interpolation as the answered requests'
    own percentiles (with every request answered they are the same figures). An answered request without the
    figure (one output token: no TPOT) is left out."""
    v, ok = values[population].to_numpy(dtype=float), (outcome[population] == "ok").to_numpy()
    keep = ~ok | np.isfinite(v)
    return counting_failures(v[keep], ok[keep], pcts, method="linear")


def fault_block(frame: pd.DataFrame) -> dict:
    """Requests hit by node faults: ``lost`` (on a node when it failed), ``retried`` (re-routed, no token streamed
    yet) and ``failed`` (ended failed by a fault, 3043); ``faults`` (the specs applied) is added by the run.

    A request still streaming at the run's horizon also ends failed (3007), with or without faults: no fault
    caused it, so it is in ``outcomes`` only."""
    retried = frame.retries.to_numpy() > 0 if "retries" in frame else np.zeros(len(frame), bool)
    failed = (frame.outcome == "failed").to_numpy() & (frame.error_code.to_numpy() == int(Code.INTERNAL))
    lost = retried | failed
    return {"lost": int(lost.sum()), "retried": int(retried.sum()), "failed": int(failed.sum())}


def cold_start_block(frame: pd.DataFrame) -> dict:
    """Requests that waited for a replica to load (cold start), and how long they waited."""
    cold = frame.cold_start_ms.to_numpy(dtype=float)
    hit = np.isfinite(cold) & (cold > 0)
    return {"requests": int(hit.sum()), "ms": percentiles(cold[hit], (50, 95))}


def per_group(frame: pd.DataFrame, col: str, slo) -> dict:
    """Per value of column ``col``: requests, ok ones, TTFT p50/p95 (interactive text generation), median network
    RTT and SLO attainment of its rows."""
    out = {}
    met = slo_met(frame, slo)
    # the columns read below only: each group is a copy of its rows
    cols = [c for c in (col, "outcome", "batch", "task", "ttft_ms", "network_rtt_ms") if c in frame]
    for key, g in frame[cols].groupby(col, sort=True):
        ok = g.outcome == "ok"
        fast = ok & ~g.batch if "batch" in g else ok  # latencies: interactive requests only
        gen = g.task == "text-generation"
        ttft = g.ttft_ms[fast & gen]
        out[str(key)] = {"requests": int(len(g)), "ok": int(ok.sum()), "ttft_requests": int(len(finite(ttft))),
                         "ttft_p50_ms": _r(ttft.median()), "ttft_p95_ms": _r(ttft.quantile(0.95)),
                         "network_rtt_p50_ms": _r(g.network_rtt_ms[fast].median()),
                         "slo_attainment": round(float(met[g.index.to_numpy() - frame.index[0]].mean()), 4)}
    return out


def _r(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else round(float(v), 2)


def _exact_attainment(block: dict) -> float:
    """A deployment's SLO attainment before rounding, from its counts (the rounded share when they are absent)."""
    if block.get("slo_met") is not None and block.get("requests"):
        return block["slo_met"] / block["requests"]
    return block["slo_attainment"]


def gains(edge: dict, central: dict) -> dict:
    """Relative reduction (%) of edge vs central: positive = the edge is better."""
    def red(a, b):
        return None if a is None or b in (None, 0) else round(100.0 * (b - a) / b, 2)

    out = {}
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms", "network_rtt_ms"):
        for p in ("p50", "p95", "p99"):
            out[f"{metric}_{p}_reduction_pct"] = red(edge[metric][p], central[metric][p])
    out["slo_attainment_delta"] = (None if edge["slo_attainment"] is None or central["slo_attainment"] is None
                                   else round(_exact_attainment(edge) - _exact_attainment(central), 4))
    # Point reductions per user continent, with the TTFT percentiles' request counts; below MIN_BIN requests on
    # either side none is given (``gains.by_continent`` has the same with intervals).
    per = {}
    for cont, e in edge["per_continent"].items():
        c = central["per_continent"].get(cont)
        if c:
            n = {"edge": e.get("ttft_requests"), "central": c.get("ttft_requests")}
            per[cont] = {"ttft_requests": n}
            if min(n["edge"] or 0, n["central"] or 0) >= MIN_BIN:
                per[cont].update(ttft_p50_reduction_pct=red(e["ttft_p50_ms"], c["ttft_p50_ms"]),
                                 network_rtt_p50_reduction_pct=red(e["network_rtt_p50_ms"], c["network_rtt_p50_ms"]))
    out["per_continent"] = per
    return out


def interactive(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that are not async batch rows (queueRequest): those the latency figures are of."""
    return frame[~frame.batch.to_numpy(dtype=bool)] if "batch" in frame else frame


def country_gain(edge: pd.DataFrame, central: pd.DataFrame, filtered: bool = False) -> pd.DataFrame:
    """Per user country: median TTFT of interactive text generation at the edge and central, and the gain in %.

    ``filtered``: the frames hold those rows only (ok, interactive, text generation) and need no outcome, task or
    batch column: a caller that selected them once spares copying two string columns (0.03-0.06 s at a million
    requests)."""
    def med(f):
        if not filtered:
            f = interactive(f)  # as the summary's per-continent figures
            ok = ((f.outcome == "ok") & (f.task == "text-generation")).to_numpy(dtype=bool)
            f = f if ok.all() else f[ok]  # (rows kept already: no copy of them)
        g = f.groupby("user_country")
        return pd.DataFrame({"ttft": g.ttft_ms.median(), "lat": g.user_lat.mean(), "lon": g.user_lon.mean(),
                             "n": g.size()})

    e, c = med(edge), med(central)
    j = e.rename(columns={"ttft": "ttft_edge"}).join(c[["ttft"]].rename(columns={"ttft": "ttft_central"}),
                                                     how="inner")
    j["gain_pct"] = 100.0 * (j.ttft_central - j.ttft_edge) / j.ttft_central
    return j.reset_index()
