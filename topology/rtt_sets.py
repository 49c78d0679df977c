"""Measured round-trip-time sets that the WAN latency model is calibrated on and judged against.

Each set is a published matrix of RTTs between a provider's regions (see ``data/ATTRIBUTION.md``) plus the
city-centre coordinates and continent of every region. :func:`load_pairs` turns a set into one row per
unordered region pair (the two directions averaged), with the great-circle distance, which is what the
calibration and ``edgepop validate`` work on.

``fitted`` says whether the calibration uses the set. An earlier month of a network that is already fitted is
shipped and reported, but not fitted again (it would count the same paths twice). Google Cloud's table is
reported, not fitted: its short paths run 30-50% faster than Azure's and IBM's at the same distance (Google's
private backbone between its own regions), and the model stands for paths between user cities, PoPs and cloud
regions, which the held-out city-pair pings the model was first judged on show to be slower still on short
paths. Fitting it is a one-line change; docs/fidelity-models.md gives what it would do.

AWS's set (cloudping.co) is fitted: on the same metro pairs (both ends within 60 km) its RTTs match Azure's
below 2,000 km (median ratio 0.99 on 8 pairs under 500 km, 1.01 on 14 from 500 to 2,000 km) where Google's
are 28% and 14% lower, and run 5-6% above Azure's on longer paths (different cable routes). It measures a TCP
connect (one round trip) from a Lambda function to the other region's DynamoDB endpoint; the probe's own fixed
cost, which its same-region cells bound (median 3.0 ms, 1.2-8.2), is of the order of the model's per-path term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError
from topology.geo import haversine_km
from topology.tables import DATA_DIR

# Distance bands of the fidelity tables (km, great circle).
BANDS = ((0.0, 500.0, "<500 km"), (500.0, 2000.0, "500-2,000 km"), (2000.0, 6000.0, "2,000-6,000 km"),
         (6000.0, float("inf"), ">6,000 km"))
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania",
              "SA": "South America"}


@dataclass(frozen=True)
class RttSet:
    """One shipped measurement set: its matrix file, the coordinates file and what the numbers are."""

    name: str
    provider: str
    matrix_file: str
    coords_file: str
    statistic: str
    fitted: bool = True


SETS = {s.name: s for s in (
    RttSet("azure-2026", "azure", "azure_interregion_p50_rtt_ms.csv", "azure_region_coords.csv",
           "P50 of 1-minute probes between Azure regions over 30 days ending 2026-07-30"),
    RttSet("ibm-2026", "ibm", "ibm_interregion_rtt_ms_2026.csv", "ibm_region_coords.csv",
           "mean RTT between IBM Cloud VPC regions over 30 days ending 2026-08-16"),
    RttSet("aws-2025", "aws", "aws_interregion_p50_rtt_ms.csv", "aws_region_coords.csv",
           "median TCP-connect time between AWS regions (Lambda to DynamoDB endpoint, 4 runs a day) over the year "
           "before 2025-05-29, cloudping.co"),
    RttSet("gcp-2023", "gcp", "gcp_interregion_median_rtt_ms.csv", "gcp_region_coords.csv",
           "median RTT between Google Cloud regions over 4 hours, Network Intelligence Center dashboard, "
           "2023-11-27 (a private backbone faster on short paths than the others: reported, not fitted)",
           fitted=False),
    RttSet("ibm-2024", "ibm", "ibm_interregion_rtt_ms.csv", "ibm_region_coords.csv",
           "mean RTT between IBM Cloud VPC regions, 2024-02-03 to 2024-03-03 (same network as ibm-2026: "
           "reported, not fitted)", fitted=False),
)}


def distance_band(km) -> np.ndarray:
    """The label of :data:`BANDS` each distance falls in."""
    km = np.asarray(km, dtype=float)
    labels = np.empty(km.shape, dtype=object)
    for lo, hi, label in BANDS:
        labels[(km >= lo) & (km < hi)] = label
    return labels


def load_pairs(name: str) -> pd.DataFrame:
    """Set ``name`` as unordered pairs: set, provider, a, b, lat_a, lon_a, lat_b, lon_b, continent_a,
    continent_b, km, band, rtt_ms (mean of the directions published)."""
    try:
        spec = SETS[name]
    except KeyError:
        raise DataFileError(name, None, None, f"unknown RTT set (known: {', '.join(SETS)})") from None
    path = DATA_DIR / spec.matrix_file
    raw = pd.read_csv(path, comment="#", index_col=0)
    coords = pd.read_csv(DATA_DIR / spec.coords_file, keep_default_na=False).set_index("name")  # "NA": North America
    names = list(raw.index)
    missing = [n for n in names if n not in coords.index]
    if missing or list(raw.columns) != names:
        raise DataFileError(path, None, None, f"matrix rows and columns must name the same regions, all in "
                                              f"{spec.coords_file} (missing: {missing})")
    # Every pair once (row before column, in table order), the mean of the directions published; a pair
    # published in neither direction is left out.
    m = raw.to_numpy(dtype=np.float64)
    i, j = np.triu_indices(len(names), 1)
    there, back = m[i, j], m[j, i]
    keep = ~(np.isnan(there) & np.isnan(back))
    i, j, there, back = i[keep], j[keep], there[keep], back[keep]
    rtt = np.where(np.isnan(there), back, np.where(np.isnan(back), there, (there + back) / 2))
    at = coords.loc[names]
    lat, lon, continent, label = (at.lat.to_numpy(dtype=np.float64), at.lon.to_numpy(dtype=np.float64),
                                  at.continent.to_numpy(dtype=object), np.array(names, dtype=object))
    out = pd.DataFrame({"set": [spec.name] * len(i), "provider": [spec.provider] * len(i), "a": label[i],
                        "b": label[j], "lat_a": lat[i], "lon_a": lon[i], "lat_b": lat[j], "lon_b": lon[j],
                        "continent_a": continent[i], "continent_b": continent[j], "rtt_ms": rtt})
    out["km"] = haversine_km(out.lat_a, out.lon_a, out.lat_b, out.lon_b)
    out["band"] = distance_band(out.km)
    return out


def load_all(names=None, fitted_only: bool = False) -> pd.DataFrame:
    """Several sets stacked (all shipped sets by default)."""
    names = list(names or SETS)
    if fitted_only:
        names = [n for n in names if SETS[n].fitted]
    return pd.concat([load_pairs(n) for n in names], ignore_index=True)


def load_history() -> pd.DataFrame:
    """IBM region pairs with the min / mean / max of their 30-day average RTT over three years (ms)."""
    hist = pd.read_csv(DATA_DIR / "ibm_rtt_history.csv", comment="#")
    coords = pd.read_csv(DATA_DIR / "ibm_region_coords.csv").set_index("name")
    hist["km"] = haversine_km(coords.loc[hist.a, "lat"].to_numpy(), coords.loc[hist.a, "lon"].to_numpy(),
                              coords.loc[hist.b, "lat"].to_numpy(), coords.loc[hist.b, "lon"].to_numpy())
    return hist
