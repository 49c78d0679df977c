"""What the edge's detour through its ingress PoP costs: requests served away from where they entered.

    python benchmarks/edge_detour.py [--scenario default] [--requests N]

An edge request enters at its anycast ingress PoP and, when the control plane serves it at another PoP, crosses
the backbone from there: user -> ingress -> backbone -> serving PoP, the WAN model's fixed per-path term paid on
each leg. This runs the scenario (seed 1: the Quick start's run of ``default``) and, for the edge's answered
requests, compares that path's network RTT (``network_rtt_ms``) with the direct one, the user's city straight to the
serving PoP with the same last mile (``Topology.user_pop_rtt``). Reported: the share of requests served away from
their ingress (all, text generation, one-shot tasks), the detour's p50 / mean / p95 over them, and, as a check
that both paths come from the same model, the largest difference between ``network_rtt_ms`` and the direct RTT
for requests served at their ingress (0 up to float32 rounding). And what it does to the headline, to first order:
the median TTFT gain of interactive text generation over central as run, and with each detour taken off its
request's TTFT (nothing re-simulated: a direct path would also move queueing a little).

Then whether measured paths pay such a detour (``measured_relays``): in every shipped table of RTTs measured between
one provider's regions, the triples A, B, C with B near A (within 100 km: the same metro, as a user's ingress PoP;
and within 300 km) and C at least 300 km from both; the measured RTT(A, B) + RTT(B, C) - RTT(A, C) against the WAN
model's for the same coordinates (see :func:`relays`). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import time
from functools import cache

import numpy as np

from edgepop.argtypes import json_line, positive_int


def detour(sc, requests: int | None) -> dict:
    """The figures above for the loaded scenario ``sc``."""
    from sim.run import run_scenario, scenario_topology

    t0 = time.perf_counter()
    out = run_scenario(sc, requests=requests, seed=1)
    topo = scenario_topology(out.scenario)
    both = out.requests
    req = both[((both.outcome == "ok") & (both.deployment == "edge")).to_numpy(dtype=bool)]
    lat, lon = req.user_lat.to_numpy(dtype=float), req.user_lon.to_numpy(dtype=float)
    coords, user = np.unique(np.stack([lat, lon], axis=1), axis=0, return_inverse=True)
    user = user.reshape(-1)
    matrix = topo.user_pop_rtt(coords[:, 0], coords[:, 1])  # users x PoPs, with each user's last mile
    column = {pop: i for i, pop in enumerate(topo.pops.id.tolist())}
    serving = np.array([column[s] for s in req.serving_site.tolist()])
    direct = matrix[user, serving].astype(float)
    actual = req.network_rtt_ms.to_numpy(dtype=float)
    away = (req.serving_site != req.ingress_pop).to_numpy(dtype=bool)
    gen = (req.task == "text-generation").to_numpy(dtype=bool)
    extra = actual[away] - direct[away]
    one_shot_tasks = {task: round(float(away[(req.task == task).to_numpy(dtype=bool)].mean()), 3)
                      for task in sorted(set(req.task.tolist()) - {"text-generation"})}
    batch = req.batch.to_numpy(dtype=bool) if "batch" in req else np.zeros(len(req), bool)
    central = both[((both.outcome == "ok") & (both.deployment == "central") & (both.task == "text-generation"))
                   .to_numpy(dtype=bool)]
    if "batch" in central:
        central = central[~central.batch.to_numpy(dtype=bool)]
    c50 = float(np.median(central.ttft_ms.to_numpy(dtype=float)))
    ttft = req.ttft_ms.to_numpy(dtype=float)
    direct_ttft = ttft - np.where(away, actual - direct, 0.0)
    sel = gen & ~batch
    return {"scenario": sc.name, "requests_ok": int(len(req)),
            "served_away_share": round(float(away.mean()), 3),
            "served_away_share_text_generation": round(float(away[gen].mean()), 3),
            "served_away_share_by_one_shot_task": one_shot_tasks,
            "detour_ms_p50": round(float(np.median(extra)), 2), "detour_ms_mean": round(float(extra.mean()), 2),
            "detour_ms_p95": round(float(np.percentile(extra, 95)), 2),
            "check_max_abs_diff_at_ingress_ms": round(float(np.abs(actual[~away] - direct[~away]).max()), 4),
            "ttft_p50_gain_pct_as_run": round(100.0 * (c50 - float(np.median(ttft[sel]))) / c50, 2),
            "ttft_p50_gain_pct_detour_off_first_order": round(100.0 * (c50 - float(np.median(direct_ttft[sel]))) / c50,
                                                              2),
            "wall_s": round(time.perf_counter() - t0, 1)}


def relays(near_km: float = 300.0, far_km: float = 300.0) -> dict:
    """The same detour in measured data: for every triple of regions of one provider's RTT table (A, B, C) with B
    within ``near_km`` of A (an ingress near its user) and C at least ``far_km`` from both (a serving site farther
    off), the measured detour RTT(A, B) + RTT(B, C) - RTT(A, C) against the WAN model's for the same coordinates,
    whose legs each pay its fixed per-path term. Per data set and pooled: triples, median detours (ms), the median
    of model minus measured, and the share of triples whose measured detour is below the model's fixed term."""
    from topology.latency import default_model
    from topology.rtt_sets import SETS

    base = float(default_model().params.base_ms)
    per_set, pooled_meas, pooled_model = {}, [], []
    for name in SETS:
        meas, pred, km = _set_matrices(name)
        n = len(km)
        a, b, c = (x.reshape(-1) for x in np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij"))
        keep = (a != b) & (b != c) & (a != c) & (km[a, b] <= near_km) & (km[a, c] >= far_km) & (km[b, c] >= far_km)
        a, b, c = a[keep], b[keep], c[keep]
        d_meas = meas[a, b] + meas[b, c] - meas[a, c]
        d_model = pred[a, b] + pred[b, c] - pred[a, c]
        ok = np.isfinite(d_meas) & np.isfinite(d_model)
        d_meas, d_model = d_meas[ok], d_model[ok]
        if not d_meas.size:
            continue
        pooled_meas.append(d_meas)
        pooled_model.append(d_model)
        per_set[name] = _relay_figures(d_meas, d_model, base)
    out = {"near_km": near_km, "far_km": far_km, "model_base_ms": round(base, 3), "by_set": per_set}
    if pooled_meas:
        out["pooled"] = _relay_figures(np.concatenate(pooled_meas), np.concatenate(pooled_model), base)
    return out


@cache
def _set_matrices(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RTT set ``name`` as square matrices over its regions: measured RTT, the WAN model's, great-circle km (NaN
    where a pair was not published); read once however many radii :func:`relays` is asked for."""
    from topology.latency import default_model
    from topology.rtt_sets import load_pairs

    pairs = load_pairs(name)
    index = {r: i for i, r in enumerate(sorted(set(pairs.a) | set(pairs.b)))}
    n = len(index)
    meas, pred, km = (np.full((n, n), np.nan) for _ in range(3))
    i, j = pairs.a.map(index).to_numpy(), pairs.b.map(index).to_numpy()
    p = np.asarray(default_model().core_rtt_ms(pairs.lat_a, pairs.lon_a, pairs.lat_b, pairs.lon_b), dtype=float)
    for mat, v in ((meas, pairs.rtt_ms.to_numpy(dtype=float)), (pred, p), (km, pairs.km.to_numpy(dtype=float))):
        mat[i, j] = mat[j, i] = v
    return meas, pred, km


def _relay_figures(d_meas: np.ndarray, d_model: np.ndarray, base: float) -> dict:
    return {"triples": int(d_meas.size), "measured_detour_ms_p50": round(float(np.median(d_meas)), 2),
            "model_detour_ms_p50": round(float(np.median(d_model)), 2),
            "model_minus_measured_ms_p50": round(float(np.median(d_model - d_meas)), 2),
            "model_minus_measured_ms_p25_p75": [round(float(np.percentile(d_model - d_meas, q)), 2) for q in (25, 75)],
            "measured_below_base_share": round(float((d_meas < base).mean()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="default", help="embedded scenario name or file (default: default)")
    ap.add_argument("--requests", type=positive_int, default=None, help="requests (default: the scenario's)")
    args = ap.parse_args()
    from edgepop.errors import UserError
    from sim.scenario import load_scenario

    try:
        sc = load_scenario(args.scenario)
    except UserError as exc:
        ap.error(f"--scenario: {exc}")
    if sc.central is None or sc.edge is None:
        ap.error(f"--scenario: {args.scenario!r} does not run both an edge and a central deployment")
    if sc.jitter:  # network_rtt_ms would then be a draw around the model's RTT, not the RTT itself
        ap.error(f"--scenario: {args.scenario!r} runs with RTT jitter on: the detour needs the model's mean RTTs")
    result = detour(sc, args.requests)
    # B in A's metro (as a user's ingress PoP in its city), and B within a few hundred km
    result["measured_relays"] = {f"near_{km:g}_km": relays(near_km=km) for km in (100.0, 300.0)}
    print(json_line(result))


if __name__ == "__main__":
    main()
