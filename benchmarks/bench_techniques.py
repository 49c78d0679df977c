"""Technique ablation benchmark: the embedded ``ablation`` grid, baseline vs each serving technique alone.

    python benchmarks/bench_techniques.py [--requests N] [--workers W]

Runs :func:`sim.techniques.ablation.run_ablation` (the sweep machinery; same arrivals for every variant, edge
deployment only) and prints the table; the last line printed is one JSON object: per technique TTFT p50/p95,
TPOT p50, ITL p50/p99, E2E p50/p95 (ms), batch completion p95 (s), GPUs placed, busy GPU-hours and the deltas vs
the baseline (%), plus the wall time.
"""

from __future__ import annotations

import argparse
import math
import tempfile

from edgepop.argtypes import json_line, positive_int
from sim.techniques.ablation import print_table, run_ablation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=positive_int, default=None, help="override the grid's request count")
    ap.add_argument("--workers", type=positive_int, default=None, help="parallel variants (default: CPU count)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        df, result = run_ablation("ablation", requests=args.requests, workers=args.workers, out=out)
    print_table(df, "technique ablation (edge, same arrivals)")
    rows = {}
    for r in df.to_dict("records"):
        name = r.pop("technique")
        rows[name] = {k: v for k, v in r.items()
                      if v not in ("", None) and not (isinstance(v, float) and not math.isfinite(v))}
    print(json_line({"benchmark": "techniques", "grid": result.grid.source, "base": result.grid.base,
                      "requests": int(df.requests.iloc[0]), "wall_s": round(result.wall_s, 2), "rows": rows},
                     default=float))


if __name__ == "__main__":
    main()
