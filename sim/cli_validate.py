"""``edgepop validate``: fidelity tables of the service-time and WAN models (``controlplane.validation``) and of the
simulated replica under load (``sim.load_validation``)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from edgepop.outputs import folder_arg

OUTPUT_NAMES = frozenset({"fidelity.json", "fidelity.png"})  # what validate writes into --out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="fidelity of the service-time and WAN models against the shipped data",
                       description="Print the fidelity tables of the service-time model (leave-one-group-out by "
                                   "model, GPU type and tensor parallelism; external checks; the simulated replica "
                                   "under closed-loop load) and of the WAN latency model (per data set, distance "
                                   "band and continent; cross-validated by data set and by continent), write them "
                                   "as JSON and optionally as the docs page.")
    p.add_argument("--out", type=folder_arg, default=Path("out/validate"),
                   help="folder for fidelity.json and fidelity.png (predicted against measured)")
    p.add_argument("--docs", type=Path, help="also write the markdown page here (docs/fidelity-models.md), its "
                   "figure beside it (the same name, .png)")
    p.add_argument("--in-sample", action="store_true",
                   help="skip the cross-validation (a few seconds instead of 15-30); --docs needs it")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from controlplane.validation import fidelity_report, render_markdown
    from edgepop.errors import UserError
    from edgepop.outputs import output_file, output_folder, staged_output
    from sim import load_validation
    from sim.validate_plots import draw_fidelity

    if args.docs and args.in_sample:
        raise UserError("--docs needs the cross-validated tables: drop --in-sample")
    if args.docs:
        if args.docs.suffix.lower() != ".md":  # its figure goes beside it as .png: a .png page would overwrite it
            raise UserError(f"--docs {args.docs}: the page is markdown, name it .md (its figure goes beside it, "
                            f"{args.docs.with_suffix('.png').name})")
        args.docs = output_file(args.docs, "--docs")  # (the paths as checked: '~' expanded)
        output_file(args.docs.with_suffix(".png"), "--docs (its figure)")
    args.out = output_folder(args.out, staged=True, writes=OUTPUT_NAMES, command="validate")
    frames: dict = {}
    with Console(stderr=True).status("validating") as status:  # (shown on a terminal only)
        rep = fidelity_report(cross_validated=not args.in_sample, frames=frames, progress=status.update)
        status.update("the simulated replica under load: replaying closed-loop benchmark runs")
        rep["under_load"] = load_validation.load_report()
        status.update("writing fidelity.json and drawing the figure")
        with staged_output(args.out, OUTPUT_NAMES, command="validate") as tmp:  # both files or neither
            (tmp / "fidelity.json").write_text(json.dumps(rep, indent=2) + "\n")
            draw_fidelity(frames, tmp / "fidelity.png")
        figure = args.out / "fidelity.png"
        if args.docs:
            args.docs.parent.mkdir(parents=True, exist_ok=True)  # (the check above left no folder behind)
            page_figure = args.docs.with_suffix(".png")
            if page_figure.resolve() != figure.resolve():  # (--docs OUT/fidelity.md: the figure is there already)
                figure = Path(shutil.copyfile(figure, page_figure))
            args.docs.write_text(render_markdown(rep, load_validation.render_markdown(rep["under_load"], "###"),
                                                 figure=figure.name))
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    print_tables(rep)
    print(f"wrote {args.out / 'fidelity.json'}, {args.out / 'fidelity.png'}"
          + (f", {args.docs} and {figure}" if args.docs else ""))
    return 0


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def print_tables(rep: dict) -> None:
    from rich.table import Table

    from controlplane.perf_validation import GROUPINGS, PHASES
    from edgepop.console import table_console

    con = table_console()
    st = rep["service_time"]
    t = Table(title="Service time: MAPE by phase (end-to-end prefill/decode; kernel; all-reduce)")
    t.add_column("grouping")
    for p in PHASES:
        t.add_column(p, justify="right")
    t.add_row("in sample", *(_pct(st["in_sample"].get(p, {}).get("mape")) for p in PHASES))
    for key in GROUPINGS:
        if f"by_{key}" not in st:
            continue
        pooled = st[f"by_{key}"]["pooled"]
        t.add_row(f"leave one {key} out", *(_pct(pooled.get(p, {}).get("mape")) for p in PHASES))
    con.print(t)
    for key in GROUPINGS:
        if f"by_{key}" not in st:
            continue
        g = Table(title=f"Service time: leave one {key} out, MAPE per held-out {key}")
        g.add_column(key)
        for p in PHASES:
            g.add_column(p, justify="right")
        for name, e in st[f"by_{key}"]["groups"].items():
            g.add_row(name, *(_pct(e[p]["mape"]) if p in e else "" for p in PHASES))
        con.print(g)
    for h in rep.get("service_time_holdouts", []):
        d, e = h["readings"]["default"], h["readings"]["other_release"]
        other = (f"{_pct(e['mape'])} with another release's" if h["other_release"]
                 else "no release of this engine fitted")
        con.print(f"service time on {h['rows']} held-out rows ({', '.join(h['engines'])}, never fitted): MAPE "
                  f"{_pct(d['mape'])} with the default profile, {other}")
    for e in rep["under_load"]["readings"].values():
        chunk = f", prefill chunked at {e['chunked_prefill_tokens']}" if e.get("chunked_prefill_tokens") else ""
        t = Table(title=f"Simulated replica under load ({rep['under_load']['runs']} closed-loop runs, never fitted), "
                        f"profile {e['engine_profile']}{chunk}: MAPE / mean signed error by clients")
        bands = list(e["ttft_ms"]["by_concurrency"])
        for col in ("metric", "all", *bands):
            t.add_column(col, justify="left" if col == "metric" else "right")
        for m, x in ((m, e[m]) for m in ("ttft_ms", "itl_ms", "e2e_ms", "requests_per_s")):
            t.add_row(m, f"{_pct(x['mape'])} / {_pct(x['mean_signed'])}",
                      *(f"{_pct(x['by_concurrency'][b]['mape'])} / {_pct(x['by_concurrency'][b]['mean_signed'])}"
                        for b in bands))
        con.print(t)
    if "goal_failures" in st:
        con.print("service-time goal: " + ("met" if not st["goal_failures"] else
                                            "not met: " + ", ".join(st["goal_failures"])))
    wan = rep["wan"]
    for name in ("in_sample", "leave_one_set_out", "leave_one_continent_out"):
        if name not in wan:
            continue
        for by in ("by_set", "by_band", "by_continent"):
            w = Table(title=f"WAN {name.replace('_', ' ')}, {by[3:]}")
            for col in (by[3:], "pairs", "median APE", "p90 APE", "median pred/meas"):
                w.add_column(col, justify="left" if col == by[3:] else "right")
            for k, e in wan[name][by].items():
                w.add_row(k, str(e["pairs"]), _pct(e["median_ape"]), _pct(e["p90_ape"]), f"{e['median_ratio']:.2f}")
            con.print(w)
        if "met" in wan[name]:
            con.print(f"WAN {name.replace('_', ' ')}: " + ("all goals met" if wan[name]["met"] else
                                                            "goals missed: " + ", ".join(wan[name]["failures"])))
    j = rep["jitter"]
    con.print(f"jitter: floor {1 - j['model']['excess']:.3f} x mean, sigma {j['model']['sigma']:.2f}, "
              f"p99 {j['p99_over_mean']:.3f} x mean; min error {_pct(j['median_abs_error_of_min'])}, "
              f"max error {_pct(j['median_abs_error_of_max'])} over {j['paths']} paths")
    lm = rep["last_mile"]
    for mode, m in lm["modes"].items():
        con.print(f"last mile {mode}: mean {m['mean_ms']} ms ({m['describe']})")
