"""The frontier's outputs: frontier.json (least budgets, cost ratios, points), frontier.parquet, frontier.png and
report.md, from the points :func:`sim.frontier.run_frontier` evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

CONTINENT_METRICS = ("ttft_p50_ms", "ttft_p95_ms", "slo_attainment")
MIN_CONTINENT_REQUESTS = 100  # per run: fewer and a continent's percentile is too noisy to decide on

METHOD = ("each point is the mean over seeds (95% interval: Student t over seeds); a budget meets the SLO when "
          "the mean of the SLO metric does; the least budget is the smallest evaluated one that meets it, found by "
          "bisection between the largest failing and the least meeting budget")


def _num(v, digits=3):
    return None if v is None or not np.isfinite(v) else round(float(v), digits)


def least(points, slo, column=None, ok=None) -> dict:
    """The least evaluated budget meeting the SLO (``column``: a per-continent figure), with its bracket."""
    done = sorted((p for p in points if p.rows or not p.feasible), key=lambda p: p.scale)
    if ok is None:
        def ok(p):
            return p.meets(slo, column)
    meeting = [p for p in done if ok(p)]
    if not meeting:
        top = done[-1] if done else None
        return {"min_gpus_for_slo": None, "min_usd_per_hour_for_slo": None, "status": "not_met",
                "largest_budget_tried_gpus": top.gpus if top else None}
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
    if any(not ok(p) for p in done if p.scale > hi.scale):
        out["non_monotone"] = True  # a larger budget failed again: the metric is noisy there
    return out


def _ratio(a, b):
    return None if a is None or b in (None, 0) else round(a / b, 3)


BOUND_NOTE = {"lower_bound": " A lower bound: the baseline met the SLO at the smallest budget tried and may need less.",
              "upper_bound": " An upper bound: the edge met the SLO at the smallest budget tried and may need less.",
              "unknown": " Unknown: both lines met the SLO at the smallest budget tried, so each may need less and the "
                         "ratio is bounded neither way (try smaller --budgets)."}


def ratio_kind(edge: dict, central: dict) -> str | None:
    """What the iso-SLO ratio is when a least budget is only bounded: a line meeting the SLO at the smallest
    budget may need less (its figure is an upper bound), one that never met it has no figure."""
    if edge.get("min_gpus_for_slo") is None or central.get("min_gpus_for_slo") is None:
        return None
    e_low, c_low = (d["status"] == "at_or_below_smallest_budget" or d.get("at_or_below_smallest_budget", False)
                    for d in (edge, central))  # (a line's status says it; a continent's least says it apart)
    return {(False, False): "exact", (False, True): "lower_bound", (True, False): "upper_bound"}.get(
        (e_low, c_low), "unknown")


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


def summarise(sc, slo, lines, points, seeds, requests, engine, scales) -> dict:
    """frontier.json (see the module docstring of :mod:`sim.frontier`)."""
    by_line = {line.key: [p for p in points if p.line == line] for line in lines}
    deployments = {key: least(pts, slo) for key, pts in by_line.items()}
    central = [line.key for line in lines if line.deployment == "central"]
    edge = deployments.get("edge", {})
    by_baseline = {k: {"cost": _ratio(edge.get("min_usd_per_hour_for_slo"), deployments[k]["min_usd_per_hour_for_slo"]),
                       "gpus": _ratio(edge.get("min_gpus_for_slo"), deployments[k]["min_gpus_for_slo"]),
                       "kind": ratio_kind(edge, deployments[k])}
                   for k in central}
    first = by_baseline.get(central[0], {}) if central else {}
    per_continent = {}
    if slo.metric in CONTINENT_METRICS:
        conts = sorted({c.split("_")[1] for p in points for r in p.rows for c in r
                        if c.startswith("continent_") and c.endswith("_requests")})
        for cont in conts:
            d = {key: _continent_least(pts, slo, cont) for key, pts in by_line.items()}
            e = d.get("edge", {})
            per_continent[cont] = {"deployments": d, "iso_slo_cost_ratio": _ratio(
                e.get("min_usd_per_hour_for_slo"), d[central[0]]["min_usd_per_hour_for_slo"]) if central else None,
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
    return {"scenario": sc.name, "slo": {"metric": slo.metric, "column": slo.column, "threshold": slo.threshold,
                                         "text": slo.text},
            "seeds": list(seeds), "requests": requests, "engine": engine,
            "budget": sc.central.budget if sc.central is not None else "gpus",
            "inventory_scales": scales, "method": METHOD,
            "deployments": deployments, "baseline": central[0] if central else None,
            "iso_slo_cost_ratio": first.get("cost"), "iso_slo_gpu_ratio": first.get("gpus"),
            "iso_slo_ratio_kind": first.get("kind"),
            "iso_slo_ratio_by_baseline": by_baseline, "per_continent": per_continent,
            "equal_cost": equal_cost,
            "points": [point_dict(p, slo) for p in sorted(points, key=lambda p: (p.line.key, p.scale))]}


def write_outputs(frontier) -> Path:
    out = Path(frontier.path)
    rows_frame(frontier.points).to_parquet(out / "frontier.parquet", index=False)
    (out / "frontier.json").write_text(json.dumps(frontier.result, indent=2))
    plot_frontier(frontier, out / "frontier.png")
    (out / "report.md").write_text("\n".join(report_lines(frontier)) + "\n")
    return out


def plot_frontier(frontier, path: Path) -> Path:
    from sim.plots import pyplot

    plt = pyplot()
    slo = frontier.slo
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=90)
    # TTFT p95 counting requests never answered as late: a point is missing where the p95 fell on them.
    panels = ((axes[0], "gpus", "ttft_p95_ms_all", "GPUs", "TTFT p95 (ms)"),
              (axes[1], "gpus", "slo_attainment", "GPUs", "SLO attainment"),
              (axes[2], "usd_per_hour", "ttft_p95_ms_all", "$ per hour", "TTFT p95 (ms)"))
    for line in frontier.lines:
        pts = sorted((p for p in frontier.points if p.line == line and p.rows), key=lambda p: p.scale)
        if not pts:
            continue
        for ax, xcol, ycol, _, _ in panels:
            x = [getattr(p, xcol) for p in pts]
            y = [p.mean(ycol) if all(r.get(ycol) is not None and np.isfinite(r[ycol]) for r in p.rows)
                 else np.nan for p in pts]
            err = [p.ci95(ycol) for p in pts]
            lo = [min(max(v - e[0], 0.0), 0.5 * v) if e and np.isfinite(v) else 0.0  # log axes: bars stay > 0
                  for v, e in zip(y, err, strict=True)]
            hi = [max(e[1] - v, 0.0) if e and np.isfinite(v) else 0.0 for v, e in zip(y, err, strict=True)]
            ax.errorbar(x, y, yerr=[lo, hi], marker="o", ms=4, capsize=2,
                        ls="-" if line.deployment == "edge" else "--", label=line.key)
        best = frontier.result["deployments"][line.key]
        if best.get("min_gpus_for_slo"):
            axes[0].axvline(best["min_gpus_for_slo"], color=axes[0].lines[-1].get_color(), lw=0.8, ls=":")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for ax, _, ycol, xlabel, ylabel in panels:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        if ycol != "slo_attainment":
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        if ycol == slo.column:
            ax.axhline(slo.threshold, color="k", lw=0.8, ls=":", label=f"SLO: {slo.text}")
        ax.legend(fontsize=8)
    fig.suptitle(f"edgepop frontier: {frontier.scenario}, SLO {slo.text} (dotted verticals: least GPUs meeting it)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _f(v, digits=1):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


NO_RATIO = "it needs the edge's line and a central line"


def has_ratio(r: dict) -> bool:
    """Whether a frontier result can have an iso-SLO ratio: the edge's line and a baseline's were both run."""
    return r["baseline"] is not None and "edge" in r["deployments"]


def report_lines(frontier) -> list[str]:
    r = frontier.result
    lines = [f"# edgepop frontier: {r['scenario']}", "",
             f"SLO: {r['slo']['text']}; seeds {r['seeds']}; requests per run: "
             f"{r['requests'] or 'the scenario'}; budget mode: {r['budget']}; engine {r['engine']}; "
             f"wall time {r.get('wall_s', '-')} s.", "", f"Method: {r['method']}.", "",
             "## Least budget meeting the SLO", "",
             "| deployment | least GPUs | least $/hour | status | fails at GPUs |", "|---|---|---|---|---|"]
    for key, d in r["deployments"].items():
        lines.append(f"| {key} | {_f(d['min_gpus_for_slo'])} | {_f(d['min_usd_per_hour_for_slo'], 2)} | "
                     f"{d['status']}{' (non-monotone)' if d.get('non_monotone') else ''}"
                     f"{'; interval ' + d['interval_at_least'] if d.get('interval_at_least') else ''} | "
                     f"{_f(d.get('fails_at_gpus'))} |")
    if not has_ratio(r):
        lines += ["", f"No iso-SLO cost ratio: {NO_RATIO}.", ""]
    else:
        lines += ["", f"Iso-SLO cost ratio (edge $/hour over {r['baseline']} $/hour, each at its least budget): "
                      f"**{_f(r['iso_slo_cost_ratio'], 3)}** ({r['iso_slo_ratio_kind'] or 'not available'}); "
                      f"GPU ratio {_f(r['iso_slo_gpu_ratio'], 3)}." + BOUND_NOTE.get(r["iso_slo_ratio_kind"], ""), ""]
        for key, v in r["iso_slo_ratio_by_baseline"].items():
            lines.append(f"- against {key}: cost ratio {_f(v['cost'], 3)}, GPU ratio {_f(v['gpus'], 3)} "
                         f"({v['kind'] or 'not available'})")
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
            kind = f" ({d['iso_slo_ratio_kind']})" if d["iso_slo_cost_ratio"] is not None else ""
            lines.append(f"| {cont} | " + " | ".join(cells) + f" | {_f(d['iso_slo_cost_ratio'], 3)}{kind} |")
        bounded = sorted({d["iso_slo_ratio_kind"] for d in r["per_continent"].values()
                          if d["iso_slo_cost_ratio"] is not None} & set(BOUND_NOTE))
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
