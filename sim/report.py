"""report.md: the headline table and its notes, the breakdowns, sensitivity and seed sections, with the plots of
:mod:`sim.plots`."""

from __future__ import annotations

from pathlib import Path

from sim.plots import plot_gain_map, plot_ttft_cdf, plot_utilisation
from sim.rejections import not_ok_lines
from sim.replicates_plot import plot_replicates
from sim.report_deployments import budget_line, demand_line, deployment_lines, load_line, network_line
from sim.sensitivity_plot import plot_sensitivity

HEADLINE = (
    ("TTFT p50 (ms)", ("ttft_ms", "p50"), "ttft_ms_p50_reduction_pct", "ttft_ms_p50_reduction_pct"),
    ("TTFT p95 (ms)", ("ttft_ms", "p95"), "ttft_ms_p95_reduction_pct", "ttft_ms_p95_reduction_pct"),
    ("TTFT p99 (ms)", ("ttft_ms", "p99"), "ttft_ms_p99_reduction_pct", "ttft_ms_p99_reduction_pct"),
    ("TTFT p95 incl. failures (ms)", ("ttft_ms_counting_failures", "p95"), None, None),
    ("TPOT p50 (ms)", ("tpot_ms", "p50"), "tpot_ms_p50_reduction_pct", "tpot_ms_p50_reduction_pct"),
    ("E2E p50 generation (ms)", ("e2e_ms_generation", "p50"), "e2e_ms_generation_p50_reduction_pct",
     "e2e_ms_generation_p50_reduction_pct"),
    ("E2E p50 one-shot (ms)", ("e2e_ms_one_shot", "p50"), "e2e_ms_one_shot_p50_reduction_pct",
     "e2e_ms_one_shot_p50_reduction_pct"),
    ("network RTT p50 (ms)", ("network_rtt_ms", "p50"), "network_rtt_ms_p50_reduction_pct",
     "network_rtt_ms_p50_reduction_pct"),
    ("SLO attainment", ("slo_attainment",), "slo_attainment_delta", "slo_attainment_delta"),
    ("goodput (req/s)", ("goodput_rps",), None, None),
    ("ok / rejected / failed", ("outcomes",), None, None),
    ("faults: lost / retried / failed", ("faults",), None, None),
    ("cold starts (requests, p95 ms)", ("cold_starts",), None, None),
)
CAPACITY = (("GPUs", "gpus"), ("replicas", "replicas"), ("capacity at SLO (req/s)", "capacity_rps"),
            ("capacity at SLO (tokens/s)", "capacity_tokens_per_s"),
            ("GPU busy, mean over arrivals", "utilisation_mean"),
            ("GPU busy, peak hour", "utilisation_peak_hour"), ("GPU wait p95, peak hour (ms)", "wait_p95_ms_peak_hour"),
            ("$ per hour", "usd_per_hour"))


def _get(block, keys):
    for k in keys:
        block = block.get(k) if isinstance(block, dict) else None
    return block


def _cell(keys, block):
    """A deployment's value for one headline row (composite rows are formatted here)."""
    v = _get(block, keys)
    if keys == ("outcomes",) and v:
        return f"{v['ok']:,} / {v['rejected']:,} / {v['failed']:,}"
    if keys == ("faults",) and v:
        return f"{v['lost']:,} / {v['retried']:,} / {v['failed']:,}"
    if keys == ("cold_starts",) and v:
        return f"{v['requests']:,}, {_fmt(v['ms']['p95'])}"
    if keys[0] == "ttft_ms_counting_failures" and v is None and block and block.get("generation_requests", 1):
        return "failed"  # the percentile falls on requests that were never answered (none: no text generation)
    return v


def gain_text(value, ci, delta: bool = False) -> str:
    """``+41.5% [+41.0, +42.1]`` (the point gain and its 95% interval, which need not be symmetric);
    ``+0.0050 [+0.0042, +0.0058]`` for a difference."""
    if value is None:
        return ""
    if delta:
        return f"{value:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")
    return f"{value:+.1f}%" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")


def headline_rows(summary: dict) -> list[tuple]:
    """(metric, edge, central, edge gain) rows shared by report.md and the terminal table."""
    d = summary["deployments"]
    e, c = d.get("edge"), d.get("central")
    g = summary.get("gains") or {}
    ci = g.get("ci95") or {}
    rows = []
    for label, keys, gain_key, ci_key in HEADLINE:
        gain = gain_text(g.get(gain_key), ci.get(ci_key), delta=label == "SLO attainment") if gain_key else ""
        rows.append((label, _cell(keys, e), _cell(keys, c), gain))
    cap = summary.get("capacity") or {}
    whole = _peak_hour_is_whole_run(summary)
    for label, key in CAPACITY:
        if whole and "peak hour" in label:  # (no hour-long window in the run: the figure is the whole run's)
            label = label.replace("peak hour", "peak hour = all arrivals")
        rows.append((label, _get(cap.get("edge"), (key,)), _get(cap.get("central"), (key,)), ""))
    rows += [("GPU-hours", _get(e, ("gpu_hours",)), _get(c, ("gpu_hours",)), ""),
             ("GPU cost ($)", _get(e, ("gpu_usd",)), _get(c, ("gpu_usd",)), "")]
    return rows


def headline_table(summary: dict) -> list[tuple[str, str, str, str]]:
    """:func:`headline_rows` with every value as the terminal and report.md print it."""
    return [(m, _fmt(a), _fmt(b), g or "") for m, a, b, g in headline_rows(summary)]


def _peak_hour_is_whole_run(summary: dict) -> bool:
    from sim.capacity import peak_hour_is_whole_run

    day_s = (summary.get("day") or {}).get("day_s")
    return bool(day_s and summary.get("capacity")) and peak_hour_is_whole_run(summary["simulated_span_s"],
                                                                                 day_s / 24.0)


def faults_applied_nowhere(summary: dict) -> list[str]:
    """The faults that every simulated deployment skipped, each as ``spec (why, per deployment)``: the run's
    figures are those of a run without them."""
    per = [{line.split(": ", 1)[0]: line.split(": ", 1)[-1] for line in block.get("faults", {}).get("skipped", [])}
           for block in summary["deployments"].values()]
    if not per:
        return []
    common = set.intersection(*(set(p) for p in per))
    return [f"{spec} ({'; '.join(p[spec] for p in per)})" for spec in sorted(common)]


def notes(summary: dict) -> list[str]:
    """The lines under the table: how intervals were made, where the edge loses, faults that did not apply,
    what an autoscaler did."""
    out = []
    g = summary.get("gains") or {}
    if g.get("ci95"):
        seeds = ("fixed; the intervals over seeds are below." if summary.get("replicates") else
                 "fixed, so another seed can move a figure by more: most of all TPOT and the E2E of text generation, "
                 "whose decode speed follows the GPU types the plan gave each model (between-seed intervals: edgepop "
                 "simulate --seeds).")
        out.append(f"edge gain = (central - edge) / central (SLO attainment: edge - central, an absolute "
                   f"difference), with its 95% interval: {g['ci95']['method']}. The "
                   "interval is within this run: its arrivals and its placement (built for this workload) are held "
                   + seeds)
    out += no_interval_lines(g.get("ci95") or {})
    trace = summary.get("trace")
    if trace and trace.get("limited_by") == "duration_s":  # the time cut, not the trace, ended the replay
        asked = f" of the {trace['asked']:,} asked for" if trace.get("asked") else ""
        out.append(f"duration_s = {trace['duration_s']:g} s cut the replay of {trace['file']} to "
                   f"{trace['requests']:,} requests{asked} (the trace holds {trace['held']:,}).")
    elif trace and trace.get("asked") and trace["requests"] < trace["asked"]:
        out.append(f"The trace {trace['file']} holds {trace['requests']:,} requests, fewer than the "
                   f"{trace['asked']:,} asked for: all of them were replayed.")
    out += not_ok_lines(summary)  # why requests did not end ok, by error code
    if trace and trace.get("first_utc"):  # the trace's own day beside the one the run's clock used
        used, own = (summary.get("day") or {}).get("start_utc"), trace["first_utc"]
        out.append(f"The trace's own first timestamp is {_utc(own)}; the run's day starts "
                   + ("there (start_utc = \"trace\")." if used and _utc(used) == _utc(own) else
                      f"at the scenario's start_utc, {_utc(used)} (only the trace's relative times are kept; "
                      "start_utc = \"trace\" starts the day at its own)."))
    misroute = (summary.get("network") or {}).get("anycast_misroute") or 0.0
    if misroute:
        out.append(f"Imperfect anycast: {misroute:.0%} of the user cities enter the edge at their second-nearest PoP "
                   f"(drawn with seed {summary['seed']}); the rest at their nearest.")
    demand = demand_line(summary.get("demand_weight"))
    if demand:
        out.append(demand)
    scale = summary.get("service_time_scale")
    if scale:
        out.append(f"Service times scaled: every prefill x{scale['prefill']:g} and every decode step "
                   f"x{scale['decode']:g} of the service-time model's, for the placement, "
                   "the control planes and the replicas alike (prefill_time_scale, decode_time_scale: a stress "
                   "test of its calibration, not a calibrated prediction).")
    d = summary["deployments"]
    if "edge" in d and "central" in d:
        n_e, n_c = (_get(d[k], ("ttft_ms", "n")) or 0 for k in ("edge", "central"))
        out.append(f"Latency percentiles are of the requests that ended ok on each side (TTFT: {n_e:,} text "
                   f"generation requests at the edge, {n_c:,} centrally); TTFT p95 incl. failures counts rejected "
                   "and failed requests as never answered, as a latency SLO does.")
    net = summary.get("network") or {}
    if net.get("last_mile"):  # the access leg both sides pay: part of every TTFT, and of how a gain reads
        hint = (" (edgepop simulate --sensitivity also runs each country's measured median)"
                if net["last_mile"].startswith("fixed") else "")
        out.append(network_line(net, hint=hint))  # (imperfect anycast has a line of its own above)
    out += deployment_lines(summary) + budget_line(summary) + load_line(summary)
    if _peak_hour_is_whole_run(summary):
        out.append(f"The arrivals span {summary['simulated_span_s']:,.1f} simulated seconds, less than an hour of "
                   f"the workload's clock ({summary['day']['day_s'] / 24:,.4g} s): the peak-hour rows are over the "
                   "whole span (GPU busy, peak hour = its mean).")
    if g.get("edge_loses"):
        # With replicates, the seed-level sentence follows; this one is of one run's within-run intervals.
        within = f"Within the seed-{summary['seed']} run alone, " if summary.get("replicates") else ""
        out.append(within + g["edge_loses"] + ".")
    for name, block in summary["deployments"].items():
        for line in block.get("faults", {}).get("skipped", []):
            out.append(f"fault not applied to {name}: {line}")
    for name, block in summary["deployments"].items():
        if "autoscaler" in block:
            a = block["autoscaler"]
            # (the router loads a cold replica a request is routed to: a cold start the policy's count misses)
            out.append(f"Autoscaler ({a['policy']}) on {name}: {a['scale_outs']:,} scale-outs (replicas loaded, a "
                       f"cold start each), {a['scale_to_zero']:,} scale-to-zero (idle replicas unloaded); "
                       f"{a['router_loads']:,} cold replicas loaded by the router for a request routed to them.")
    return out


def no_interval_lines(ci: dict) -> list[str]:
    """A line per reason (``gains.ci95.no_interval``) why headline gains are shown without an interval."""
    from sim.gains import HEADLINE_LOSSES

    names = dict(HEADLINE_LOSSES)
    by_reason: dict[str, list[str]] = {}
    for key, reason in (ci.get("no_interval") or {}).items():
        by_reason.setdefault(reason, []).append(names.get(key, key))
    return [f"No 95% interval for {', '.join(keys)}: {reason} (as for the crossover bins: an interval over a "
            "handful of requests says nothing)." for reason, keys in by_reason.items()]


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if 0.9995 <= v < 1.0:  # (an SLO attainment of 2,999 in 3,000 must not read as a perfect 1.000)
            return f"{v:.4f}"
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def title_line(s: dict) -> str:
    """The one-line title of a run from its summary: scenario, requests, seed, inventory, service-time scale (where
    set), baseline."""
    deps = s.get("deployments") or {}
    base = f", central {s['baseline']}" if s.get("baseline") and (not deps or "central" in deps) else ""
    only = f", {next(iter(deps))} only" if len(deps) == 1 else ""
    trace = s.get("trace")
    replay = f", replaying {Path(trace['file']).name}" if trace else ""
    scale = s.get("service_time_scale")
    slow = "" if not scale else f", service times x{scale['prefill']:g}" if scale["prefill"] == scale["decode"] \
        else f", prefill x{scale['prefill']:g}, decode x{scale['decode']:g}"
    return (f"edgepop simulate: {s['scenario']} ({_n(s['requests'], 'request')}{replay}, seed {s['seed']}, GPU "
            f"inventory x{s.get('gpu_inventory_scale', 1.0):g}{slow}{base}{only})")


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(_fmt(v) if not isinstance(v, str) else v for v in r) + " |" for r in rows]]


def _ci(iv) -> str:
    return "-" if not iv else f"[{iv[0]:+.1f}, {iv[1]:+.1f}]"


def crossover_lines(gains: dict) -> list[str]:
    """report.md tables: TTFT of text generation by prompt size, continent and load level, with intervals."""
    lines = []
    for key, title in (("by_prompt_tokens", "prompt tokens"), ("by_continent", "user continent"),
                       ("by_load", "load level (tercile of the arrival rate)")):
        groups = gains.get(key) or {}
        if not groups:
            continue
        rows = []
        for name, b in groups.items():
            if "ttft_p50_reduction_pct" not in b:
                rows.append([name, b["requests"], "-", "-", "-", "-", "-", "-", "-", "-"])
                continue
            rows.append([name, b["requests"], b["edge_ttft_p50_ms"], b["central_ttft_p50_ms"],
                         f"{b['ttft_p50_reduction_pct']:+.1f}%", _ci(b["ttft_p50_ci95"]), b["edge_ttft_p95_ms"],
                         b["central_ttft_p95_ms"], f"{b['ttft_p95_reduction_pct']:+.1f}%", _ci(b["ttft_p95_ci95"])])
        lines += ["", f"### By {title}", ""]
        lines += _table([title.split(" (")[0], "requests", "edge p50", "central p50", "p50 gain", "95% CI",
                         "edge p95", "central p95", "p95 gain", "95% CI"], rows)
    return lines


def write_report(out, directory: Path) -> Path:
    """Write report.md with the headline table, crossovers, per-continent gains and the plots (three, the gains
    over seeds with ``--seeds``, the sensitivity rows with ``--sensitivity``)."""
    directory = Path(directory)
    s = out.summary
    figs = []
    if plot_gain_map(out.requests, directory / "ttft_gain_map.png"):
        figs.append(("TTFT gain per user country", "ttft_gain_map.png"))
    plot_ttft_cdf(out.requests, directory / "ttft_cdf.png")
    deps = list(s["deployments"])
    figs.append(("TTFT distribution, " + (" vs ".join(deps) if len(deps) > 1 else f"{deps[0]} only"), "ttft_cdf.png"))
    plot_utilisation(out.utilisation, directory / "utilisation.png")
    figs.append(("Utilisation over time", "utilisation.png"))
    if s.get("replicates"):
        plot_replicates(s["replicates"], directory / "seeds.png")
        figs.append(("Gains over seeds", "seeds.png"))
    if s.get("sensitivity"):
        plot_sensitivity(s["sensitivity"], directory / "sensitivity.png")
        figs.append(("Sensitivity of the headline", "sensitivity.png"))
    lines = [f"# {title_line(s)}", "",
             f"{_n(s['requests'], 'request')} over {_span_text(s['simulated_span_s'])}{_day_text(s)}, "
             f"seed {s['seed']}"
             + ("; the same arrivals went through each deployment. " if len(deps) > 1 else ". ")
             + "Latency figures are of interactive requests "
             "(TTFT and TPOT: text generation; E2E split into generation and one-shot tasks).", "",
             "| metric | edge | central | edge gain (95% CI) |", "|---|---|---|---|"]
    lines += [f"| {m} | {a} | {b} | {g} |" for m, a, b, g in headline_table(s)]
    lines += [""] + [f"- {n}" for n in notes(s)]
    gains = s.get("gains") or {}
    if gains.get("by_prompt_tokens"):
        lines += ["", "## Where the edge wins and loses (text generation TTFT)"]
        lines += crossover_lines(gains)
    lines += breakdown_lines(s)
    if s.get("replicates"):
        lines += ["", *replicates_lines(s["replicates"])]
    if s.get("sensitivity"):
        lines += ["", *sensitivity_lines(s["sensitivity"])]
    perf = s.get("performance", {})
    lines += ["", f"Simulator: {perf.get('simulated_requests_per_wall_s', 0):,.0f} simulated requests per wall "
                  f"second; {wall_text(perf)}.", ""]
    for title, fname in figs:
        lines += [f"## {title}", "", f"![{title}]({fname})", ""]
    path = directory / "report.md"
    path.write_text("\n".join(lines))
    return path


def wall_text(perf: dict, total_s: float | None = None) -> str:
    """``wall time 45.7 s (main run 5.3 s, --sensitivity 40.4 s)``: ``total_s`` (the whole command, when it is
    known) or the main run and the extra runs of --sensitivity and --seeds, each named (the files' writing is
    not in these: its time is ``outputs_s``)."""
    parts = [(f"main run {perf.get('wall_s', 0)} s")]
    parts += [f"{flag} {perf[key]} s" for key, flag in (("sensitivity_s", "--sensitivity"), ("replicates_s", "--seeds"))
              if key in perf]
    if total_s is not None:
        return f"wall time {total_s:.2f} s in all ({', '.join(parts)})"
    if len(parts) == 1:
        return f"wall time of the run {perf.get('wall_s', 0)} s"
    total = perf.get("wall_s", 0) + perf.get("sensitivity_s", 0) + perf.get("replicates_s", 0)
    return f"wall time {total:.2f} s before writing these files ({', '.join(parts)})"


def _utc(iso: str | None) -> str:
    """``2023-11-16 18:15:46.680 UTC`` from an ISO time in UTC (milliseconds kept, zeros dropped)."""
    if not iso:
        return "none"
    import pandas as pd

    t = pd.Timestamp(iso).tz_convert("UTC")
    text = t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond // 1000:03d}" if t.microsecond else "")
    return text + " UTC"


def _day_text(s: dict) -> str:
    """`` (3.6 h of a day compressed to 600 s, from 12:00 UTC)``: which part of the day's load the run saw."""
    day = s.get("day") or {}
    if not day.get("day_s"):
        return ""
    start = f", from {day['start_utc'][11:16]} UTC" if day.get("start_utc") else ""
    squeezed = f"a day compressed to {day['day_s']:,.0f} s" if day["day_s"] < 86_400 else "a day"
    hours = day["hours_covered"]
    # (a short run covers minutes of the day: "0 h" would read as none of it)
    covered = (f"{hours:.4g} h" if hours >= 1 else f"{60 * hours:.2g} min" if hours >= 1 / 60 else
               f"{3600 * hours:.2g} s")
    return f" ({covered} of {squeezed}{start})"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _span_text(span_s: float) -> str:
    """``14 simulated seconds``; ``0.1 simulated seconds`` (a span under 10 s keeps a decimal)."""
    return f"{span_s:,.0f} simulated seconds" if span_s >= 10 else f"{span_s:.2g} simulated seconds"


def sensitivity_lines(sens: dict) -> list[str]:
    """report.md section: the headline under other edge GPU inventories and other baseline sets."""
    lines = ["## Sensitivity of the headline", "", sens.get("note", ""), ""]
    rows = [[r["variant"], r["gpus"], r["edge_ttft_p50_ms"], r["central_ttft_p50_ms"],
             gain_text(r["ttft_p50_reduction_pct"], r["ttft_p50_ci95"]), r["edge_ttft_p95_ms"],
             r["central_ttft_p95_ms"], gain_text(r["ttft_p95_reduction_pct"], r["ttft_p95_ci95"]),
             gain_text(r.get("tpot_p50_reduction_pct"), r.get("tpot_p50_ci95")),
             r["edge_busy"], r["central_busy"]] if "infeasible" not in r else
            [r["variant"], f"not run: {r['infeasible']}", *["-"] * 9] for r in sens["rows"]]
    return lines + _table(["variant", "GPUs", "edge TTFT p50", "central p50", "p50 gain", "edge p95",
                           "central p95", "p95 gain", "TPOT p50 gain", "edge GPU busy", "central GPU busy"], rows)


def _pair(blocks: list[dict], key: str) -> str:
    return " / ".join(_fmt(b.get(key)) if b else "-" for b in blocks)


def breakdown_lines(s: dict) -> list[str]:
    """report.md section: each deployment's ``per_model`` and ``per_gpu_type`` blocks side by side (cells are
    ``edge / central``), to see which model or GPU type a gap between them comes from."""
    deps = {name: b for name, b in (s.get("deployments") or {}).items() if b.get("per_model")}
    if not deps:
        return []
    names = list(deps)
    models = sorted({m for b in deps.values() for m in b["per_model"]})
    rows = []
    for m in models:
        per = [deps[n]["per_model"].get(m) or {} for n in names]
        rows.append([m, max(b.get("requests", 0) for b in per), _pair(per, "replicas"), _pair(per, "gpus"),
                     _pair(per, "ttft_p50_ms"), _pair(per, "ttft_p95_ms"), _pair(per, "tpot_p50_ms"),
                     _pair(per, "e2e_p50_ms_one_shot")])
    label = " / ".join(names)
    lines = ["", "## Where the gaps come from", "",
             f"Each cell gives {label}. Replicas and GPUs are the placement's (a GPU shared by two models counts for "
             "both); latencies are of ok interactive requests (TTFT, TPOT: text generation; E2E: one-shot tasks).",
             "", "### Per model", ""]
    lines += _table(["model", "requests", "replicas", "GPUs", "TTFT p50 (ms)", "TTFT p95 (ms)", "TPOT p50 (ms)",
                     "E2E p50 one-shot (ms)"], rows)
    gpus = sorted({g for b in deps.values() for g in b.get("per_gpu_type", {})})
    rows = [[g, *(_pair([deps[n].get("per_gpu_type", {}).get(g) or {} for n in names], k)
                  for k in ("gpus", "generation_share", "tpot_p50_ms", "busy_share"))] for g in gpus]
    lines += ["", "### Per GPU type", ""]
    return lines + _table(["GPU", "GPUs", "share of generation served", "TPOT p50 (ms)",
                           "busy share, whole run incl. drain"], rows)


def replicates_rows(rep: dict) -> list[list[str]]:
    """(metric, per seed, mean, sd, 95% CI over seeds, within-run 95% CI) rows of the ``replicates`` block."""
    rows = []
    for r in rep["rows"]:
        digits = 4 if r["difference"] else 1
        num = (lambda v, d=digits: "-" if v is None else f"{v:+.{d}f}")  # noqa: E731
        iv = (lambda iv, d=digits: "-" if not iv else f"[{iv[0]:+.{d}f}, {iv[1]:+.{d}f}]")  # noqa: E731
        unit = "" if r["difference"] or r["mean"] is None else "%"
        rows.append([r["metric"], ", ".join(num(v) for v in r["per_seed"]), num(r["mean"]) + unit,
                     "-" if r["sd"] is None else f"{r['sd']:.{digits}f}", iv(r["ci95"]),
                     iv(r["within_run_ci95_first_seed"])])
    return rows


def replicates_lines(rep: dict) -> list[str]:
    """report.md section: every headline gain over seeds (mean, sd, Student-t interval)."""
    seeds = rep["seeds"]
    header = ["edge gain", f"per seed ({', '.join(map(str, seeds))})", "mean", "sd", "95% CI over seeds",
              f"within-run 95% CI (seed {seeds[0]})"]
    lines = (["## Between seeds", "", f"{len(seeds)} seeds: {rep['method']}. {rep['note']}", ""]
             + _table(header, replicates_rows(rep)))
    if rep.get("edge_loses"):
        lines += ["", rep["edge_loses"] + "."]
    conts = rep.get("by_continent") or []
    if conts:
        def cell(b):
            return "-" if b["mean"] is None else f"{b['mean']:+.1f}% {_ci(b['ci95'])}"
        lines += ["", "### By user continent (text generation TTFT gain, mean over seeds and 95% CI)", "",
                  *_table(["continent", "TTFT requests per seed", "p50 gain", "p95 gain"],
                          [[b["continent"], b["ttft_requests_mean"], cell(b["ttft_p50"]), cell(b["ttft_p95"])]
                           for b in conts])]
    return lines
