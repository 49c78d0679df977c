"""The frontier's brackets: a line's least evaluated budget meeting the SLO and the largest failing one below it,
the iso-SLO ratio they give and what kind of number it is (exact, a range, a bound), on the mean over seeds or on
each seed's runs alone (:func:`by_seed`). :mod:`sim.frontier_report` writes them out."""

from __future__ import annotations

import numpy as np


def _num(v, digits=3):
    return None if v is None or not np.isfinite(v) else round(float(v), digits)


def within_tolerance(fails_gpus: int, meets_gpus: int, tolerance: float) -> bool:
    """Whether a bracket is as narrow as bisection goes: one GPU, or ``tolerance`` of the GPUs."""
    return meets_gpus - fails_gpus <= max(1, tolerance * meets_gpus)


def least(points, slo, column=None, ok=None, tolerance=None) -> dict:
    """The least evaluated budget meeting the SLO (``column``: a per-continent figure), with its bracket.
    ``tolerance`` (a line's): say whether the bracket is narrower than it and the range the least budget lies in."""
    done = sorted((p for p in points if p.rows or not p.feasible), key=lambda p: p.scale)
    if ok is None:
        def ok(p):
            return p.meets(slo, column)
    meeting = [p for p in done if ok(p)]
    if not meeting:
        top = done[-1] if done else None
        ran = [p for p in done if p.rows]
        return {"min_gpus_for_slo": None, "min_usd_per_hour_for_slo": None, "status": "not_met",
                "largest_budget_tried_gpus": top.gpus if top else None,
                "budgets_simulated": len(ran), "largest_budget_simulated_gpus": ran[-1].gpus if ran else None}
    hi = meeting[0]
    below = [p for p in done if p.scale < hi.scale]
    out = {"min_gpus_for_slo": hi.gpus, "min_usd_per_hour_for_slo": hi.usd_per_hour,
           "inventory_scale": hi.scale,
           "status": "bracketed" if below else "at_or_below_smallest_budget",
           "fails_at_gpus": below[-1].gpus if below else None}
    if column is None:  # the least budget is decided on the mean over seeds; does its interval clear the SLO too?
        iv = hi.ci95(slo.column)
        out["interval_at_least"] = ("one seed: no interval" if iv is None else
                                    "clears the SLO" if slo.met(iv[0]) and slo.met(iv[1]) else "straddles the SLO")
    failing_above = [p for p in done if p.scale > hi.scale and not ok(p)]
    if failing_above:
        out["non_monotone"] = True  # a larger budget failed again: the metric is noisy there
    if tolerance is not None:
        # Where the least budget lies: above the largest failing budget below it (0 when none), and at most the
        # least budget from which every larger one meets the SLO (None: the largest tried failed again).
        top = hi if not failing_above else next((p for p in done if p.scale > failing_above[-1].scale), None)
        out["range_gpus"] = [below[-1].gpus if below else 0, top.gpus if top else None]
        out["range_usd_per_hour"] = [below[-1].usd_per_hour if below else 0.0, top.usd_per_hour if top else None]
        out["within_tolerance"] = bool(below) and not failing_above and within_tolerance(
            below[-1].gpus, hi.gpus, tolerance)
    return out


def _ratio(a, b):
    return None if a is None or b in (None, 0) else round(a / b, 3)


def _known(kind, ratio):
    """The ratio, or None when it is bounded neither way (both lines met the SLO at their smallest budget): a
    number there would read as a measured ratio (1.0: parity) to whoever reads frontier.json."""
    return None if kind == "unknown" else ratio


def ratio_kind(edge: dict, central: dict) -> str | None:
    """What the iso-SLO ratio is when a least budget is only bounded: a line meeting the SLO at the smallest
    budget may need less (its figure is an upper bound), one that never met it has no figure; with both bracketed,
    ``range`` where a bracket is wider than the tolerance or a line is non-monotone."""
    if edge.get("min_gpus_for_slo") is None or central.get("min_gpus_for_slo") is None:
        return None
    e_low, c_low = (d["status"] == "at_or_below_smallest_budget" or d.get("at_or_below_smallest_budget", False)
                    for d in (edge, central))  # (a line's status says it; a continent's least says it apart)
    kind = {(False, False): "exact", (False, True): "lower_bound", (True, False): "upper_bound"}.get(
        (e_low, c_low), "unknown")
    loose = any(not d.get("within_tolerance", True) for d in (edge, central))  # (continents: not bisected)
    return "range" if kind == "exact" and loose else kind


def ratio_range(edge: dict, central: dict, key: str) -> list | None:
    """[lowest, highest] the ratio can be from the two lines' ranges (``key``: range_gpus or range_usd_per_hour);
    None for an unbounded end."""
    e, c = edge.get(key), central.get(key)
    if e is None or c is None or edge.get("min_gpus_for_slo") is None or central.get("min_gpus_for_slo") is None:
        return None
    # (no failing edge budget below, or no meeting central one above: nothing bounds the ratio from below)
    return [None if c[1] is None or not e[0] else _ratio(e[0], c[1]), _ratio(e[1], c[0])]


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
                          "gpu_ratio_range": ratio_range(e, c, "range_gpus") if kind not in (None, "unknown") else None}
    return out
