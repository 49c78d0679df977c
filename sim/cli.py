"""``edgepop simulate`` (the main job) and ``edgepop sweep``."""

from __future__ import annotations

import json
import shutil
import sys
import time

from edgepop.errors import UserError
from edgepop.outputs import output_folder, staging_folder
from edgepop.rng import seed_arg
from sim.sensitivity import HELP as SENSITIVITY_HELP


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate edge vs central inference on identical arrivals (the main job)",
                       description="Simulate a scenario through the edge deployment and a centralized baseline "
                                   "on the same arrivals; write requests.parquet, summary.json and report.md.")
    p.add_argument("--scenario", default="default", help="embedded scenario name or a TOML file (default: default)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, help="number of requests (overrides the scenario)")
    size.add_argument("--duration", type=float, metavar="S",
                      help="simulated seconds of arrivals (overrides the scenario; a trace replay stops there too)")
    p.add_argument("--seed", type=seed_arg, help="random seed (overrides the scenario)")
    p.add_argument("--trace", help="replay an Azure LLM trace CSV or a Mooncake JSONL instead of Poisson arrivals")
    p.add_argument("--fail", action="append", default=[], metavar="SPEC",
                   help="fault KIND:TARGET@START+DURATION, e.g. pop:FRA@600+300 (repeatable; replaces the "
                        "scenario's own faults); a fault applies to the deployment that has its target (an edge "
                        "node or PoP: the edge; a link: both)")
    p.add_argument("--only", choices=["edge", "central"], help="simulate one deployment only")
    p.add_argument("--sensitivity", action="store_true",
                   help=f"also run the headline with each of: {SENSITIVITY_HELP.replace('%', '%%')} (a sweep on a "
                        "local pool; report.md gets a section and sensitivity.png)")
    p.add_argument("--seeds", metavar="LIST",
                   help="also run the scenario with these seeds, e.g. 1-5 or 1,7,9 (new arrivals and placement "
                        "each), and report every headline gain's mean and 95%% interval over seeds (and seeds.png)")
    p.add_argument("--out", default="edgepop-out", help="output directory (default: edgepop-out)")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout instead of tables")
    p.add_argument("--list-scenarios", action="store_true", help="list embedded scenarios and exit")
    p.set_defaults(func=cmd_simulate)

    s = sub.add_parser("sweep", help="run scenario variants in parallel and gather one Parquet",
                       description="Run a grid of scenario variants (a TOML grid file) on a local process pool "
                                   "or a Ray cluster; write DIR/sweep.parquet and DIR/sweep_summary.parquet.")
    s.add_argument("--grid", required=True, help="grid TOML file, or an embedded grid name (policies, ablation)")
    s.add_argument("--engine", choices=["local", "ray"], default="local")
    s.add_argument("--workers", type=int, default=None, help="parallel workers (default: CPU count)")
    s.add_argument("--out", default="edgepop-sweep", help="output directory")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sweep)

    a = sub.add_parser("ablation", help="each serving technique alone vs all off, on the same arrivals",
                       description="Run an ablation grid (named variants and a baseline; default: the embedded "
                                   "'ablation' grid) with the sweep machinery and print each variant's figures "
                                   "and their change against the baseline.")
    a.add_argument("--grid", default="ablation", help="grid name or file (default: ablation)")
    a.add_argument("--requests", type=int, help="requests per variant (overrides the grid)")
    a.add_argument("--engine", choices=["local", "ray"], default="local")
    a.add_argument("--workers", type=int, default=None, help="parallel workers (default: CPU count)")
    a.add_argument("--out", default="edgepop-ablation", help="output directory")
    a.add_argument("--json", action="store_true", help="print ablation.json instead of the table")
    a.set_defaults(func=cmd_ablation)


def _validate_sizes(args) -> None:
    if args.requests is not None and args.requests <= 0:
        raise UserError(f"--requests must be positive, got {args.requests}")
    if args.duration is not None and not 0 < args.duration < float("inf"):  # (NaN fails too)
        raise UserError(f"--duration must be a positive number of seconds, got {args.duration}")


def cmd_simulate(args) -> int:
    from sim.scenario import embedded_scenarios, load_scenario, no_central

    if args.list_scenarios:
        described = {name: load_scenario(name).description for name in embedded_scenarios()}
        if args.json:  # name -> description
            print(json.dumps(described, indent=2))
            return 0
        for name, description in described.items():
            print(f"{name:12s} {description}")
        return 0
    t_start = time.perf_counter()
    _validate_sizes(args)
    seeds = None
    if args.seeds is not None:
        from sim.replicates import parse_seeds

        seeds = parse_seeds(args.seeds)
    for flag, on in (("--sensitivity", args.sensitivity), ("--seeds", seeds is not None)):
        # before the run, not after it: the extra runs replay the scenario's own workload as the file has it
        if on and args.trace:
            raise UserError(f"{flag} re-runs the scenario's own workload: it cannot be combined with --trace")
        if on and args.fail:
            raise UserError(f"{flag} re-runs the scenario as its file has it: it cannot be combined with --fail "
                            "(put the faults in the scenario's faults field instead)")
        if on and args.only:
            raise UserError(f"{flag} compares edge and central: it cannot run with --only")
    from sim.outputs import FOLDERS, OUTPUT_NAMES, write_outputs

    # (seeds beside --sensitivity reuse its runs: no replicates folder of their own)
    folders = {"sensitivity"} if args.sensitivity else {"replicates"} if seeds is not None else set()
    # before minutes of simulating, not after: a file, or a folder of the user's, where an output goes ('~' expanded)
    # (the gain map too, though only a run with both deployments draws it: a folder of that name is refused now)
    args.out = output_folder(args.out, staged=True, writes=OUTPUT_NAMES | {FOLDERS[name] for name in folders},
                             command="simulate")
    from sim.run import run_scenario
    from sim.run_progress import simulation_progress

    sc = load_scenario(args.scenario)
    main_seed = args.seed if args.seed is not None else sc.seed
    if seeds is not None and not set(seeds) - {main_seed}:
        raise UserError(f"--seeds {args.seeds}: an interval over seeds needs a seed other than the main run's "
                        f"({main_seed})")
    for flag, on in (("--sensitivity", args.sensitivity), ("--seeds", seeds is not None)):
        if on and sc.central is None:
            raise UserError(f"{flag} compares edge and central: {no_central(sc.name)}")
    deployments = (args.only,) if args.only else ("edge", "central")
    with simulation_progress("auto") as progress:  # a bar per deployment when stderr is a terminal
        out = run_scenario(sc, requests=args.requests, duration_s=args.duration, seed=args.seed, trace=args.trace,
                           faults=args.fail, progress=progress, deployments=deployments)
    # The extra runs' folders are staged apart (beside --out) and moved in with the main outputs, all at the end:
    # an interrupted run leaves the folder as it was, never new sweeps beside an earlier run's summary.
    extra = staging_folder(args.out, ".edgepop-extra-")  # (its parent folders created: the check left none)
    try:
        perf = out.summary["performance"]
        if args.sensitivity:
            from sim.sensitivity import run_sensitivity

            t0 = time.perf_counter()
            out.summary["sensitivity"] = run_sensitivity(args.scenario, out.summary, requests=args.requests,
                                                         duration_s=args.duration, seed=args.seed,
                                                         out=extra / "sensitivity", seeds=seeds)
            perf["sensitivity_s"] = round(time.perf_counter() - t0, 2)
        if seeds is not None:
            from sim.replicates import run_replicates

            reuse = None
            if args.sensitivity:  # its "as run" rows are the runs of these seeds already
                import pandas as pd

                rows = pd.read_parquet(extra / "sensitivity" / "sweep_summary.parquet")
                reuse = rows[rows.variant_name == "as run"]
            t0 = time.perf_counter()
            out.summary["replicates"] = run_replicates(args.scenario, out.summary, seeds, requests=args.requests,
                                                       duration_s=args.duration, out=extra / "replicates",
                                                       frame=reuse)
            perf["replicates_s"] = round(time.perf_counter() - t0, 2)
        path = write_outputs(out, args.out, {name: extra / name for name in folders if (extra / name).is_dir()})
    finally:
        shutil.rmtree(extra, ignore_errors=True)
    if args.json:
        from sim.outputs import json_default

        print(json.dumps(out.summary, indent=2, default=json_default))
    else:
        print_headline(out.summary, path, time.perf_counter() - t_start)
    from sim.report import faults_applied_nowhere

    for line in faults_applied_nowhere(out.summary):  # (on stderr, last: not lost among the notes)
        print(f"edgepop: warning: fault {line} applied to no simulated deployment: these figures are of a run "
              "without it", file=sys.stderr)
    return 0


def print_headline(summary: dict, path, total_s: float | None = None) -> None:
    from rich.table import Table

    from edgepop.console import table_console
    from sim.report import headline_table, notes, title_line, wall_text

    t = Table(title=title_line(summary))
    for col in ("metric", "edge", "central", "edge gain (95% CI)"):
        # the gain and its interval stay on one line: the metric names wrap instead
        t.add_column(col, justify="left" if col == "metric" else "right", no_wrap=col != "metric")
    for row in headline_table(summary):
        t.add_row(*row)
    console = table_console()
    console.print(t)
    for line in notes(summary):
        console.print(line, highlight=False)
    if summary.get("replicates"):
        from sim.report import replicates_rows

        rep = summary["replicates"]
        r = Table(title=f"edge gain over {len(rep['seeds'])} seeds ({', '.join(map(str, rep['seeds']))})")
        for col in ("metric", "mean", "sd", "95% CI over seeds", f"within-run 95% CI (seed {rep['seeds'][0]})"):
            r.add_column(col, justify="left" if col == "metric" else "right", no_wrap=col != "metric")
        for row in replicates_rows(rep):  # (each seed's figure: report.md and summary.json)
            r.add_row(row[0], *row[2:])
        console.print(r)
        if rep.get("edge_loses"):
            console.print(rep["edge_loses"] + ".", highlight=False)
    perf = summary.get("performance", {})
    console.print(f"{perf.get('simulated_requests_per_wall_s', 0):,.0f} simulated requests per wall second; "
                  f"{wall_text(perf, total_s)}. Wrote {path}/requests.parquet, summary.json, report.md")


def cmd_sweep(args) -> int:
    from sim.sweep import run_sweep

    if args.workers is not None and args.workers <= 0:
        raise UserError(f"--workers must be positive, got {args.workers}")
    output_folder(args.out, staged=True)
    result = run_sweep(args.grid, engine=args.engine, workers=args.workers, out=args.out)
    if args.json:
        print(result.summary.to_json(orient="records", indent=2))
    else:
        print_sweep_table(result)
        print(f"wrote {result.path}/sweep.parquet, sweep_summary.parquet, sweep.png, sweep.json "
              f"({len(result.grid.variants)} variant{'' if len(result.grid.variants) == 1 else 's'} in {result.wall_s:.1f} s)", file=sys.stderr)
    return 0


def cmd_ablation(args) -> int:
    from sim.techniques.ablation import print_table, run_ablation

    if args.workers is not None and args.workers <= 0:
        raise UserError(f"--workers must be positive, got {args.workers}")
    output_folder(args.out, staged=True)
    table, result = run_ablation(args.grid, requests=args.requests, engine=args.engine, workers=args.workers,
                                 out=args.out)
    if args.json:
        print((result.path / "ablation.json").read_text())
    else:
        g = result.grid
        print_table(table, f"edgepop ablation: {g.source} (base {g.base}, seed {g.seeds[0]}, "
                           f"{', '.join(g.deployments)} only, same arrivals)")
        print(f"wall time {result.wall_s:.1f} s. Wrote {result.path}/ablation.csv, ablation.json, "
              "ablation.png, sweep_summary.parquet, sweep.parquet")
    return 0


SWEEP_COLUMNS = (("TTFT p50", "ttft_p50_ms"), ("TTFT p95", "ttft_p95_ms"), ("E2E p95", "e2e_p95_ms"),
                 ("SLO", "slo_attainment"), ("GPU util", "gpu_utilisation"), ("GPU $", "gpu_usd"),
                 ("TTFT p50 gain %", "gain_ttft_ms_p50_reduction_pct"))


def print_sweep_table(result) -> None:
    """The headline columns of the sweep summary, one row per variant x deployment."""
    from rich.table import Table

    from edgepop.console import table_console
    from sim.report import _fmt

    grid = result.grid
    t = Table(title=f"edgepop sweep: {grid.source} (base {grid.base}, {len(grid.variants)} variants)")
    keys = ["variant", *(["variant_name"] if grid.names else []), "seed", *grid.axes, "deployment"]
    for k in keys:
        t.add_column(k, no_wrap=True)
    for label, _ in SWEEP_COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    for row in result.summary.to_dict("records"):
        cells = [str(row[k]) for k in keys]
        cells += [_fmt(None if row[c] != row[c] else row[c]) for _, c in SWEEP_COLUMNS]  # NaN -> "-"
        t.add_row(*cells)
    # piped into a file: do not squeeze the table into 80 columns
    console = table_console(max(80, sum(len(c) for c in keys) + 20 * len(SWEEP_COLUMNS)))
    console.print(t)
    if "placement" in result.summary:
        from sim.report_deployments import memory_only_policies, memory_only_text

        shared = memory_only_policies(result.summary["placement"].dropna().astype(str))
        if shared:
            console.print(memory_only_text(shared))
