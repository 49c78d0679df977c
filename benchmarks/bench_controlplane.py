"""Control-plane benchmark: routing decision latency at the shipped 339 sites and 3,000 PoPs; placement solve time
and quality.

    python benchmarks/bench_controlplane.py [--quick]

Routing: a fleet with one 8-GPU node per site, every site hosting the chat model and an embedding model; requests
from population-weighted ingresses; running requests finish at random so replicas sit near 80% busy and some
decisions must spill over or queue. Candidate lists are precomputed (as a deployment would at start-up), so the
figures are per-decision costs (``latency-load`` and ``least-ttft`` without service-time estimates, which this
fleet's control plane has none of: their scans, not their predictions). Goal: p99 <= 50 us at the 339 sites.
Placement figures come from ``benchmarks/placement_figures.py`` (ILP solve time on the full topology, 339 PoP sites
of which 338 are ingress PoPs, x 20 models; greedy vs ILP objective). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd

from controlplane.catalog import default_catalog
from controlplane.fleet import Fleet
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.state import Request
from edgepop.argtypes import json_line
from topology import Topology, fibre_rtt_ms, haversine_km

CHAT, EMBED = "@cf/meta/llama-3.1-8b-instruct", "@cf/baai/bge-base-en-v1.5"


def synthetic_world(topo: Topology, n_sites: int, rng: np.random.Generator):
    """``n_sites`` sites at population-weighted cities (the real PoPs when n_sites == len(pops))."""
    if n_sites == len(topo.pops):
        lat, lon = topo.pops.lat.to_numpy(), topo.pops.lon.to_numpy()
    else:
        d = topo.demand
        pick = rng.choice(len(d), size=n_sites, replace=False, p=d.weight.to_numpy())
        lat, lon = d.lat.to_numpy()[pick], d.lon.to_numpy()[pick]
    km = haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    rtt = np.where(km < 1.0, 0.0, 2.0 + 1.5 * fibre_rtt_ms(km))  # path inflation ~1.5 over the great circle
    nodes = pd.DataFrame({"node_id": [f"N{i}" for i in range(n_sites)], "site_id": [f"S{i}" for i in range(n_sites)],
                          "site": np.arange(n_sites), "gpu": "H100", "gpus": 8, "gpu_memory_gb": 80.0})
    nodes["memory_gb"], nodes["price_usd_hr"] = 640.0, 24.0
    sites = pd.DataFrame({"site_id": nodes.site_id, "backbone": np.arange(n_sites), "lat": lat, "lon": lon,
                          "tz": "UTC", "continent": ""})
    return Fleet(f"synthetic-{n_sites}", nodes, sites), rtt


def bench_routing(topo, n_sites: int, router: str, decisions: int, seed: int = 0, busy: float = 0.8) -> dict:
    rng = np.random.default_rng(seed)
    fleet, rtt = synthetic_world(topo, n_sites, rng)
    table = pd.DataFrame({"model": [CHAT] * n_sites + [EMBED] * n_sites, "node": list(range(n_sites)) * 2})
    cp = ControlPlane(default_catalog(), fleet, table, rtt, router=router, rng=np.random.default_rng(seed),
                      admission=AdmissionConfig(queue_limit=16))
    t0 = time.perf_counter()
    cp.state.precompute()
    precompute_s = time.perf_counter() - t0
    # Ingress weights: more traffic from the first sites (population-weighted picks come first).
    w = 1.0 / (1.0 + np.arange(n_sites)) ** 0.6
    ingress = rng.choice(n_sites, size=decisions, p=w / w.sum())
    models = np.where(rng.random(decisions) < 0.7, CHAT, EMBED)
    running: dict[str, list[Request]] = {CHAT: [], EMBED: []}
    target = {m: int(busy * default_catalog()[m].max_batch * n_sites) for m in running}  # share of slots busy
    ns = np.empty(decisions, dtype=np.int64)
    clock = time.perf_counter_ns
    for k in range(decisions):
        req = Request(k, str(models[k]), int(ingress[k]), 400, 100)
        t = clock()
        d = cp.submit(req, 0.0)
        ns[k] = clock() - t
        run = running[req.model]
        if d.action == "start":
            run.append(req)
        while len(run) > target[req.model]:  # finish a random running request (swap-remove)
            j = int(rng.integers(len(run)))
            run[j], run[-1] = run[-1], run[j]
            run += cp.finish(run.pop(), 0.0)
    warm = ns[decisions // 10:] / 1e3  # skip the fill-up phase
    return {"sites": n_sites, "router": router, "busy": busy, "p50_us": round(float(np.percentile(warm, 50)), 2),
            "p99_us": round(float(np.percentile(warm, 99)), 2), "p99.9_us": round(float(np.percentile(warm, 99.9)), 2),
            "mean_us": round(float(warm.mean()), 2),
            "precompute_s": round(precompute_s, 2),
            **{f"n_{k}": v for k, v in cp.counts.items() if not k.endswith("_loads")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer routing decisions; placement with 8 models at "
                    "5,000 req/s")
    args = ap.parse_args()
    topo = Topology.load()
    n = 50_000 if args.quick else 200_000
    results = {}
    for router in ("nearest-with-capacity", "p2c", "latency-load", "least-ttft", "session-affinity"):
        r = bench_routing(topo, len(topo.pops), router, n)
        print(json.dumps(r))
        results[f"route_{router}_p99_us_339"] = r["p99_us"]
        results[f"route_{router}_p50_us_339"] = r["p50_us"]
    r = bench_routing(topo, len(topo.pops), "nearest-with-capacity", n, busy=1.0)  # overload: every slot busy
    print(json.dumps(r))
    results["route_nearest_p50_us_339_overload"], results["route_nearest_p99_us_339_overload"] = r["p50_us"], r["p99_us"]
    results["route_nearest_p99.9_us_339_overload"] = r["p99.9_us"]
    r = bench_routing(topo, 3000, "nearest-with-capacity", n)
    print(json.dumps(r))
    results["route_nearest_p50_us_3000"], results["route_nearest_p99_us_3000"] = r["p50_us"], r["p99_us"]
    results["route_p99_goal_met_339"] = results["route_nearest-with-capacity_p99_us_339"] <= 50
    try:
        from placement_figures import run as placement_run
    except ImportError:
        print("placement figures unavailable (benchmarks/placement_figures.py missing)", file=sys.stderr)
    else:
        results.update(placement_run(args.quick))
    print(json_line(results))


if __name__ == "__main__":
    main()
