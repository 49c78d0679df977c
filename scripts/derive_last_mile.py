"""Derive ``topology/data/last_mile_ms.csv`` (access-network RTT by country) from M-Lab's NDT aggregates.

Run once by a maintainer when the source changes (the package never reads the source at run time)::

    python scripts/derive_last_mile.py --iqb-repo PATH_TO_A_CLONE_OF_m-lab/iqb

The source is the Internet Quality Barometer's per-country aggregates of M-Lab NDT download tests for one
month (``prototype/cache/v0/<cc>_<yyyy>_<mm>.json``): percentiles of ``a.MinRTT``, the smallest round-trip
time of each test between the user's device and the nearest M-Lab server (a well-connected data centre,
usually in the user's metro or country). The median of it is what a typical user adds, on top of the core
path, before reaching a data centre. Countries with fewer than ``MIN_SAMPLES`` tests are left out (their
users fall back to their continent's figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "topology" / "data" / "last_mile_ms.csv"
MONTH = "2025_10"
MIN_SAMPLES = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iqb-repo", type=Path, required=True, help="a git clone of m-lab/iqb")
    args = ap.parse_args()
    repo = str(args.iqb_repo)
    commit = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H"], capture_output=True, text=True,
                            check=True).stdout.strip()
    names = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", "HEAD", "prototype/cache/v0/"],
                           capture_output=True, text=True, check=True).stdout.split()
    rows = []
    for name in sorted(n for n in names if n.endswith(f"_{MONTH}.json")):
        doc = json.loads(subprocess.run(["git", "-C", repo, "show", f"HEAD:{name}"], capture_output=True,
                                        text=True, check=True).stdout)
        samples = int(doc["sample_counts"]["downloads"])
        if samples < MIN_SAMPLES:
            continue
        # The aggregates rank percentiles by quality: the "p50" of latency is the median either way.
        rows.append((Path(name).name[:2].upper(), round(float(doc["metrics"]["latency_ms"]["p50"]), 2), samples))
    frame = pd.DataFrame(rows, columns=["cc", "median_ms", "tests"])
    with open(OUT, "w") as f:
        f.write(f"# Median minimum RTT (ms) of M-Lab NDT download tests by client country, October 2025, "
                f"from m-lab/iqb prototype/cache/v0/*_{MONTH}.json @ {commit[:8]}; countries with >= "
                f"{MIN_SAMPLES} tests\n")
        frame.to_csv(f, index=False)
    print(f"{len(frame)} countries")


if __name__ == "__main__":
    main()
