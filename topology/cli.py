"""``edgepop topology``: what the world looks like — PoPs, GPUs, coverage — and a map."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgepop.outputs import folder_arg

OUTPUT_NAMES = frozenset({"summary.json", "map.png"})  # what run writes into --out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topology", help="summarise PoPs, GPU inventory, population coverage; draw a world map",
                       description="Summarise the PoPs, GPU inventory and population coverage of a topology "
                                   "(the shipped one by default) and draw a world map of PoPs and regions.")
    p.add_argument("--pops", type=Path, help="custom PoP CSV (columns id, city, continent, lat, lon, tz, metro_pop; "
                   "optional cc, an ISO country code, and tier)")
    p.add_argument("--gpus", type=Path, help="custom GPU spec CSV (see topology/data/gpus.csv)")
    p.add_argument("--regions", type=Path,
                   help="custom cloud region CSV (id, provider, code, lat, lon; optional name, cc)")
    p.add_argument("--tiers", type=Path, help="custom tier CSV (tier, min_metro_pop, nodes)")
    p.add_argument("--last-mile-ms", type=float, default=0.0,
                   help="access-network RTT added to every user before coverage is computed (default 0)")
    p.add_argument("--last-mile", choices=("fixed", "country", "continent"), default="fixed",
                   help="fixed: --last-mile-ms for everyone (default); country / continent: M-Lab NDT medians "
                        "(the summary's last_mile_ms is then their population-weighted mean)")
    add_demand_weight(p, " in the coverage figures")
    p.add_argument("--out", type=folder_arg, default=Path("out/topology"),
                   help="folder for map.png and summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    p.set_defaults(func=run)


def add_demand_weight(p: argparse.ArgumentParser, purpose: str = "") -> None:
    """The ``--demand-weight`` option (``edgepop topology``, ``edgepop place``): its choices are
    ``topology.demand.DEMAND_WEIGHTS``, written out so that ``edgepop --help`` does not import pandas."""
    p.add_argument("--demand-weight", choices=("population", "internet_users"), default="population",
                   help="weight each demand city by its population (default) or by its people online (population x "
                        f"its country's share of individuals using the Internet, World Bank){purpose}")


def run(args: argparse.Namespace) -> int:
    from edgepop.errors import UserError
    from edgepop.outputs import output_folder, staged_output
    from topology.report import draw_map, pyplot, summary
    from topology.world import Topology

    if not 0 <= args.last_mile_ms <= 86_400_000:  # (up to a day, as the gateway's config takes)
        raise UserError(f"--last-mile-ms must be in [0, 86400000], got {args.last_mile_ms:g}")
    if args.last_mile != "fixed" and args.last_mile_ms:
        raise UserError(f"--last-mile-ms is the fixed mode's value: it does not apply with --last-mile "
                        f"{args.last_mile}")
    args.out = output_folder(args.out, staged=True, writes=OUTPUT_NAMES, command="topology")  # ('~/dir' expanded)
    topo = Topology.load(pops=args.pops, gpus=args.gpus, regions=args.regions,
                         tiers=args.tiers).with_demand_weight(args.demand_weight)
    s = summary(topo, last_mile_ms=args.last_mile_ms, last_mile=args.last_mile)
    pyplot()  # (matplotlib's import, the slow part, before any file exists)
    with staged_output(args.out, OUTPUT_NAMES, command="topology") as tmp:  # both files or neither
        draw_map(topo, tmp / "map.png")
        (tmp / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    s["map"] = str(args.out / "map.png")
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print_tables(s)
    return 0


def print_tables(s: dict) -> None:
    from rich.table import Table

    from edgepop.console import table_console

    con = table_console()
    t = Table(title=f"{s['pops']} PoPs, {s['gpu_nodes']} GPU nodes, {s['gpu_memory_tb']} TB GPU memory")
    t.add_column("continent")
    t.add_column("PoPs", justify="right")
    for c, n in s["pops_per_continent"].items():
        t.add_row(c, str(n))
    con.print(t)
    g = Table(title="GPUs per type")
    g.add_column("GPU")
    g.add_column("count", justify="right")
    for k, v in s["gpus_per_type"].items():
        g.add_row(k, str(v))
    con.print(g)
    who = "people online" if s.get("demand_weight") == "internet_users" else "population"
    c = Table(title=f"Share of the {who} of {s['demand_cities']} cities within reach "
                    f"(last mile: {s['last_mile']})")
    for col in ("deployment", "<=10 ms", "<=25 ms", "<=50 ms", f"median RTT ms (by {who})"):
        c.add_column(col, justify="right")
    rows = [("edge PoPs", s["edge"])] + [(f"central {k}", v) for k, v in s["baselines"].items()]
    for name, v in rows:
        c.add_row(name, *(f"{v[f'within_{t}ms']:.1%}" for t in (10, 25, 50)), f"{v['median_rtt_ms']}")
    con.print(c)
    for name in s.get("baselines_skipped", {}):
        con.print(f"central {name}: left out (the region table lacks its regions)")
    con.print(f"map: {s['map']}")
