"""Routing decision time inside a simulation, router by router, on the same arrivals.

    python benchmarks/bench_routing_sim.py [--scenario default] [--routers nearest-balanced,least-ttft]
                                           [--requests N]

Runs each deployment of the scenario once per router (both sides routed by it, the scenario's router options
kept), timing every ``ControlPlane.submit`` (admission and the routing decision: what a request costs the control
plane), and prints per router and deployment the decisions' p50, p99 and p99.9 in microseconds and the loop's
wall time. Unlike ``bench_controlplane.py``'s synthetic fleet, the replicas, their service-time estimates and the
load are the scenario's. The goal of the default run (``bench_sim.py``) is p99 <= 50 us; the same figure is given
here for every router. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from edgepop.argtypes import json_line, positive_int


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="default", help="embedded scenario name or TOML file (default: default)")
    ap.add_argument("--routers", default="nearest-balanced,least-ttft",
                    help="comma-separated routing policies (default: nearest-balanced,least-ttft)")
    ap.add_argument("--requests", type=positive_int, default=None, help="requests (default: the scenario's)")
    args = ap.parse_args()
    from bench_sim import timed_submits  # (beside this script: its default run times decisions the same way)

    from controlplane.routing import ROUTERS
    from edgepop.errors import UserError
    from sim.run import prepare, scenario_deployment, simulate_deployment, with_run_overrides
    from sim.scenario import check_scenario, load_scenario

    routers = [r for r in args.routers.split(",") if r]
    unknown = [r for r in routers if r not in ROUTERS]
    if not routers or unknown:
        ap.error(f"--routers: unknown routing policy {unknown[0]!r} (known: {', '.join(ROUTERS.names())})"
                 if unknown else "--routers: name at least one routing policy")
    out: dict = {"benchmark": "bench_routing_sim", "scenario": args.scenario, "routers": {}}
    try:
        base = with_run_overrides(load_scenario(args.scenario), requests=args.requests)
        for router in routers:
            sc = check_scenario(replace(base, edge=replace(base.edge, router=router),
                                        central=base.central and replace(base.central, router=router)))
            setup = prepare(sc)
            sides = [name for name, dep in (("edge", sc.edge), ("central", sc.central)) if dep is not None]
            for name in sides:
                dep = scenario_deployment(setup, name)
                decisions = timed_submits(dep.plane)
                run = simulate_deployment(setup, name, dep=dep)
                us = np.asarray(decisions, dtype=float) / 1e3
                row = {f"p{q:g}_us": round(float(np.percentile(us, q)), 2) for q in (50, 99, 99.9)}
                row.update(decisions=len(us), loop_s=round(run.stats["sim_wall_s"], 2))
                out["routers"].setdefault(router, {})[name] = row
                print(f"{router} {name}: p50 {row['p50_us']} us, p99 {row['p99_us']} us, p99.9 {row['p99.9_us']} us "
                      f"({row['decisions']:,} decisions, loop {row['loop_s']} s)", flush=True)
    except UserError as exc:
        ap.error(str(exc))
    out["requests"] = int(len(setup.frame))
    print(json_line(out))


if __name__ == "__main__":
    main()
