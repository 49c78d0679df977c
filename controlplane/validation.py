"""``edgepop validate``: the fidelity of the service-time and WAN models against every shipped measurement set.

:func:`fidelity_report` gathers, as one JSON-ready dict:

* ``service_time``: the roofline's errors in sample and in leave-one-group-out cross-validation by model, GPU
  type and tensor-parallel degree (``controlplane.perf_validation``), each group's MAPE by phase;
* ``service_time_image``: the image server's profile and its in-sample fit
  (:func:`controlplane.perf_validation.image_server_report`);
* ``service_time_holdouts``: the shipped constants against published measurements no fit ever sees, one report
  per table (``perf_holdout.csv``, ``perf_holdout_nim.csv``, ``perf_holdout_static_decode.csv``,
  ``perf_holdout_edge.csv``, ``perf_holdout_mlperf_images.csv``; :func:`controlplane.perf_validation.holdout_report`);
* ``wan``: the WAN model's errors per data set, distance band and continent, in sample and cross-validated by
  data set and by continent (``topology.wan_fidelity``), with the goals met or missed;
* ``jitter``: the per-path RTT distribution and how it reproduces the measured minima and maxima;
* ``last_mile``: the last-mile modes and what each gives per continent.

:func:`render_markdown` turns that dict into ``docs/fidelity-models.md``; the page is generated, never edited by
hand, so the error bars a reader sees are the ones the code produces (a test checks the page is current).
"""

from __future__ import annotations

import numpy as np

from controlplane.perf_validation import (
    GOAL_MAPE,
    GROUPINGS,
    HOLDOUT_BREAKDOWNS,
    HOLDOUT_FILES,
    PHASES,
    cross_validate,
    goal_failures,
    holdout_report,
    image_server_report,
    summary,
)
from topology.demand import load_demand_points
from topology.jitter import jitter_report
from topology.last_mile import MODES, SOURCE, LastMile, load_table
from topology.rtt_sets import CONTINENTS
from topology.wan_fidelity import every_provider_report, wan_report, worst_pairs

COMMAND = "edgepop validate --docs docs/fidelity-models.md"


def last_mile_report() -> dict:
    """Population-weighted mean last mile per mode, overall and per continent."""
    d = load_demand_points()
    cc, cont, w = d.cc.to_numpy(), d.continent.to_numpy(), d.population.to_numpy(dtype=float)
    out = {"source": SOURCE, "countries": int(len(load_table())), "modes": {}}
    for mode in MODES:
        lm = LastMile(mode)
        ms = lm.ms(cc, cont)
        out["modes"][mode] = {"describe": lm.describe(), "mean_ms": round(float(np.average(ms, weights=w)), 1),
                              "by_continent": {c: round(float(np.average(ms[cont == c], weights=w[cont == c])), 1)
                                               for c in sorted(set(cont))}}
    return out


def fidelity_report(cross_validated: bool = True, frames: dict | None = None, progress=None) -> dict:
    """Every fidelity table (cross-validation takes 15-30 s on two cores; ``cross_validated=False``
    gives the in-sample tables only). ``frames``: a dict that receives the rows behind the tables, with their
    predictions (``service_time``: reference rows, ``fit_ms`` and when cross-validated ``cv_<grouping>_ms``;
    ``wan``: measured pairs), for plots. ``progress``: called with a line as each stage starts."""
    from controlplane.perf_calibration import fit, load_rows, mape

    say = progress or (lambda line: None)
    rows = load_rows()
    say("service time: " + ("refitting without each model, GPU type and tp degree" if cross_validated
                            else "fitting"))
    if cross_validated:
        table = cross_validate(rows)
        perf = summary(table)
        perf["goal_failures"] = goal_failures(perf)
    else:
        pred = rows.predict(fit(rows))
        table = rows.table.assign(fit_ms=pred)
        perf = {"in_sample": {ph: {"rows": int((rows.table.phase == ph).sum()),
                                   "mape": mape(pred[rows.table.phase == ph], rows.measured[rows.table.phase == ph])}
                              for ph in PHASES}, "goal_mape": GOAL_MAPE}
    perf["rows_by_kind"] = {k: int(v) for k, v in rows.table.kind.value_counts().items()}
    perf["gpus"] = sorted(set(rows.table.gpu))
    perf["tp"] = sorted(int(t) for t in set(rows.table.tp[rows.table.kind != "collective"]))
    if frames is not None:
        frames["service_time"] = table
    say("WAN: " + ("refitting without each data set and continent" if cross_validated else "fitting"))
    wan = wan_report(cross_validated=cross_validated, frames=frames)
    if cross_validated:
        wan["every_provider_fitted"] = every_provider_report()
    return {"generated_by": COMMAND, "service_time": perf, "service_time_image": image_server_report(),
            "service_time_holdouts": [holdout_report(path=f) for f in HOLDOUT_FILES], "wan": wan,
            "wan_worst_pairs": worst_pairs(), "jitter": jitter_report(), "last_mile": last_mile_report()}


# ---------------------------------------------------------------- markdown
def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _error_table(title: str, table: dict, label: str) -> list[str]:
    out = [f"**{title}**", "", f"| {label} | pairs | median APE | p90 APE | median predicted/measured |",
           "|---|---:|---:|---:|---:|"]
    for key, e in table.items():
        name = CONTINENTS.get(key, key)
        out.append(f"| {name} | {e['pairs']} | {_pct(e['median_ape'])} | {_pct(e['p90_ape'])} | "
                   f"{e['median_ratio']:.2f} |")
    return out + [""]


def _perf_groups(title: str, groups: dict, label: str = "held out") -> list[str]:
    out = [f"**{title}**", "", f"| {label} | " + " | ".join(PHASES) + " |", "|---|" + "---:|" * len(PHASES)]
    for name, e in groups.items():
        cells = [f"{_pct(e[p]['mape'])} ({e[p]['rows']})" if p in e else "" for p in PHASES]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out + [""]


def _image_lines(image: dict) -> list[str]:
    """The image server's profile: its two constants and the rows they were fitted on."""
    if not image:
        return []
    out = ["### Image passes: the image server's profile", "",
           f"Image models are priced with their own engine profile, `image-server`: a fixed cost per pass, "
           f"{image['prefill_overhead_ms']:.3f} ms, and one share of the dense peak of every board, "
           f"{image['gemm_efficiency']:.3f}, the rest (weights streamed, compute and memory combined) the shared "
           f"constants'. Fitted on `controlplane/data/{image['file']}` ({image['rows']} MLPerf ResNet-50 rows of "
           f"datacenter boards), in-sample MAPE {_pct(image['in_sample_mape'])}; the edge-class L4 and T4 are its "
           "check (`perf_holdout_mlperf_images.csv`, below, the `other release` reading).", "",
           "| GPU | batch | measured ms | fitted ms |", "|---|---:|---:|---:|"]
    out += [f"| {p['gpu']} | {p['batch']} | {p['measured_ms']:g} | {p['fit_ms']:g} |" for p in image["points"]]
    return out + [""]


def _holdout_lines(checks: list[dict]) -> list[str]:
    """The external checks: the shipped constants against rows no fit sees, both readings side by side."""
    out = ["### External checks: measurements no fit sees", "",
           "Each table below is never fitted, in any fold: the shipped constants predict its rows as an engine the "
           "fit never saw (the `default` profile, what estimates of language models use) and as the fitted "
           "profile of its engine's nearest release (another release, or the same one measured another way; for "
           "the image harness, the image server's profile, fitted on the same harness's datacenter boards). "
           "Signed = mean of predicted / measured - 1 (negative: the model is too fast).",
           ""]
    for h in checks:
        d, o = h["readings"]["default"], h["readings"]["other_release"]
        other = ", ".join(f"`{k}` read as `{v}`" for k, v in h["other_release"].items())
        if not h["other_release"]:
            other = "none (no release of this engine was fitted: both readings are the default profile's)"
        elif all(pt["default_ms"] == pt["other_release_ms"] for pt in h["points"]):
            other += (" (whose fitted profile has no constants of its own for these rows' phase, so both readings "
                      "are the default's: one reading, not two)")
        phases = ", ".join(f"{x['rows']} {p}" for p, x in d["by_phase"].items())
        sources = (", ".join(h["sources"]) if len(h["sources"]) <= 3
                   else f"{len(h['sources'])} sources, each row's in the file's `source` column")
        out += [f"**`controlplane/data/{h['file']}`**: {h['rows']} rows ({phases}) of "
                f"{', '.join(f'`{x}`' for x in h['engines'])} ({sources}); other release: {other}. "
                f"Pooled MAPE {_pct(d['mape'])} (median {_pct(d['median_ape'])}, signed {_pct(d['mean_signed'])}) "
                f"and {_pct(o['mape'])} (median {_pct(o['median_ape'])}, signed {_pct(o['mean_signed'])}).", "",
                "| breakdown | group | rows | MAPE, default profile | MAPE, other release |", "|---|---|---:|---:|---:|"]
        for key in HOLDOUT_BREAKDOWNS:
            for g, x in d[f"by_{key}"].items():
                out.append(f"| {key} | {g} | {x['rows']} | {_pct(x['mape'])} | {_pct(o[f'by_{key}'][g]['mape'])} |")
        out += ["", "| model | GPU | tp | phase | batch | prompt tokens | context | measured ms | default profile ms | "
                "other release ms |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {p['model']} | {p['gpu']} | {p['tp']} | {p['phase']} | {p['batch']} | {p['tokens']} | "
                f"{p['context']} | {p['measured_ms']:g} | {p['default_ms']:g} | {p['other_release_ms']:g} |"
                for p in h["points"]]
        out.append("")
    return out


def _status(check: dict) -> str:
    return "all goals met" if check["met"] else "missed: " + ", ".join(check["failures"])


def render_markdown(rep: dict, service_time_extra: list[str] = (), figure: str | None = None) -> str:
    """``docs/fidelity-models.md`` from a :func:`fidelity_report` (cross-validated); ``service_time_extra``: lines
    a higher layer adds after the service-time checks (the simulated replica under load); ``figure``: the file
    name of the predicted-against-measured figure beside the page (``sim.validate_plots``)."""
    st, wan = rep["service_time"], rep["wan"]
    lines = ["# Model fidelity: service time and WAN latency", "",
             "Where the code is: `controlplane/validation.py` (this page and the JSON), "
             "`controlplane/perf_validation.py` (service-time cross-validation), `topology/wan_fidelity.py` (WAN "
             "cross-validation), `sim/load_validation.py` (the simulated replica under load), `sim/cli_validate.py` "
             "(`edgepop validate`), `sim/validate_plots.py` (the figure).", "",
             f"Generated by `{rep['generated_by']}` (which also writes the numbers as JSON); do not edit by hand. "
             "Every figure below is an error of a model against published measurements it was, or (in the "
             "cross-validated tables) was not, fitted on. Sources and licences of the data: "
             "`controlplane/data/ATTRIBUTION.md`, `topology/data/ATTRIBUTION.md`.", ""]
    if figure:
        lines += [f"![Held-out predictions against measurements: service time by held-out group, WAN RTT by "
                  f"distance]({figure})", "",
                  "Left: every end-to-end reference row predicted by constants refitted without its model, GPU type "
                  "or tensor-parallel degree (one marker each), as predicted / measured; the band is the 10% goal. "
                  "Right: predicted / measured RTT of every pair of the fitted WAN data sets, predicted without its "
                  "data set, against distance; the band is the 0.85-1.15 goal, the line the median.", ""]
    lines += ["## Service time (the calibrated roofline)", "",
              f"Reference rows: {st['rows_by_kind'].get('e2e', 0)} end-to-end engine figures (prefill = time to "
              f"first token, decode = time per output token), {st['rows_by_kind'].get('kernel', 0)} operator-level "
              f"transformer-body passes (Vidur profiles) and {st['rows_by_kind'].get('collective', 0)} NVLink "
              f"all-reduce timings; GPUs {', '.join(st['gpus'])}; tensor parallelism {', '.join(map(str, st['tp']))}. "
              "Leave-one-group-out: refit every constant without the group, predict the group. MAPE = mean absolute "
              f"percentage error. Goal: prefill and decode MAPE <= {_pct(st['goal_mape'])} in every grouping.", "",
              "| grouping | " + " | ".join(PHASES) + " |", "|---|" + "---:|" * len(PHASES),
              "| in sample | " + " | ".join(_pct(st["in_sample"].get(p, {}).get("mape")) for p in PHASES) + " |"]
    for key in GROUPINGS:
        pooled = st[f"by_{key}"]["pooled"]
        lines.append(f"| leave one {key} out | " + " | ".join(_pct(pooled.get(p, {}).get("mape")) for p in PHASES)
                     + " |")
    failures = st.get("goal_failures", [])
    lines += ["", f"Goal {'met' if not failures else 'not met: ' + ', '.join(failures)}.", ""]
    for key in GROUPINGS:
        lines += _perf_groups(f"Leave one {key} out, MAPE (rows) per held-out {key}", st[f"by_{key}"]["groups"])
        lines += _perf_groups(f"Leave one {key} out, the same predictions per serving engine",
                              st[f"by_{key}"]["by_engine"], "engine")
    lines += _image_lines(rep.get("service_time_image", {}))
    lines += _holdout_lines(rep["service_time_holdouts"])
    lines += list(service_time_extra)
    lines += ["## WAN latency (core RTT between data centres)", "",
              "Data sets: " + "; ".join(f"`{n}`: {s['statistic']}{'' if s['fitted'] else ''}"
                                       for n, s in wan["sets"].items()) + ".", "",
              "Fitted constants: " + ", ".join(f"{k} = {v:g}" for k, v in wan["params"].items()) + ". Goals (on "
              f"cross-validated predictions): median APE <= {_pct(wan['goals']['median_ape'])}, p90 APE <= "
              f"{_pct(wan['goals']['p90_ape'])}, every distance band's median predicted/measured within "
              f"{wan['goals']['band_ratio'][0]:.2f}-{wan['goals']['band_ratio'][1]:.2f}.", ""]
    ins = wan["in_sample"]
    lines += _error_table("In sample, per data set", ins["by_set"], "data set")
    lines += _error_table("In sample (fitted sets), per distance band", ins["by_band"], "distance")
    bands = list(ins["by_band"])
    lines += ["**In sample, median predicted/measured per data set and distance band** (providers differ most on "
              "short paths)", "", "| data set | " + " | ".join(bands) + " |", "|---|" + "---:|" * len(bands)]
    lines += [f"| {name} | " + " | ".join(f"{t[b]['median_ratio']:.2f} ({t[b]['pairs']})" if b in t else ""
                                          for b in bands) + " |" for name, t in ins["by_set_band"].items()]
    lines.append("")
    for name, title in (("leave_one_set_out", "Leave one data set (provider) out"),
                        ("leave_one_continent_out", "Leave one continent out")):
        if name not in wan:
            continue
        cv = wan[name]
        status = "all goals met" if cv["met"] else "goals missed: " + ", ".join(cv["failures"])
        p = cv["pooled"]
        once = (" (each pair once: one spanning two continents as predicted by the fit that left out the first of "
                "them alphabetically)" if name == "leave_one_continent_out" else "")
        lines += [f"### {title}", "", f"Pooled{once}: {p['pairs']} pairs, median APE {_pct(p['median_ape'])}, p90 APE "
                  f"{_pct(p['p90_ape'])}, median ratio {p['median_ratio']:.2f}; {status}.", ""]
        lines += _error_table("Per data set", cv["by_set"], "data set")
        lines += _error_table("Per distance band", cv["by_band"], "distance")
        lines += _error_table("Per continent (pairs touching it" + (", each predicted by the fit that left that "
                              "continent out)" if once else ")"), cv["by_continent"], "continent")
    alt = wan.get("every_provider_fitted")
    if alt:
        lines += ["### If every provider were fitted", "",
                  f"Fitting {', '.join(f'`{n}`' for n in alt['sets'])} together gives "
                  + _alt_params(alt["params"])
                  + f". In sample: median APE {_pct(alt['in_sample']['pooled']['median_ape'])}, p90 "
                  f"{_pct(alt['in_sample']['pooled']['p90_ape'])}, median ratio below 500 km "
                  f"{alt['in_sample']['by_band']['<500 km']['median_ratio']:.2f}; leave one data set out: "
                  f"{_status(alt['leave_one_set_out'])}; leave one continent out: "
                  f"{_status(alt['leave_one_continent_out'])}. The shipped constants leave the reported-only sets "
                  "out (see `topology/rtt_sets.py`).", ""]
    lines += ["Largest misses of the shipped model per data set (where it stops holding):", "",
              "| set | pair | km | measured ms | predicted ms |", "|---|---|---:|---:|---:|"]
    lines += [f"| {w['set']} | {w['a']} - {w['b']} | {w['km']} | {w['measured_ms']} | {w['predicted_ms']} |"
              for w in rep["wan_worst_pairs"]]
    j = rep["jitter"]
    lines += ["", "## Per-path RTT distribution (jitter, off unless a scenario sets `jitter = true`)", "",
              f"Shifted log-normal around each path's mean: floor {1 - j['model']['excess']:.3f} x mean, excess "
              f"sigma {j['model']['sigma']:.2f}; p90 {j['p90_over_mean']:.3f} x mean, p99 {j['p99_over_mean']:.3f} "
              f"x mean. Fitted on {j['model']['source']}; on those {j['paths']} paths the predicted minimum is off "
              f"by a median {_pct(j['median_abs_error_of_min'])} and the predicted maximum by "
              f"{_pct(j['median_abs_error_of_max'])} (in sample).", ""]
    lm = rep["last_mile"]
    conts = sorted(next(iter(lm["modes"].values()))["by_continent"])
    lines += ["## Last mile (scenario field `last_mile`; default `fixed`)", "",
              f"Source of the `country` and `continent` modes: {lm['source']} ({lm['countries']} countries). "
              "Population-weighted mean over the demand cities (ms):", "",
              "| mode | all | " + " | ".join(CONTINENTS.get(c, c) for c in conts) + " |",
              "|---|---:|" + "---:|" * len(conts)]
    for mode, m in lm["modes"].items():
        lines.append(f"| {mode} | {m['mean_ms']} | " + " | ".join(str(m["by_continent"][c]) for c in conts) + " |")
    return "\n".join(lines) + "\n"


def _alt_params(params: dict) -> str:
    """The constants of the every-provider fit, to three significant digits (the fourth moves between machines'
    floating-point libraries); ``short_scale_km`` does nothing when ``short_inflation`` is 0, and its value is then
    wherever the optimiser left it: not shown."""
    inert = params.get("short_inflation") == 0
    return ", ".join(f"{k} = n/a (no effect with short_inflation = 0)" if inert and k == "short_scale_km"
                     else f"{k} = {v:.3g}" for k, v in params.items())
