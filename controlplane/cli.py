"""Control-plane commands of the ``edgepop`` CLI (registered by ``edgepop.cli``).

The parsers are built here, the commands run in :mod:`controlplane.placement.cli`: importing the placement package
(its policies, pandas, the topology) to print ``edgepop --help`` would cost every command most of a second.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgepop.outputs import folder_arg
from edgepop.rng import seed_arg
from topology.cli import add_demand_weight


def register(sub: argparse._SubParsersAction) -> None:
    """Add the control-plane sub-commands (``edgepop place``)."""
    p = sub.add_parser("place", help="place model replicas on GPU nodes with a policy; print coverage and memory",
                       description="Decide which model replicas run on which GPU node for a demand forecast and "
                                   "report the share of demand within 25/50/100 ms of a replica, per model, "
                                   "the expected RTT per request and GPU memory use.")
    # (not argparse-required: --list-policies and --list-models run without it; run() names the policies when missing)
    p.add_argument("--policy", metavar="NAME",
                   help="required (unless listing): the placement policy, one of --list-policies")
    p.add_argument("--rps", type=float, default=20_000.0, help="total demand in requests/s, up to 1e9 (default 20000)")
    mix = p.add_mutually_exclusive_group()
    mix.add_argument("--models", help="comma-separated model ids, demand split equally (default: the built-in mix)")
    mix.add_argument("--mix", type=Path, help="JSON or TOML file mapping model id -> share of requests")
    p.add_argument("--catalog", type=Path, help="custom model catalog TOML (default: the shipped one)")
    p.add_argument("--at", help="UTC time (ISO 8601) to shape demand by local time of day (default: daily mean)")
    add_demand_weight(p)
    p.add_argument("--baseline",
                   help="region set for --policy central: us-east, big3, global-6 (default), global-12 or ids")
    p.add_argument("--candidates-k", type=int, default=16, help="nearest replica sites an ingress may use (16)")
    p.add_argument("--utilisation-cap", type=float, default=0.7, help="planned share of replica capacity (0.7)")
    p.add_argument("--time-limit", type=float, help="seconds for --policy ilp (default 60): its warm start may take half, the LP "
                   "relaxation and the solver are stopped at the limit (within about a second; docs/placement.md)")
    p.add_argument("--seed", type=seed_arg, default=0, help="random seed handed to the policy (default 0; the "
                   "shipped policies are deterministic and draw nothing from it; one of yours, loaded with edgepop --plugin, may)")
    p.add_argument("--out", type=folder_arg, help="folder for placement.parquet and summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    p.add_argument("--list-policies", action="store_true", help="list the placement policies and exit")
    p.add_argument("--list-models", action="store_true", help="list the catalog's models and exit")
    p.set_defaults(func=run_place)


def run_place(args: argparse.Namespace) -> int:
    """``edgepop place`` (:func:`controlplane.placement.cli.run`)."""
    from controlplane.placement.cli import run

    return run(args)
