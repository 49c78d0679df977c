"""Simulator benchmark: simulated requests per wall second, memory at scale, and cost per request vs PoP count.

    python benchmarks/bench_sim.py [--quick]

1. The embedded ``default`` scenario (edge and central on identical arrivals) and, in the same process, a bare
   SimPy M/M/c run of the same request count (one process per request, a ``simpy.Resource`` with c servers): the
   ratio says how much of SimPy's own speed the full request path keeps. Goals: >= 20,000 req/s, ratio >= 0.25.
2. Peak RSS and wall time of the edge simulation at 100k and 1M requests (each in a fresh subprocess so peaks do
   not mix). Goal: <= 2 GB at 1M, linear growth.
3. Cost per request with 3,000 PoPs vs 300 (synthetic PoPs at population-weighted cities). Goal: <= 2x.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import simpy

ROOT = Path(__file__).resolve().parents[1]


def bare_simpy_mmc(n: int, c: int = 64, lam: float = 500.0, mu: float = 10.0, seed: int = 0) -> float:
    """Wall seconds for a textbook SimPy M/M/c of ``n`` requests."""
    rng = np.random.default_rng(seed)
    gaps, services = rng.exponential(1 / lam, n).tolist(), rng.exponential(1 / mu, n).tolist()
    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=c)
    waits = []

    def customer(service):
        t = env.now
        with servers.request() as req:
            yield req
            waits.append(env.now - t)
            yield env.timeout(service)

    def source():
        for gap, service in zip(gaps, services, strict=True):
            yield env.timeout(gap)
            env.process(customer(service))

    t0 = time.perf_counter()
    env.process(source())
    env.run()
    return time.perf_counter() - t0


def run_default(requests: int | None) -> dict:
    from sim.run import run_scenario

    out = run_scenario("default", requests=requests)
    perf = out.summary["performance"]
    n = out.summary["requests"]
    sim_s = sum(v for k, v in perf.items() if k.endswith("_sim_wall_s"))
    return {"requests": n, "deployments": len(out.summary["deployments"]), "sim_wall_s": sim_s,
            "wall_s": perf["wall_s"], "sim_rps": perf["simulated_requests_per_wall_s"]}


def child_scale(n: int, pops: int | None) -> None:
    """Run in a subprocess: edge-only simulation of n requests; prints JSON with wall time and peak RSS."""
    from sim.run import run_scenario

    topo = None
    if pops:
        topo = synthetic_topology(pops)
    t0 = time.perf_counter()
    out = run_scenario("default", requests=n, deployments=("edge",), topo=topo)
    wall = time.perf_counter() - t0
    perf = out.summary["performance"]
    print(json.dumps({"requests": n, "pops": pops, "wall_s": round(wall, 2), "sim_wall_s": perf["edge_sim_wall_s"],
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def synthetic_topology(n_pops: int):
    """The shipped topology with its PoP list replaced by ``n_pops`` population-weighted cities (tier 3)."""
    import pandas as pd

    from topology import Topology

    base = Topology.load()
    d = base.demand
    rng = np.random.default_rng(0)
    pick = rng.choice(len(d), size=n_pops, replace=False, p=d.weight.to_numpy())
    rows = d.iloc[np.sort(pick)]
    pops = pd.DataFrame({"id": [f"P{i:04d}" for i in range(n_pops)], "city": rows.name.to_numpy(),
                         "country": rows.cc.to_numpy(), "cc": rows.cc.to_numpy(),
                         "continent": rows.continent.to_numpy(), "lat": rows.lat.to_numpy(),
                         "lon": rows.lon.to_numpy(), "tz": rows.tz.to_numpy(),
                         "metro_pop": rows.population.to_numpy(), "tier": 3, "cf_region": "",
                         "coord_source": "synthetic"})
    tmp = Path(tempfile.gettempdir()) / "edgepop-bench"
    tmp.mkdir(exist_ok=True)
    path = tmp / f"pops_{n_pops}.csv"
    pops.to_csv(path, index=False)
    return Topology.load(pops=path)


def subprocess_json(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller scale runs (10k/100k, 300 vs 1,000 PoPs)")
    ap.add_argument("--child", nargs=2, type=int, metavar=("N", "POPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_scale(args.child[0], args.child[1] or None)
        return
    results = {}
    d = run_default(None)
    bare = bare_simpy_mmc(d["requests"] * d["deployments"])
    bare_rps = d["requests"] * d["deployments"] / bare
    results.update({"default_requests": d["requests"], "default_wall_s": d["wall_s"],
                    "default_sim_rps": d["sim_rps"], "bare_simpy_mmc_rps": round(bare_rps, 1),
                    "ratio_to_bare_simpy": round(d["sim_rps"] / bare_rps, 3)})
    print(json.dumps(results))
    sizes = (10_000, 100_000) if args.quick else (100_000, 1_000_000)
    for n in sizes:
        r = subprocess_json(["--child", str(n), "0"])
        print(json.dumps(r))
        results[f"rss_mb_{n}"], results[f"wall_s_{n}"] = r["peak_rss_mb"], r["wall_s"]
        results[f"sim_wall_s_{n}"] = r["sim_wall_s"]
    small, big = 300, (1000 if args.quick else 3000)
    n = 20_000 if args.quick else 100_000
    per = {}
    for pops in (small, big):
        r = subprocess_json(["--child", str(n), str(pops)])
        print(json.dumps(r))
        per[pops] = r["sim_wall_s"] / n
        results[f"sim_us_per_request_{pops}_pops"] = round(1e6 * per[pops], 2)
    results["cost_ratio_big_vs_300_pops"] = round(per[big] / per[small], 3)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
