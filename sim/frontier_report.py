"""The frontier's outputs: frontier.json (least budgets, cost ratios, points), frontier.parquet, frontier.png and
report.md, from the points :func:`sim.frontier.run_frontier` evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.routing import ROUTERS
from sim.frontier_brackets import _known, _num, _ratio, by_seed, least, ratio_kind, ratio_range
from sim.scenario import demand_summary, network_summary
from sim.trace_files import trace_source

CONTINENT_METRICS = ("ttft_p50_ms", "ttft_p95_ms", "slo_attainment")
MIN_CONTINENT_REQUESTS = 100  # per run: fewer and a continent's percentile is too noisy to decide on

METHOD = ("each point is the mean over seeds (95% interval: Student t over seeds); a budget meets the SLO when "
          "the mean of the SLO metric does; the least budget is the smallest evaluated one that meets it, found by "
          "bisection between the largest failing and the least meeting budget")


def ratio_text(ratio, kind, digits=3) -> str:
    """A ratio as report.md and the terminal print it: ``unknown`` (no number) where it is bounded neither way."""
    return "unknown" if kind == "unknown" else _f(ratio, digits)


BOUND_NOTE = {"lower_bound": " A lower bound: the baseline met the SLO at the smallest budget tried and may need less.",
              "upper_bound": " An upper bound: the edge met the SLO at the smallest budget tried and may need less.",
              "unknown": " Unknown: both lines met the SLO at the smallest budget tried, so each may need less and the "
                         "ratio is bounded neither way (try smaller --budgets).",
              "range": " A range: a least budget is known only within a bracket wider than --tolerance (--max-steps "
                       "ran out, or no budget between gives another GPU count) or its line is non-monotone (a larger "
                       "budget failed again)."}


def by_seed_line(d: dict | None, baseline: str) -> str | None:
    """report.md's line for :func:`by_seed`, or None."""
    if not d:
        return None

    def bracket(b):
        return _f(b[1]) if b[0] is None else f"{_f(b[0])}-{_f(b[1])}"

    def ratio(v):
        if v["gpu_ratio"] is not None:
            return _f(v["gpu_ratio"], 3)
        rng, kind = v["gpu_ratio_range"], v["kind"]
        if not rng or kind is None or kind == "unknown":
            return kind or "none (a line never met the SLO)"
        ends = " to ".join(_f(x, 3) if x is not None else "?" for x in rng)
        return ends if kind == "range" else f"{ends} ({kind.replace('_', ' ')})"

    parts = [f"seed {s}: " + ", ".join(f"{k} {bracket(b)}" for k, b in v["brackets_gpus"].items())
             + f", GPU ratio {ratio(v)}" for s, v in d.items()]
    return (f"- each seed alone (GPUs from the largest failing to the least meeting evaluated budget on that seed's "
            f"runs; the budgets are those the mean's bisection chose) against {baseline}: " + "; ".join(parts) + ".")


def not_met_lines(r: dict) -> list[str]:
    """The lines that never met the SLO (why a ratio is not available)."""
    return [k for k, d in r["deployments"].items() if d["min_gpus_for_slo"] is None]


def not_met_text(d: dict) -> str:
    """What a not_met line tried: the largest budget, and whether anything was simulated at all."""
    if not d.get("budgets_simulated"):
        return (f"nothing simulated: every budget infeasible (largest {_f(d.get('largest_budget_tried_gpus'))} GPUs; "
                "try larger --budgets)")
    return (f"failed at every budget simulated ({d['budgets_simulated']}, up to "
            f"{_f(d['largest_budget_simulated_gpus'])} GPUs)")


def _continent_least(points, slo, cont) -> dict:
    column = f"continent_{cont}_{slo.metric}"

    def ok(p):
        n = p.mean(f"continent_{cont}_requests")
        answered = p.mean(f"continent_{cont}_ok") / n if n else 0.0  # shed load must not pass for fast answers
        return (p.feasible and bool(p.rows) and n >= MIN_CONTINENT_REQUESTS and answered >= 0.99
                and slo.met(p.mean(column)))

    # Per continent there is no bisection: the least evaluated budget from which every larger one meets it.
    done = sorted((p for p in points if p.rows), key=lambda p: p.scale)
    most = max((np.nan_to_num(p.mean(f"continent_{cont}_requests")) for p in done), default=0.0)
    if most < MIN_CONTINENT_REQUESTS:  # not judged at all: a p95 of a few dozen requests decides nothing
        return {"min_gpus_for_slo": None, "min_usd_per_hour_for_slo": None, "status": "too_few_requests",
                "requests_per_run": _num(most, 1)}
    good = [i for i, p in enumerate(done) if all(ok(q) for q in done[i:])]
    if not good:
        return {"min_gpus_for_slo": None, "min_usd_per_hour_for_slo": None, "status": "not_met"}
    p = done[good[0]]
    # as a line's least budget: with no budget tried below it (infeasible ones count, as there), it may need less
    below = [q for q in points if (q.rows or not q.feasible) and q.scale < p.scale]
    return {"min_gpus_for_slo": p.gpus, "min_usd_per_hour_for_slo": p.usd_per_hour, "inventory_scale": p.scale,
            "status": "evaluated_budgets", "at_or_below_smallest_budget": not below}


def _answered_mean(p, column):
    """Mean over seeds, or None when a seed's percentile fell on requests never answered."""
    if any(r.get(column) is None or not np.isfinite(r[column]) for r in p.rows):
        return None
    return _num(p.mean(column))


def point_dict(p, slo) -> dict:
    """One evaluated budget point as a JSON-ready dict: line, budget, feasibility, SLO met, mean figures."""
    out = {"line": p.line.key, "inventory_scale": p.scale, "gpus": p.gpus, "usd_per_hour": p.usd_per_hour,
           "phase": p.phase, "feasible": p.feasible, "seeds": len(p.rows)}
    if not p.feasible:
        out["infeasible"] = p.why
        return out
    out["meets_slo"] = p.meets(slo)
    for col in dict.fromkeys([slo.column, "ttft_p50_ms", "ttft_p95_ms", "slo_attainment", "gpu_busy_mean",
                              "wait_p95_ms_peak_hour"]):
        out[col] = _num(p.mean(col))
        if col in (slo.column, "ttft_p50_ms", "ttft_p95_ms", "slo_attainment"):
            out[f"{col}_ci95"] = p.ci95(col)
    if slo.column != slo.metric:
        out[f"{slo.column}_seeds_unanswered"] = sum(r.get(slo.column) is None or not np.isfinite(r[slo.column])
                                                   for r in p.rows)
    return out


def summarise(sc, slo, lines, points, seeds, requests, engine, scales, tolerance=0.05) -> dict:
    """frontier.json (see the module docstring of :mod:`sim.frontier`)."""
    by_line = {line.key: [p for p in points if p.line == line] for line in lines}
    deployments = {key: least(pts, slo, tolerance=tolerance) for key, pts in by_line.items()}
    central = [line.key for line in lines if line.deployment == "central"]
    edge = deployments.get("edge", {})
    by_baseline = {k: {"cost": _known(ratio_kind(edge, deployments[k]), _ratio(
                           edge.get("min_usd_per_hour_for_slo"), deployments[k]["min_usd_per_hour_for_slo"])),
                       "gpus": _known(ratio_kind(edge, deployments[k]),
                                      _ratio(edge.get("min_gpus_for_slo"), deployments[k]["min_gpus_for_slo"])),
                       "kind": ratio_kind(edge, deployments[k]),
                       "cost_range": ratio_range(edge, deployments[k], "range_usd_per_hour"),
                       "gpus_range": ratio_range(edge, deployments[k], "range_gpus")}
                   for k in central}
    first = by_baseline.get(central[0], {}) if central else {}
    per_continent = {}
    if slo.metric in CONTINENT_METRICS:
        conts = sorted({c.split("_")[1] for p in points for r in p.rows for c in r
                        if c.startswith("continent_") and c.endswith("_requests")})
        for cont in conts:
            d = {key: _continent_least(pts, slo, cont) for key, pts in by_line.items()}
            e = d.get("edge", {})
            per_continent[cont] = {"deployments": d, "iso_slo_cost_ratio": _known(ratio_kind(e, d[central[0]]), _ratio(
                e.get("min_usd_per_hour_for_slo"), d[central[0]]["min_usd_per_hour_for_slo"])) if central else None,
                "iso_slo_ratio_kind": ratio_kind(e, d[central[0]]) if central else None}
    equal_cost = []
    for s in scales:
        at = {p.line.key: p for p in points if abs(p.scale - s) < 1e-9}
        equal_cost.append({"inventory_scale": s,
                           "gpus": {k: p.gpus for k, p in at.items()},
                           "usd_per_hour": {k: p.usd_per_hour for k, p in at.items()},
                           "ttft_p50_ms": {k: _num(p.mean("ttft_p50_ms")) for k, p in at.items() if p.rows},
                           "ttft_p95_ms_all": {k: _answered_mean(p, "ttft_p95_ms_all") for k, p in at.items()
                                               if p.rows}})
    wl = getattr(sc, "workload", None)  # (the trace file a replaying scenario reads, named as simulate names it)
    return {"scenario": sc.name, "trace": trace_source(wl) if wl is not None and wl.is_trace else None, "slo": {"metric": slo.metric, "column": slo.column, "threshold": slo.threshold,
                                         "text": slo.text},
            "seeds": list(seeds), "requests": requests, "engine": engine,
            "budget": sc.central.budget if sc.central is not None else "gpus",
            "inventory_scales": scales, "method": METHOD,
            "deployments": deployments, "baseline": central[0] if central else None,
            "iso_slo_cost_ratio": first.get("cost"), "iso_slo_gpu_ratio": first.get("gpus"),
            "iso_slo_ratio_kind": first.get("kind"), "iso_slo_cost_ratio_range": first.get("cost_range"),
            "iso_slo_gpu_ratio_range": first.get("gpus_range"), "tolerance": tolerance,
            "iso_slo_ratio_by_baseline": by_baseline, "per_continent": per_continent,
            "iso_slo_by_seed": by_seed(by_line, slo, list(seeds), central[0] if central else None, tolerance),
            # how each line routes: a ratio between lines routed by different rules may be the routers'
            "routing": {line.key: {"router": cfg.router,
                                   "options": ROUTERS.options_in_effect(cfg.router, cfg.router_options)}
                        for line in lines if (cfg := sc.edge if line.deployment == "edge" else sc.central) is not None},
            # the network every line's users reach it over (the SLO's latency includes it)
            "network": network_summary(sc),
            **demand_summary(sc),  # how the demand cities were weighted, where not by population
            "equal_cost": equal_cost,
            "points": [point_dict(p, slo) for p in sorted(points, key=lambda p: (p.line.key, p.scale))]}


def write_outputs(frontier) -> Path:
    """Write frontier.parquet, frontier.json, frontier.png and report.md into the run's folder; returns it."""
    from sim.frontier_plot import plot_frontier

    out = Path(frontier.path)
    rows_frame(frontier.points).to_parquet(out / "frontier.parquet", index=False)
    (out / "frontier.json").write_text(json.dumps(frontier.result, indent=2))
    plot_frontier(frontier, out / "frontier.png")
    (out / "report.md").write_text("\n".join(report_lines(frontier)) + "\n")
    return out


def _f(v, digits=1):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


NO_RATIO = "it needs the edge's line and a central line"


def has_ratio(r: dict) -> bool:
    """Whether a frontier result can have an iso-SLO ratio: the edge's line and a baseline's were both run."""
    return r["baseline"] is not None and "edge" in r["deployments"]


def network_lines(r: dict) -> list[str]:
    """report.md's line naming the network assumptions every budget ran with, and the demand's weighting where
    it is not by population (each followed by a blank line)."""
    from sim.report_deployments import demand_line, network_line

    lines = [network_line(r["network"], misroute=True)] if r.get("network") else []
    lines += [demand] if (demand := demand_line(r.get("demand_weight"))) else []
    return [x for line in lines for x in (line, "")]


def routing_lines(r: dict) -> list[str]:
    """report.md's line naming each line's router, with a warning when they differ (and a blank line after)."""
    from sim.report_deployments import rule_text

    rules = {k: rule_text(v) for k, v in (r.get("routing") or {}).items()}
    if not rules:
        return []
    text = "Routing: " + "; ".join(f"{k} by {v}" for k, v in rules.items()) + "."
    if len(set(rules.values())) > 1:
        text += (" The lines are routed by different rules: a ratio may be the routers' rather than the "
                 "deployments'.")
    return [text, ""]


def report_lines(frontier) -> list[str]:
    """The lines of the frontier's report.md."""
    r = frontier.result
    lines = [f"# edgepop frontier: {r['scenario']}", "",
             f"SLO: {r['slo']['text']}; seeds {r['seeds']}; requests per run: "
             f"{r['requests'] or 'the scenario'}; budget mode: {r['budget']}; engine {r['engine']}; "
             f"wall time {r.get('wall_s', '-')} s.", "", f"Method: {r['method']}.", "", *routing_lines(r), *network_lines(r),
             "## Least budget meeting the SLO", "",
             "| deployment | least GPUs | least $/hour | status | fails at GPUs |", "|---|---|---|---|---|"]
    for key, d in r["deployments"].items():
        fails = _f(d.get("fails_at_gpus")) if d["status"] != "not_met" else (
            f"every budget simulated (up to {_f(d['largest_budget_simulated_gpus'])})" if d.get("budgets_simulated")
            else "none simulated")
        lines.append(f"| {key} | {_f(d['min_gpus_for_slo'])} | {_f(d['min_usd_per_hour_for_slo'], 2)} | "
                     f"{status_text(d)}"
                     f"{'; interval ' + d['interval_at_least'] if d.get('interval_at_least') else ''} | {fails} |")
    if not has_ratio(r):
        lines += ["", f"No iso-SLO cost ratio: {NO_RATIO}.", ""]
    else:
        kind = r["iso_slo_ratio_kind"]
        lines += ["", f"Iso-SLO cost ratio (edge $/hour over {r['baseline']} $/hour, each at its least budget): "
                      f"**{ratio_text(r['iso_slo_cost_ratio'], kind)}** "
                      f"({headline_note(r)}); "
                      f"GPU ratio {ratio_text(r['iso_slo_gpu_ratio'], kind)}." + BOUND_NOTE.get(kind, ""), ""]
        for key, v in r["iso_slo_ratio_by_baseline"].items():
            lines.append(f"- against {key}: cost ratio {ratio_text(v['cost'], v['kind'])}, GPU ratio "
                         f"{ratio_text(v['gpus'], v['kind'])} "
                         f"({ratio_note(v['kind'], v.get('cost_range'), missing_lines(r, key))})")
        seed_line = by_seed_line(r.get("iso_slo_by_seed"), r["baseline"])
        if seed_line:
            lines.append(seed_line)
    keys = [line.key for line in frontier.lines]
    lines += ["", "## TTFT at equal cost (mean over seeds; p95 counts requests never answered as late, "
                  "'-' where it falls on them)", "",
              "| inventory scale | GPUs | $/hour | " + " | ".join(f"{k} p50 / p95 (ms)" for k in keys) + " |",
              "|---|---|---|" + "---|" * len(keys)]
    for row in r["equal_cost"]:
        gpus = sorted(set(row["gpus"].values()))
        usd = sorted(set(row["usd_per_hour"].values()))
        cells = [f"{_f(row['ttft_p50_ms'].get(k))} / {_f(row['ttft_p95_ms_all'].get(k))}" for k in keys]
        lines.append(f"| {row['inventory_scale']:g} | {' / '.join(map(str, gpus))} | "
                     f"{' / '.join(_f(u, 0) for u in usd)} | " + " | ".join(cells) + " |")
    if r["per_continent"]:
        lines += ["", "## Per user continent (least evaluated budget from which the continent's figure holds)", "",
                  "| continent | " + " | ".join(f"{k} least GPUs" for k in keys) + " | iso-SLO cost ratio |",
                  "|---|" + "---|" * (len(keys) + 1)]
        for cont, d in r["per_continent"].items():
            cells = [_continent_cell(d["deployments"][k]) for k in keys]
            k = d["iso_slo_ratio_kind"]
            kind = f" ({k})" if d["iso_slo_cost_ratio"] is not None else ""
            lines.append(f"| {cont} | " + " | ".join(cells) + f" | {ratio_text(d['iso_slo_cost_ratio'], k)}{kind} |")
        bounded = sorted({d["iso_slo_ratio_kind"] for d in r["per_continent"].values()} & set(BOUND_NOTE))
        if bounded:  # what each bound means, as for the overall ratio
            lines += [""] + [f"A continent's {k} ratio:{BOUND_NOTE[k].split(':', 1)[1]}" for k in bounded]
        few = too_few(r)
        if few:
            lines += ["", few]
    infeasible = [p for p in r["points"] if not p["feasible"]]
    if infeasible:
        lines += ["", "Budgets not simulated (infeasible): " + "; ".join(
            f"{p['line']} at x{p['inventory_scale']:g} ({p['gpus']} GPUs): {p['infeasible']}" for p in infeasible)]
    lines += ["", "![frontier](frontier.png)", ""]
    return lines


def status_text(d: dict) -> str:
    """A line's status as report.md and the terminal print it: what is bracketed loosely, what never met it."""
    if d["status"] == "not_met":
        return f"not_met: {not_met_text(d)}"
    text = d["status"] + (" (non-monotone: a larger budget failed again)" if d.get("non_monotone") else "")
    if d["status"] == "bracketed" and not d.get("non_monotone") and d.get("within_tolerance") is False:
        text += f" ({_f(d['fails_at_gpus'])}-{_f(d['min_gpus_for_slo'])} GPUs: wider than --tolerance)"
    return text


def missing_lines(r: dict, baseline: str) -> list[str]:
    """Of the edge and ``baseline``, the lines that never met the SLO (so no ratio between them)."""
    return [k for k in ("edge", baseline) if k in r["deployments"] and k in not_met_lines(r)]


def ratio_note(kind, rng, missing) -> str:
    """The ratio's kind, its range where it is one, or which line never met the SLO."""
    if kind is None:
        return f"not available: {' and '.join(missing)} never met the SLO" if missing else "not available"
    if kind == "unknown":
        return "bounded neither way"
    if kind != "range" or not rng:
        return kind
    lo, hi = rng
    if lo is None and hi is None:
        return "range: unbounded"
    if lo is None:
        return f"range: at most {hi:.3f}"
    return f"range: {'at least ' + format(lo, '.3f') if hi is None else format(lo, '.3f') + ' to ' + format(hi, '.3f')}"


def headline_note(r: dict) -> str:
    """The first baseline's ratio note (report.md and the terminal)."""
    return ratio_note(r["iso_slo_ratio_kind"], r["iso_slo_cost_ratio_range"], missing_lines(r, r["baseline"]))


def _continent_cell(d: dict) -> str:
    if d["status"] == "too_few_requests":
        return f"too few requests ({_f(d['requests_per_run'], 0)})"
    return _f(d["min_gpus_for_slo"])


def too_few(r: dict) -> str | None:
    """The sentence naming the continents not judged for want of requests (report.md and the terminal)."""
    few = {cont: max(b.get("requests_per_run") or 0 for b in d["deployments"].values())
           for cont, d in r["per_continent"].items()
           if any(b["status"] == "too_few_requests" for b in d["deployments"].values())}
    if not few:
        return None
    return (f"Not judged per continent (status too_few_requests: fewer than {MIN_CONTINENT_REQUESTS} of its "
            "requests a run): " + ", ".join(f"{c} ({n:,.0f} request{'' if n == 1 else 's'} a run)" for c, n in few.items()) + ".")


def rows_frame(points) -> pd.DataFrame:
    """frontier.parquet: one row per line x budget x seed (infeasible budgets: one row, no figures)."""
    out = []
    for p in points:
        head = {"line": p.line.key, "deployment": p.line.deployment, "baseline": p.line.baseline or "",
                "inventory_scale": p.scale, "gpus": p.gpus, "usd_per_hour": p.usd_per_hour, "phase": p.phase,
                "feasible": p.feasible}
        if not p.rows:
            out.append({**head, "seed": -1})
        for r in p.rows:
            out.append({**head, **{k: v for k, v in r.items() if k not in head and k not in (
                "variant", "variant_name", "deployment")}})
    return pd.DataFrame(out).fillna(np.nan).infer_objects()
