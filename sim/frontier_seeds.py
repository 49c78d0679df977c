"""The frontier's answer seed by seed: each line's bracket on one seed's runs alone, and the iso-SLO GPU ratio they
allow. The least budgets of :mod:`sim.frontier` are decided on the mean over seeds; this says how far a single
seed's answer lies from it, read off the same runs (no further simulation)."""

from __future__ import annotations

import numpy as np

from sim.frontier_report import _f, _ratio, least, ratio_kind, ratio_range


def by_seed(by_line: dict, slo, seeds, baseline: str | None, tolerance: float) -> dict | None:
    """Each seed alone: every line's bracket on that seed's runs (``[fails_at, least]`` GPUs: the largest evaluated
    budget below its least meeting one, and that one), and the iso-SLO GPU ratio against ``baseline`` from them: a
    number where both brackets are within ``tolerance`` (``kind`` ``exact``, as :func:`ratio_kind`), else the range
    the brackets allow. The budgets are those the mean's bisection chose, so a seed's bracket can be much wider than
    the mean's. How far the answer moves from seed to seed; None with one seed."""
    if len(seeds) < 2 or "edge" not in by_line or baseline not in by_line:
        return None
    out: dict = {}
    for seed in seeds:
        def ok(p, seed=seed):
            v = next((r.get(slo.column) for r in p.rows if r.get("seed") == seed), None)
            return p.feasible and v is not None and bool(np.isfinite(v)) and slo.met(float(v))

        got = {k: least(pts, slo, column=slo.column, ok=ok, tolerance=tolerance) for k, pts in by_line.items()}
        e, c = got["edge"], got[baseline]
        kind = ratio_kind(e, c)
        out[str(seed)] = {"brackets_gpus": {k: [d.get("fails_at_gpus"), d["min_gpus_for_slo"]] for k, d in got.items()},
                          "kind": kind,
                          "gpu_ratio": _ratio(e["min_gpus_for_slo"], c["min_gpus_for_slo"]) if kind == "exact" else None,
                          "gpu_ratio_range": ratio_range(e, c, "range_gpus") if kind in ("exact", "range") else None}
    return out


def by_seed_line(d: dict | None, baseline: str) -> str | None:
    """report.md's line for :func:`by_seed`, or None."""
    if not d:
        return None

    def bracket(b):
        return _f(b[1]) if b[0] is None else f"{_f(b[0])}-{_f(b[1])}"

    def ratio(v):
        if v["gpu_ratio"] is not None:
            return _f(v["gpu_ratio"], 3)
        rng = v["gpu_ratio_range"]
        return (f"{_f(rng[0], 3) if rng[0] is not None else '?'} to {_f(rng[1], 3) if rng[1] is not None else '?'}"
                if rng else (v["kind"] or "none"))

    parts = [f"seed {s}: " + ", ".join(f"{k} {bracket(b)}" for k, b in v["brackets_gpus"].items())
             + f", GPU ratio {ratio(v)}" for s, v in d.items()]
    return (f"- each seed alone (GPUs from the largest failing to the least meeting evaluated budget on that seed's "
            f"runs; the budgets are those the mean's bisection chose) against {baseline}: " + "; ".join(parts) + ".")
