"""``edgepop frontier``: the least GPU budget (and $/hour) at which each deployment meets an SLO."""

from __future__ import annotations

import json

from edgepop.errors import UserError
from edgepop.outputs import output_folder


def register(sub) -> None:
    p = sub.add_parser("frontier", help="least GPUs and $/hour meeting an SLO, edge vs central (cost frontier)",
                       description="Sweep each deployment's GPU budget (the scenario's GPU inventory scale x each "
                                   "of --budgets; central follows the edge's budget: equal GPUs or equal $/hour), "
                                   "bisect the least budget meeting --slo, and write frontier.json, "
                                   "frontier.parquet, frontier.png and report.md.")
    p.add_argument("--scenario", default="default", help="embedded scenario name or a TOML file (default: default)")
    p.add_argument("--slo", default="ttft_p95_ms=500",
                   help="METRIC=VALUE: a latency at most VALUE ms (ttft_p95_ms=500) or a share at least VALUE "
                        "(slo_attainment=0.99); default ttft_p95_ms=500")
    p.add_argument("--budgets", default="0.1,0.18,0.32,0.56,1,1.8",
                   help="comma-separated multiples of the scenario's GPU inventory scale (default 0.1,0.18,0.32,0.56,1,1.8)")
    p.add_argument("--absolute", action="store_true", help="--budgets are inventory scales, not multiples")
    p.add_argument("--seeds", default=None, help="comma-separated seeds or ranges, e.g. 1-3 (default: the "
                   "scenario's seed)")
    p.add_argument("--baselines", default=None,
                   help="central region sets to sweep, comma-separated (default: the scenario's); separate them "
                        "with ';' when a set is itself a list of region ids")
    p.add_argument("--only", choices=["edge", "central"], help="sweep one deployment only")
    p.add_argument("--requests", type=int, help="requests per run (overrides the scenario)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="stop bisecting when the bracket is within this share of the GPUs (or one GPU); default 0.05")
    p.add_argument("--max-steps", type=int, default=4, help="bisection rounds at most (default 4)")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: CPU count)")
    p.add_argument("--out", default="edgepop-frontier", help="output directory (default: edgepop-frontier)")
    p.add_argument("--json", action="store_true", help="print frontier.json instead of the table")
    p.set_defaults(func=cmd_frontier)
    argparse_error = p.error

    def error(message: str):  # "--budgets -1,1": argparse reads the value as a flag; say what was meant
        if "--budgets" in message and "expected one argument" in message:
            message += " (budgets are positive numbers; a value starting with '-' needs --budgets=VALUE)"
        argparse_error(message)

    p.error = error


def _seeds(text):
    """``--seeds``: as ``simulate --seeds`` reads it (comma-separated, ranges like 1-5)."""
    from sim.replicates import parse_seeds

    return None if text is None else parse_seeds(text)


def cmd_frontier(args) -> int:
    from sim.frontier import run_frontier

    if args.workers is not None and args.workers <= 0:
        raise UserError(f"--workers must be positive, got {args.workers}")
    if args.requests is not None and args.requests <= 0:
        raise UserError(f"--requests must be positive, got {args.requests}")
    output_folder(args.out, staged=True)  # outputs are assembled beside it, then moved in
    f = run_frontier(args.scenario, slo=args.slo, budgets=args.budgets, seeds=_seeds(args.seeds),
                     engine=args.engine, workers=args.workers, requests=args.requests, baselines=args.baselines,
                     only=args.only, tolerance=args.tolerance, max_steps=args.max_steps, out=args.out,
                     absolute=args.absolute)
    if args.json:
        print(json.dumps(f.result, indent=2))
        return 0
    print_frontier(f)
    return 0


def print_frontier(f) -> None:
    from rich.table import Table

    from edgepop.console import table_console
    from sim import frontier_report as fr

    r = f.result
    t = Table(title=f"edgepop frontier: {r['scenario']}, SLO {r['slo']['text']}, seeds {r['seeds']}")
    for col in ("deployment", "least GPUs", "least $/hour", "status"):
        t.add_column(col, justify="left" if col in ("deployment", "status") else "right")
    for key, d in r["deployments"].items():
        t.add_row(key, "-" if d["min_gpus_for_slo"] is None else f"{d['min_gpus_for_slo']:,}",
                  "-" if d["min_usd_per_hour_for_slo"] is None else f"{d['min_usd_per_hour_for_slo']:,.2f}",
                  fr.status_text(d))
    console = table_console()
    console.print(t)
    ratio = r["iso_slo_cost_ratio"]
    said = (f"iso-SLO cost ratio (edge / {r['baseline']}): {fr.ratio_text(ratio, r['iso_slo_ratio_kind'])} "
            f"({fr.headline_note(r)})"
            if fr.has_ratio(r) else f"no iso-SLO cost ratio ({fr.NO_RATIO})")
    if fr.too_few(r):
        console.print(fr.too_few(r), highlight=False)
    console.print(f"{said}; wall time {r['wall_s']} s. Wrote {f.path}/frontier.json, frontier.parquet, frontier.png, "
                  "report.md", highlight=False)
    # what a bounded or unbounded ratio means (kind None: a line never met the SLO, said above)
    if r["iso_slo_ratio_kind"] in fr.BOUND_NOTE:
        console.print(fr.BOUND_NOTE[r["iso_slo_ratio_kind"]].strip(), highlight=False)
    seed_line = fr.by_seed_line(r.get("iso_slo_by_seed"), r["baseline"]) if fr.has_ratio(r) else None
    if seed_line:
        console.print(seed_line[2:], highlight=False)
    # each line's router; the network assumed; the demand's weighting where not by population
    for line in fr.routing_lines(r)[:1] + [x for x in fr.network_lines(r) if x]:
        console.print(line, highlight=False)
