"""Simulator benchmark: speed against bare SimPy, set-up time, routing latency, cost per request vs PoP count,
memory and output time at a million requests.

    python benchmarks/bench_sim.py [--quick]

1. The embedded ``default`` scenario (edge and central on identical arrivals) and, in the same process, a bare
   SimPy M/M/c run of the same request count (one process per request, a ``simpy.Resource`` with c servers).
   ``ratio_loop``: simulated requests per second of the simulation loops / the bare M/M/c's (goal >= 0.5);
   ``ratio_run_scenario``: the same with the whole ``run_scenario`` wall time, set-up included, plots excluded
   (goal >= 0.35; with the user's disk caches, ``*_placement_from_cache`` says whether the placement came from
   it); the edge and central loops' rates separately (goal: central no slower per request; neither loop's time
   counts building its candidate lists, which is set-up for both), and each one's
   backbone hops per request (``*_hop_events_per_request``: a request served away from where it was decided
   travels there, one timer event more; every central request does, edge ones served at their ingress PoP don't),
   all its events per request (``*_events_per_request``) and the loop's time per event (``*_loop_us_per_event``:
   the best loop time over the events of the counted run, the same simulation). The loops run
   untimed, each loop and the bare run twice, interleaved, keeping each one's best time (the second pass finds the
   service-time memo of ``controlplane.perf_cached`` filled, which costs the first about 3% of its loop); routing decisions
   are timed in a further run of each (the timing itself costs time).
   The set-up time (topology, matrices, placement, control planes; goal <= 3 s at 339 PoPs) is measured in a
   fresh subprocess with the on-disk caches warm (RTT matrices and placement: a second run of a scenario), and
   cold (both empty).
2. Routing: the control plane's decision time per request during the default run (edge and central; p50, p99,
   p99.9; goal p99 <= 50 us) and with every slot busy (the synthetic 339-site fleet of bench_controlplane;
   p50, p99, p99.9; goal p99 <= 200 us).
3. Cost per request with 3,000 PoPs vs 300 (synthetic PoPs at population-weighted cities), set-up amortised over
   200k requests (goal <= 1.5x), and the set-up time at 3,000 PoPs (goal <= 30 s); with the RTT matrices from the
   disk cache, and both with greedy placement computed (``cost_ratio_3000_vs_300_pops``) and with it read from
   the placement cache (``..._placement_cached``: a second run of the same workload, as in a sweep over seeds,
   routers or techniques); each configuration's cheapest of two runs, the sizes interleaved. ``cpu_cost_ratio_*``:
   the same ratios from each run's CPU time (set-up and simulation, one process), which other processes' load on a
   shared machine moves far less than wall time.
4. ``edgepop simulate --requests 1000000`` with all outputs in a subprocess: peak RSS (goal <= 1.5 GB) and the time
   of all plots (goal <= 3 s); and the Quick start's ``edgepop simulate`` wall time (goal <= 20 s).
5. Start-up: a fresh interpreter's ``edgepop --help`` (``cli_help_s``) and ``import sim.run``
   (``import_simulator_s``), the best of three each: paid by every command and every spawned sweep worker. And
   a small run's fixed cost: ``run_scenario("small", requests=300)`` in one process after a first run, the best
   of three (``small_run_s``; its simulation loops take a few per cent of it): what a sweep, a sensitivity
   table or a frontier pays per variant on top of simulating it.
6. The machine: how fast a fresh process first writes 256 MB of new numpy array (``first_touch_gb_s``, the
   slowest and fastest of three interpreters, just before the set-up runs). A virtual machine whose host backs
   guest memory lazily runs this at a fraction of a GB/s in some minutes and several GB/s in others; the set-up
   figures, the 3,000-PoP ones most (they touch tens of MB more), move with it.
Machines are noisy: compare the ratios, which are measured in one process. The last line printed is one JSON
object.
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

from edgepop.argtypes import json_line

REPEATS = 2  # runs of each simulation loop and of the bare M/M/c; the best of each is kept


def bare_simpy_mmc(n: int, c: int = 64, lam: float = 500.0, mu: float = 10.0, seed: int = 0) -> float:
    """Wall seconds for a textbook SimPy M/M/c of ``n`` requests."""
    rng = np.random.default_rng(seed)
    gaps, services = rng.exponential(1 / lam, n).tolist(), rng.exponential(1 / mu, n).tolist()
    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=c)

    def customer(service):
        with servers.request() as req:
            yield req
            yield env.timeout(service)

    def source():
        for gap, service in zip(gaps, services, strict=True):
            yield env.timeout(gap)
            env.process(customer(service))

    t0 = time.perf_counter()
    env.process(source())
    env.run()
    return time.perf_counter() - t0


def timed_submits(plane) -> list[int]:
    """Wrap ``plane.submit`` to record each decision's duration (ns)."""
    original, out, clock = plane.submit, [], time.perf_counter_ns

    def submit(req, now):
        t = clock()
        d = original(req, now)
        out.append(clock() - t)
        return d

    plane.submit = submit
    return out


class counted_hops:
    """Count the requests that travel to their replica (a timer event each: the backbone hop) while active, and
    the events the simulation scheduled in all (``events``: its environment's event counter after the run)."""

    def __enter__(self):
        from sim.simulator import Simulation

        self.original, self.original_run, self.count, self.events = Simulation._reach_node, Simulation.run, 0, 0

        def reach(sim, ev):
            self.count += 1
            return self.original(sim, ev)

        def run(sim):
            result = self.original_run(sim)
            self.events += next(sim.env._eid)  # ids are drawn 0, 1, 2, ... once per scheduled event
            return result

        Simulation._reach_node, Simulation.run = reach, run
        return self

    def __exit__(self, *exc):
        from sim.simulator import Simulation

        Simulation._reach_node, Simulation.run = self.original, self.original_run


def default_run(requests: int | None) -> dict:
    """The default scenario, both deployments, with its loops' rates, routing percentiles and the bare ratio."""
    from sim.run import prepare, scenario_deployment, simulate_deployment, with_run_overrides
    from sim.scenario import load_scenario

    t0 = time.perf_counter()
    sc = with_run_overrides(load_scenario("default"), requests=requests)
    setup = prepare(sc)
    out, best = {}, {}
    n = len(setup.frame)
    wall = None
    # Each loop and the bare M/M/c run REPEATS times, interleaved, and each keeps its best time (as timeit does):
    # a transient slowdown of a shared machine then hits neither side of the ratio.
    for _ in range(REPEATS):
        for name in ("edge", "central"):
            r = simulate_deployment(setup, name)
            best[name] = min(best.get(name, np.inf), r.stats["sim_wall_s"])
            out.setdefault(f"{name}_placement_from_cache", r.stats["placement_from_cache"])  # the first pass's
            del r
        if wall is None:
            wall = time.perf_counter() - t0  # the first pass: set-up and both deployments, as run_scenario
        best["bare"] = min(best.get("bare", np.inf), bare_simpy_mmc(2 * n))
    for name in ("edge", "central"):
        out[f"{name}_loop_rps"] = round(n / best[name], 1)
    loops = best["edge"] + best["central"]
    for name in ("edge", "central"):  # the same runs again, each routing decision timed (the timing costs time)
        dep = scenario_deployment(setup, name)
        decisions = timed_submits(dep.plane)
        with counted_hops() as hops:
            simulate_deployment(setup, name, dep=dep)
        out[f"{name}_hop_events_per_request"] = round(hops.count / n, 3)
        out[f"{name}_events_per_request"] = round(hops.events / n, 3)
        out[f"{name}_loop_us_per_event"] = round(1e6 * best[name] / hops.events, 3)
        ns = np.asarray(decisions) / 1e3
        for q in (50, 99, 99.9):
            out[f"route_{name}_p{q:g}_us"] = round(float(np.percentile(ns, q)), 2)
    bare_rps = 2 * n / best["bare"]
    out.update({"requests": n, "bare_simpy_mmc_rps": round(bare_rps, 1),
                "ratio_loop": round(2 * n / loops / bare_rps, 3), "ratio_run_scenario": round(2 * n / wall / bare_rps, 3),
                "run_scenario_wall_s": round(wall, 2)})
    return out


def child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pop_scaling(big: int, n: int, cache: str) -> dict:
    """Cost per request (set-up + simulation over ``n`` requests) at ``big`` PoPs vs 300, placement computed and
    cached. Each configuration runs ``REPEATS`` times, the sizes interleaved, keeping each one's cheapest run: a
    2-core machine's load drifts over the minutes this takes, and a drift between the 300- and the ``big``-PoP
    runs would otherwise be read as a scaling cost."""
    import shutil

    per: dict[tuple[int, bool], float] = {}
    per_cpu: dict[tuple[int, bool], float] = {}
    out: dict = {}
    for pops in (300, big):
        child(["--child-setup", str(pops), "2000", cache])  # fills the matrix cache for this topology
    for _ in range(REPEATS):
        for pops in (300, big):
            shutil.rmtree(Path(cache) / "placement", ignore_errors=True)
            r = child(["--child-setup", str(pops), str(n), cache])  # greedy placement computed (a new workload)
            c = child(["--child-setup", str(pops), str(n), cache])  # the same run again: the placement from the cache
            for run, cached in ((r, False), (c, True)):
                per_cpu[pops, cached] = min(per_cpu.get((pops, cached), float("inf")), run["cpu_s"] / run["requests"])
                cost = (run["simulate_s"] + run["setup_s"]) / run["requests"]
                if cost < per.get((pops, cached), float("inf")):
                    per[pops, cached] = cost
                    suffix = "_placement_cached" if cached else ""
                    out[f"setup_s_{pops}_pops{suffix}"] = run["setup_s"]
                    if not cached:
                        out[f"us_per_request_{pops}_pops"] = run["us_per_request"]
    out[f"cost_ratio_{big}_vs_300_pops"] = round(per[big, False] / per[300, False], 3)
    out[f"cost_ratio_{big}_vs_300_pops_placement_cached"] = round(per[big, True] / per[300, True], 3)
    out[f"cpu_cost_ratio_{big}_vs_300_pops"] = round(per_cpu[big, False] / per_cpu[300, False], 3)
    out[f"cpu_cost_ratio_{big}_vs_300_pops_placement_cached"] = round(per_cpu[big, True] / per_cpu[300, True], 3)
    return out


def child_setup(n_pops: int, n: int, cache: str) -> None:
    """Subprocess: set-up and simulation of the edge deployment (``cache``: a folder, or "off")."""
    import os

    if cache == "off":
        os.environ["EDGEPOP_NO_CACHE"] = "1"
    else:
        os.environ["EDGEPOP_CACHE_DIR"] = cache
    from sim.run import run_scenario

    t0, c0 = time.perf_counter(), time.process_time()
    topo = synthetic_topology(n_pops) if n_pops else None
    topo_s = time.perf_counter() - t0
    out = run_scenario("default", requests=n, deployments=("edge",), topo=topo)
    cpu_s = time.process_time() - c0  # this process's CPU time: what other processes' load changes least
    p = out.summary["performance"]
    print(json.dumps({"pops": n_pops or 339, "requests": n, "setup_s": round(p["setup_s"] + topo_s, 2),
                      "simulate_s": p["simulate_s"], "us_per_request": round(1e6 * p["simulate_s"] / n, 2),
                      "cpu_s": round(cpu_s, 3)}))


def child_million(out_dir: str) -> None:
    """Subprocess: ``edgepop simulate --requests 1000000`` with all outputs; peak RSS and output times."""
    from sim.outputs import write_outputs
    from sim.run import run_scenario

    t0 = time.perf_counter()
    out = run_scenario("default", requests=1_000_000)
    write_outputs(out, out_dir)
    perf = out.summary["performance"]
    print(json.dumps({"wall_s": round(time.perf_counter() - t0, 2), "plots_s": perf["plots_s"],
                      "outputs_s": perf["outputs_s"],
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def synthetic_topology(n_pops: int):
    """The shipped topology with its PoP list replaced by ``n_pops`` population-weighted cities (each PoP's tier
    from its city's population by the shipped ladder: no ``tier`` column, which would be honoured)."""
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
                         "metro_pop": rows.population.to_numpy(), "cf_region": "",
                         "coord_source": "synthetic"})
    tmp = Path(tempfile.gettempdir()) / "edgepop-bench"
    tmp.mkdir(exist_ok=True)
    path = tmp / f"pops_{n_pops}.csv"
    pops.to_csv(path, index=False)
    return Topology.load(pops=path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50k default requests, 1,000 instead of 3,000 PoPs, "
                    "no million-request run")
    ap.add_argument("--child-setup", nargs=3, metavar=("POPS", "N", "CACHE"), help=argparse.SUPPRESS)
    ap.add_argument("--child-million", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_setup:
        child_setup(int(args.child_setup[0]), int(args.child_setup[1]), args.child_setup[2])
        return
    if args.child_million:
        child_million(args.child_million)
        return
    results = default_run(50_000 if args.quick else None)
    print(json.dumps(results))
    sys.path.insert(0, str(Path(__file__).parent))  # the sibling benchmark's synthetic fleet
    from bench_controlplane import bench_routing

    from topology import Topology

    topo = Topology.load()
    busy = bench_routing(topo, len(topo.pops), "nearest-with-capacity", 50_000, busy=1.0)
    results.update({"route_all_busy_p50_us": busy["p50_us"], "route_all_busy_p99_us": busy["p99_us"],
                    "route_all_busy_p99.9_us": busy["p99.9_us"]})
    results.update(first_touch())
    with tempfile.TemporaryDirectory() as cache:
        cold = child(["--child-setup", "0", "20000", cache])
        warm = child(["--child-setup", "0", "20000", cache])
        results.update({"setup_s_339_pops_cold_cache": cold["setup_s"], "setup_s_339_pops": warm["setup_s"]})
        big = 1000 if args.quick else 3000
        results.update(pop_scaling(big, 20_000 if args.quick else 200_000, cache))
    if not args.quick:
        with tempfile.TemporaryDirectory() as out:
            m = child(["--child-million", out])
        results.update({f"million_{k}": v for k, v in m.items()})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "edgepop", "simulate", "--out", out], capture_output=True, check=True)
    results["quick_start_simulate_s"] = round(time.perf_counter() - t0, 2)
    results.update(start_up())
    print(json_line(results))


def first_touch(repeats: int = 3, mb: int = 256) -> dict:
    """GB/s at which a fresh interpreter first writes ``mb`` MB of new numpy array: the slowest and fastest of
    ``repeats`` (what the machine charges a set-up for its large arrays' fresh pages, apart from the code)."""
    code = (f"import time, numpy as np; t = time.perf_counter(); a = np.ones({mb} * 2**17); "
            "print(time.perf_counter() - t)")
    rates = [mb / 1024 / float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True).stdout) for _ in range(repeats)]
    return {"first_touch_gb_s": [round(min(rates), 2), round(max(rates), 2)]}


def start_up(repeats: int = 3) -> dict:
    """Seconds a fresh interpreter takes to print ``edgepop --help`` and to import the simulator (what every
    command, and every spawned sweep worker, pays before its work starts); the best of ``repeats`` runs each."""
    runs = {"cli_help_s": [sys.executable, "-m", "edgepop", "--help"],
            "import_simulator_s": [sys.executable, "-c", "import sim.run"]}
    out = {}
    for name, argv in runs.items():
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            best = min(best, time.perf_counter() - t0)
        out[name] = round(best, 3)
    code = ("import time; from sim.run import run_scenario; run_scenario('small', requests=300); best = 1e9\n"
            "for _ in range(3):\n    t = time.perf_counter(); run_scenario('small', requests=300); "
            "best = min(best, time.perf_counter() - t)\nprint(best)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out["small_run_s"] = round(float(run.stdout.strip().splitlines()[-1]), 3)
    return out


if __name__ == "__main__":
    main()
