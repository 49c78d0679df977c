"""Benchmark: user x site RTT matrix for 100k users x ~300 PoPs (time, memory), plus model build time.

Run: python benchmarks/bench_topology.py [--users N]. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

from edgepop.argtypes import json_line, positive_int
from edgepop.rng import seed_arg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # no users: no matrix to time and no nearest PoP to report
    ap.add_argument("--users", type=positive_int, default=100_000, help="simulated users (default 100,000)")
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    from topology import Topology

    topo = Topology.load()
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed)
    d = topo.demand
    users = rng.choice(len(d), size=args.users, p=d.weight.to_numpy())
    lat = d.lat.to_numpy()[users] + rng.normal(0, 0.2, args.users)
    lon = d.lon.to_numpy()[users] + rng.normal(0, 0.2, args.users)
    pops = topo.pops.iloc[:300]

    tracemalloc.start()
    t1 = time.perf_counter()
    m = topo.latency._site_rtt_matrix(lat, lon, np.arange(len(pops)))  # computed, not read from the cache
    matrix_s = time.perf_counter() - t1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    d_lat, d_lon = d.lat.to_numpy(), d.lon.to_numpy()
    t3 = time.perf_counter()
    topo.latency._site_rtt_matrix(d_lat, d_lon, topo.pop_nodes)
    cities_computed_s = time.perf_counter() - t3
    topo.latency.site_rtt_matrix(d_lat, d_lon, topo.pop_nodes)  # fills the disk cache if empty
    from topology.rtt_cache import clear_memory

    clear_memory()
    t4 = time.perf_counter()
    topo.latency.site_rtt_matrix(d_lat, d_lon, topo.pop_nodes)  # from disk
    cities_cached_s = time.perf_counter() - t4

    t2 = time.perf_counter()
    n_pairs = min(20_000, args.users)  # (fewer users: fewer pairs, and the rate divides by those)
    topo.core_rtt_ms(lat[:n_pairs], lon[:n_pairs], lat[-n_pairs:], lon[-n_pairs:])
    pairs_s = time.perf_counter() - t2
    out = {
        "users": args.users,
        "sites": int(m.shape[1]),
        "topology_load_s": round(build_s, 3),
        "matrix_s": round(matrix_s, 3),
        "matrix_cells_per_s": round(m.size / matrix_s),
        "matrix_mb": round(m.nbytes / 2**20, 1),
        "matrix_peak_traced_mb": round(peak / 2**20, 1),
        "process_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "core_rtt_pairs_per_s": round(n_pairs / pairs_s),
        "cities_x_pops_computed_s": round(cities_computed_s, 3),
        "cities_x_pops_from_disk_cache_s": round(cities_cached_s, 3),
        "median_user_to_nearest_pop_ms": round(float(np.median(m.min(axis=1))), 2),
    }
    print(json_line(out))


if __name__ == "__main__":
    main()
