"""Geodesy and physical constants used by the latency model."""

from __future__ import annotations

import numpy as np

# Continent codes of the PoP, region and demand tables (here, a leaf module, so the tables' modules can share it
# without importing each other).
CONTINENTS = {"AF": "Africa", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania",
              "SA": "South America", "AN": "Antarctica"}

EARTH_RADIUS_KM = 6371.0088
# Light in silica fibre travels at ~c/1.47, i.e. about 204 km per millisecond; 200 is the usual round figure.
FIBRE_KM_PER_MS = 200.0
# Cells per block when a large points x nodes matrix is worked through a block of rows at a time: temporaries of
# about 8 MB, which the allocator reuses from one block to the next (blocks of 26-66 MB were fresh pages each time,
# faulted in at about the cost of the arithmetic).
BLOCK_CELLS = 1 << 20


def haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance in km; broadcasts over numpy arrays."""
    p1 = np.radians(np.asarray(lat1, dtype=np.float64))
    p2 = np.radians(np.asarray(lat2, dtype=np.float64))
    dlmb = np.radians(np.asarray(lon2, dtype=np.float64) - np.asarray(lon1, dtype=np.float64))
    a = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def pairwise_km(lat_a, lon_a, lat_b, lon_b, rows: int = 512) -> np.ndarray:
    """Distance matrix (len(a) x len(b)) in km: bit for bit :func:`haversine_km` over the broadcast pairs.

    The same operations in the same order, but ``rows`` rows at a time into the output and one scratch block, and
    the per-point cosines once per point: the large matrices (tens of thousands of cities x backbone nodes) then
    allocate no full-size temporaries, whose page faults cost as much as the arithmetic."""
    la = np.radians(np.asarray(lat_a, dtype=np.float64))[:, None]
    oa = np.asarray(lon_a, dtype=np.float64)[:, None]
    lb = np.radians(np.asarray(lat_b, dtype=np.float64))[None, :]
    ob = np.asarray(lon_b, dtype=np.float64)[None, :]
    cos_a, cos_b = np.cos(la), np.cos(lb)
    out = np.empty((la.shape[0], lb.shape[1]))
    scratch = np.empty((min(rows, la.shape[0]), lb.shape[1]))
    for s in range(0, la.shape[0], rows):
        d, u = out[s:s + rows], scratch[:min(rows, la.shape[0] - s)]
        np.subtract(ob, oa[s:s + rows], out=d)  # cos(p1) cos(p2) sin^2(dlon / 2)
        np.radians(d, out=d)
        np.divide(d, 2, out=d)
        np.sin(d, out=d)
        np.square(d, out=d)
        np.multiply(cos_a[s:s + rows], cos_b, out=u)
        np.multiply(u, d, out=d)
        np.subtract(lb, la[s:s + rows], out=u)  # sin^2(dlat / 2)
        np.divide(u, 2, out=u)
        np.sin(u, out=u)
        np.square(u, out=u)
        np.add(u, d, out=d)
        np.clip(d, 0.0, 1.0, out=d)
        np.sqrt(d, out=d)
        np.arcsin(d, out=d)
        np.multiply(d, 2 * EARTH_RADIUS_KM, out=d)
    return out


def fibre_rtt_ms(km) -> np.ndarray:
    """Round-trip time over a straight fibre of this length: the physical lower bound for a path."""
    return 2.0 * np.asarray(km, dtype=np.float64) / FIBRE_KM_PER_MS
