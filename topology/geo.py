"""Geodesy and physical constants used by the latency model."""

from __future__ import annotations

import numpy as np

EARTH_RADIUS_KM = 6371.0088
# Light in silica fibre travels at ~c/1.47, i.e. about 204 km per millisecond; 200 is the usual round figure.
FIBRE_KM_PER_MS = 200.0


def haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance in km; broadcasts over numpy arrays."""
    p1 = np.radians(np.asarray(lat1, dtype=np.float64))
    p2 = np.radians(np.asarray(lat2, dtype=np.float64))
    dlmb = np.radians(np.asarray(lon2, dtype=np.float64) - np.asarray(lon1, dtype=np.float64))
    a = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def pairwise_km(lat_a, lon_a, lat_b, lon_b) -> np.ndarray:
    """Distance matrix (len(a) x len(b)) in km."""
    la = np.asarray(lat_a, dtype=np.float64)[:, None]
    oa = np.asarray(lon_a, dtype=np.float64)[:, None]
    return haversine_km(la, oa, np.asarray(lat_b)[None, :], np.asarray(lon_b)[None, :])


def fibre_rtt_ms(km) -> np.ndarray:
    """Round-trip time over a straight fibre of this length: the physical lower bound for a path."""
    return 2.0 * np.asarray(km, dtype=np.float64) / FIBRE_KM_PER_MS
