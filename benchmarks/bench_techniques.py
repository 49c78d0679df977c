"""Technique ablation benchmark: the embedded ``ablation`` scenario, baseline vs each serving technique alone.

    python benchmarks/bench_techniques.py [--requests N] [--seed S]

Runs :func:`sim.ablation.run_ablation` (same arrivals for every row, edge deployment only) and prints the table;
the last line printed is one JSON object: per technique TTFT p50/p95, TPOT p50, ITL p50/p99, E2E p50/p95 (ms),
batch completion p95 (s), GPUs placed, busy GPU-hours and the deltas vs the baseline (%), plus the wall time.
Rows whose machinery is not in this build (prefix caching, LoRA before their merge) appear with a note only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.ablation import print_table, run_ablation  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=None, help="override the scenario's request count")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    sc = load_scenario("ablation")
    t0 = time.perf_counter()
    df = run_ablation(sc, requests=args.requests, seed=args.seed)
    wall = time.perf_counter() - t0
    print_table(df, "technique ablation (edge, same arrivals)")
    rows = {}
    for r in df.to_dict("records"):
        name = r.pop("technique")
        rows[name] = {k: v for k, v in r.items()
                      if v not in ("", None) and not (isinstance(v, float) and not math.isfinite(v))}
    print(json.dumps({"benchmark": "techniques", "scenario": sc.name,
                      "requests": int(df.requests.dropna().iloc[0]) if "requests" in df else None,
                      "wall_s": round(wall, 2), "rows": rows}))


if __name__ == "__main__":
    main()
