"""Where a client is, which PoP its packets enter (anycast), and the WAN delays the gateway injects.

The client's location comes from ``x-edgepop-client-location: lat,lon`` or ``x-edgepop-client-city: NAME`` (a
demand city of the topology, optionally ``NAME, CC``; the most populous match wins), else the configured default.
The ingress PoP and the access RTT (client -> ingress, last mile included) come from ``Topology.ingress``.

Delays follow the simulator's request path (``sim.simulator``): half the access RTT before the control plane
decides, half the backbone RTT to the serving site before the engine starts, and each response chunk leaves
one-way-back = (access + backbone) / 2 after it was produced.
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dataplane.gateway.config import parse_location
from dataplane.gateway.errors import bad_input
from edgepop.errors import UserError

LOCATION_HEADER = "x-edgepop-client-location"
CITY_HEADER = "x-edgepop-client-city"


def fold(name: str) -> str:
    """Lower-case ASCII form of a city name ("Nūrābād" -> "nurabad") for forgiving look-ups."""
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().strip().lower()


@dataclass(frozen=True)
class ClientPlace:
    """A client's location and its anycast entry point."""

    lat: float
    lon: float
    ingress: int  # row of topo.pops
    ingress_pop: str
    access_rtt_ms: float
    source: str  # "header", "city" or "default"


class ClientLocator:
    """Headers -> :class:`ClientPlace`, with the ingress computation cached per location."""

    def __init__(self, topo, default_location: tuple[float, float], cache_size: int = 65536):
        self.topo = topo
        self.default = default_location
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        d = topo.demand
        self._cities: dict[str, int] = {}
        order = np.argsort(-d.population.to_numpy(), kind="stable")  # most populous first wins a name
        names, ccs = d.name.to_numpy(), d.cc.to_numpy()
        for i in order.tolist():
            for key in (fold(names[i]), f"{fold(names[i])}, {str(ccs[i]).lower()}"):
                self._cities.setdefault(key, i)
        self._lat, self._lon = d.lat.to_numpy(), d.lon.to_numpy()

    def city(self, name: str) -> tuple[float, float]:
        """Coordinates of a demand city by name (``"Lagos"``, ``"Springfield, US"``)."""
        name = utf8_header(name)
        key = fold(name)
        key = ", ".join(p.strip() for p in key.split(",")) if "," in key else key
        i = self._cities.get(key)
        if i is None:
            raise bad_input(f"{CITY_HEADER}: unknown city {name!r} (a demand city of the topology, "
                            "optionally 'Name, CC')")
        return float(self._lat[i]), float(self._lon[i])

    def place(self, headers) -> ClientPlace:
        """The client's place from request headers (a bad header is a 400)."""
        loc, city = headers.get(LOCATION_HEADER), headers.get(CITY_HEADER)
        if loc is not None:
            try:
                lat, lon = parse_location(loc, LOCATION_HEADER)
            except UserError as exc:
                raise bad_input(str(exc)) from None
            return self.at(lat, lon, "header")
        if city is not None:
            return self.at(*self.city(city), "city")
        return self.at(*self.default, "default")

    def at(self, lat: float, lon: float, source: str = "header") -> ClientPlace:
        key = (round(lat, 4), round(lon, 4))
        hit = self._cache.get(key)
        if hit is None:
            idx, rtt = self.topo.ingress(np.array([lat]), np.array([lon]))
            row = int(idx[0])
            hit = (row, str(self.topo.pops.id.iloc[row]), float(rtt[0]))
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return ClientPlace(lat, lon, hit[0], hit[1], hit[2], source)


class Delays:
    """Injected WAN time: ``scale`` x the topology's figures (0 with ``--no-delay``)."""

    def __init__(self, enabled: bool, scale: float = 1.0):
        self.scale = scale if enabled else 0.0

    def seconds(self, ms: float) -> float:
        return ms * self.scale / 1e3

    async def sleep_ms(self, ms: float) -> float:
        """Sleep ``ms`` (scaled); returns the seconds actually slept."""
        s = self.seconds(ms)
        if s <= 0:
            return 0.0
        t0 = time.monotonic()
        await asyncio.sleep(s)
        return time.monotonic() - t0

    @staticmethod
    async def until(t: float) -> None:
        """Sleep until monotonic time ``t`` (no-op if it has passed)."""
        dt = t - time.monotonic()
        if dt > 0:
            await asyncio.sleep(dt)


def utf8_header(value: str) -> str:
    """A header value as the client wrote it: HTTP servers hand header bytes over as Latin-1, so "Zürich" sent as
    UTF-8 arrives as "ZÃ¼rich"; re-read as UTF-8 when that is what the bytes are."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value
