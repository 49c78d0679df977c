"""Benchmark: generate 1,000,000 Poisson requests (default mix, diurnal curve), with and without chat sessions;
replay the shipped Azure trace; write and read the workload as parquet.

Run: python benchmarks/bench_workload.py [--requests N] [--repeat R]. The last line printed is one JSON object.
Times are the best of ``--repeat`` runs after a first run that also fills the per-topology city/ingress cache.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from edgepop.argtypes import json_line, positive_int
from edgepop.rng import seed_arg


def best_of(repeat: int, fn):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def at_least_50(text: str) -> int:
    n = positive_int(text)
    if n < 50:
        raise argparse.ArgumentTypeError(f"must be at least 50 (the session workload's warm-up), got {n}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=at_least_50, default=1_000_000,
                    help="requests per workload, >= 50 (the session workload warms up 50 requests; default 1M)")
    ap.add_argument("--repeat", type=positive_int, default=3, help="timed runs, the best kept (default 3)")
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args()

    from sim.workload import Workload, generate
    from sim.workload_config import WorkloadConfig
    from topology import Topology

    topo = Topology.load()
    t = time.perf_counter()
    generate(WorkloadConfig.from_dict({"requests": 10}), topo, rng=args.seed)
    first_call_s = time.perf_counter() - t  # includes the city -> ingress table (once per topology)

    plain = WorkloadConfig.from_dict({"requests": args.requests, "rps": 1000.0})
    sessions = WorkloadConfig.from_dict({"requests": args.requests, "rps": 1000.0, "session_fraction": 0.5,
                                         "day_compression": 3600.0})
    azure = WorkloadConfig.from_dict({"kind": "azure"})
    plain_s, w = best_of(args.repeat, lambda: generate(plain, topo, rng=args.seed))
    sessions_s, ws = best_of(args.repeat, lambda: generate(sessions, topo, rng=args.seed))
    azure_s, wa = best_of(args.repeat, lambda: generate(azure, topo, rng=args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.parquet"
        write_s, _ = best_of(1, lambda: w.to_parquet(path))
        size_mb = path.stat().st_size / 2**20
        read_s, back = best_of(1, lambda: Workload.from_parquet(path))
    assert len(back) == len(w)
    gen = ws.requests[ws.requests.task == "text-generation"]
    out = {
        "requests": len(w),
        "first_call_with_ingress_cache_s": round(first_call_s, 3),
        "poisson_s": round(plain_s, 3),
        "poisson_requests_per_s": round(len(w) / plain_s),
        "poisson_sessions_s": round(sessions_s, 3),
        "poisson_sessions_requests_per_s": round(len(ws) / sessions_s),
        "session_share_of_llm_requests": round(float((gen.session_id >= 0).mean()), 3),
        "azure_replay_requests": len(wa),
        "azure_replay_s": round(azure_s, 3),
        "parquet_write_s": round(write_s, 3),
        "parquet_read_s": round(read_s, 3),
        "parquet_mb": round(size_mb, 1),
        "process_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json_line(out))


if __name__ == "__main__":
    main()
