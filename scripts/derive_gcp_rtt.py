"""Derive the Google Cloud inter-region RTT set shipped in ``topology/data/`` from its public source.

Run once by a maintainer (the package never reads the source at run time)::

    git -C CLONE_OF_ubc-cirrus-lab/caribou show 84ed945b:multi_x_serverless/global_routing/internal/trackers/data/gcp_rtt_latency_between_regions.html > gcp.html
    python scripts/derive_gcp_rtt.py --html gcp.html

The source is a snapshot (2023-11-27) of the heat map of Google Cloud's Network Intelligence Center performance
dashboard: the median RTT between Google Cloud regions over a 4-hour window, one cell per ordered region pair,
each labelled "A to B: N ms". Outputs (see topology/data/ATTRIBUTION.md):

* ``gcp_interregion_median_rtt_ms.csv``: the cells as a matrix (row = from, column = to), values verbatim;
* ``gcp_region_coords.csv``: each region's coordinates (``regions.csv``: the data-centre town Google names) and
  continent.

Regions without published coordinates (restricted regions the dashboard lists but ``regions.csv`` does not know)
are left out rather than placed by guess.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "topology" / "data"
SOURCE = ("ubc-cirrus-lab/caribou @ 84ed945b, multi_x_serverless/global_routing/internal/trackers/data/"
          "gcp_rtt_latency_between_regions.html: Google Cloud Network Intelligence Center performance dashboard, "
          "median RTT (ms) between Google Cloud regions over 4 hours, retrieved 2023-11-27")
CONTINENT = {"africa": "AF", "asia": "AS", "australia": "OC", "europe": "EU", "me": "AS", "northamerica": "NA",
             "southamerica": "SA", "us": "NA"}
COUNTRY = {"africa-south1": "ZA", "asia-east1": "TW", "asia-east2": "HK", "asia-northeast1": "JP",
           "asia-northeast2": "JP", "asia-northeast3": "KR", "asia-south1": "IN", "asia-south2": "IN",
           "asia-southeast1": "SG", "asia-southeast2": "ID", "australia-southeast1": "AU",
           "australia-southeast2": "AU", "europe-central2": "PL", "europe-north1": "FI", "europe-southwest1": "ES",
           "europe-west1": "BE", "europe-west10": "DE", "europe-west12": "IT", "europe-west2": "GB",
           "europe-west3": "DE", "europe-west4": "NL", "europe-west6": "CH", "europe-west8": "IT",
           "europe-west9": "FR", "me-central1": "QA", "me-central2": "SA", "me-west1": "IL",
           "northamerica-northeast1": "CA", "northamerica-northeast2": "CA", "southamerica-east1": "BR",
           "southamerica-west1": "CL"}
CELL = re.compile(r'aria-label="([a-z0-9-]+) to ([a-z0-9-]+): ([0-9.]+) ms')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", type=Path, required=True, help="the dashboard snapshot (see the module docstring)")
    args = ap.parse_args()
    cells = CELL.findall(args.html.read_text())
    if not cells:
        raise SystemExit(f"{args.html}: no 'A to B: N ms' cells found")
    regions = pd.read_csv(OUT / "regions.csv")
    gcp = regions[regions.provider == "gcp"].set_index("code")
    names = sorted({a for a, _, _ in cells} & set(gcp.index))
    dropped = sorted({a for a, _, _ in cells} - set(gcp.index))
    matrix = pd.DataFrame(index=names, columns=names, dtype=object)
    for a, b, ms in cells:
        if a in matrix.index and b in matrix.columns and a != b:
            matrix.loc[a, b] = ms  # verbatim text of the cell
    with open(OUT / "gcp_interregion_median_rtt_ms.csv", "w") as f:
        f.write(f"# Source: {SOURCE} (copied verbatim; row=from, col=to; regions without published "
                f"coordinates left out: {', '.join(dropped)})\n")
        matrix.rename_axis("from").to_csv(f)
    coords = pd.DataFrame({"name": names, "lat": gcp.loc[names, "lat"].to_numpy(),
                           "lon": gcp.loc[names, "lon"].to_numpy(),
                           "cc": [COUNTRY.get(n, "US") for n in names],
                           "continent": [CONTINENT[n.split("-")[0]] for n in names],
                           "coord_source": [f"regions.csv: {gcp.loc[n, 'name']}" for n in names]})
    coords.to_csv(OUT / "gcp_region_coords.csv", index=False)
    print(f"GCP: {len(names)} regions, {len(names) * (len(names) - 1)} directed pairs; left out {dropped}")


if __name__ == "__main__":
    main()
