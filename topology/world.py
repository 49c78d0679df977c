"""The world an experiment runs in: PoPs, their GPU nodes, cloud regions, demand and the latency model."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from numbers import Real
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import UserError
from topology.demand import load_demand_points, weighted_demand
from topology.geo import BLOCK_CELLS
from topology.gpus import build_nodes, check_scale, load_gpus, scale_inventory
from topology.last_mile import LastMile
from topology.latency import LatencyModel, LatencyParams, build_backbone, site_table
from topology.latency import check_coords as _check_coords
from topology.pops import load_pops, load_tiers
from topology.regions import load_regions
from topology.rtt_cache import cached_argmin
from topology.tables import DATA_DIR

DEFAULT_LAST_MILE_MS = 10.0  # median fixed-broadband access RTT (fibre ~5 ms, cable ~15, DSL ~25)


@dataclass
class Topology:
    """PoPs, GPU nodes, regions, demand points and a latency model whose backbone holds every PoP and region."""

    pops: pd.DataFrame
    tiers: pd.DataFrame
    gpus: pd.DataFrame
    nodes: pd.DataFrame
    regions: pd.DataFrame
    demand: pd.DataFrame
    latency: LatencyModel
    last_mile_ms: float = DEFAULT_LAST_MILE_MS
    last_mile_mode: str = "fixed"
    anycast_misroute: float = 0.0  # share of user locations BGP lands on their second-best PoP (with_anycast)
    anycast_seed: int = 0
    demand_weight: str = "population"  # how ``demand``'s weights are set (topology.demand.DEMAND_WEIGHTS)

    @classmethod
    def load(cls, pops: str | Path | None = None, gpus: str | Path | None = None,
             regions: str | Path | None = None, tiers: str | Path | None = None,
             params: LatencyParams | None = None, min_population: int = 30_000,
             last_mile_ms: float = DEFAULT_LAST_MILE_MS, last_mile: str = "fixed") -> Topology:
        """Load the shipped tables, or custom files for any of them (each validated, nothing half-loaded).

        ``last_mile`` is the mode of :mod:`topology.last_mile` (``fixed`` uses ``last_mile_ms`` for everyone).
        """
        for name, value in (("pops", pops), ("gpus", gpus), ("regions", regions), ("tiers", tiers)):
            if value is not None and not isinstance(value, str | os.PathLike):
                raise UserError(f"Topology.load: {name} must be a file path or None, got {value!r}")
        if params is not None and not isinstance(params, LatencyParams):
            raise UserError(f"Topology.load: params must be a LatencyParams or None, got {params!r}")
        demand = load_demand_points(min_population)  # (a bad threshold fails here, before the slow work)
        tier_table = load_tiers(tiers)
        pop_table = load_pops(pops, tier_table)
        gpu_table = load_gpus(gpus)
        node_table = build_nodes(pop_table, tier_table, gpu_table, tiers or DATA_DIR / "tiers.csv",
                                 gpus or DATA_DIR / "gpus.csv")
        region_table = load_regions(regions)
        params = params or LatencyParams.load()
        sites = site_table(pop_table, region_table)
        model = LatencyModel(build_backbone(sites, params.knn, params.max_link_km), params)
        topo = cls(pop_table, tier_table, gpu_table, node_table, region_table,
                   demand, model, last_mile_ms, last_mile)
        topo.last_mile  # noqa: B018 -- an unknown mode fails here, before anything uses the topology
        return topo

    @property
    def last_mile(self) -> LastMile:
        """The last-mile model of this topology (its mode and fixed value)."""
        cached = getattr(self, "_last_mile_model", None)
        if cached is None or (cached.mode, cached.fixed_ms) != (self.last_mile_mode, self.last_mile_ms):
            cached = LastMile(self.last_mile_mode, self.last_mile_ms)
            self._last_mile_model = cached
        return cached

    def demand_last_mile_ms(self) -> np.ndarray:
        """Last-mile RTT (ms) of every demand city, by the topology's last-mile mode."""
        return self.last_mile.ms(self.demand.cc.to_numpy(), self.demand.continent.to_numpy())

    def shaped(self, last_mile_ms: float = DEFAULT_LAST_MILE_MS, last_mile: str = "fixed", gpu_scale: float = 1.0,
               misroute: float = 0.0, seed: int = 0, demand_weight: str = "population") -> Topology:
        """The world as a scenario (or a gateway serving one) shapes it: its last mile, its GPU inventory scale,
        its anycast misroute (seeded) and how its demand cities are weighted. The simulator, the gateway and the
        replay mirror all shape it here, so the three cannot drift apart."""
        return (self.with_last_mile(last_mile_ms, last_mile).with_gpu_scale(gpu_scale)
                .with_anycast(misroute, seed=seed).with_demand_weight(demand_weight))

    def with_demand_weight(self, mode: str) -> Topology:
        """The same world with its demand cities weighted by ``mode`` (``population``, or ``internet_users``: the
        people online in each, :func:`topology.demand.weighted_demand`); everything else is shared."""
        if mode == self.demand_weight:
            return self
        return replace(self, demand=weighted_demand(self.demand, mode), demand_weight=mode)

    def with_gpu_scale(self, scale: float) -> Topology:
        """The same world with ``scale`` x the GPU nodes in its PoPs (see :func:`topology.gpus.scale_inventory`);
        everything else (tables, latency model) is shared, so this is cheap."""
        check_scale(scale)  # (first: True == 1.0 would return the world unscaled)
        if scale == 1.0:
            return self
        return replace(self, nodes=scale_inventory(self.nodes, self.pops, scale))

    def with_last_mile(self, last_mile_ms: float, mode: str = "fixed") -> Topology:
        """The same world with another last mile (``mode`` of :mod:`topology.last_mile`; ``fixed`` uses
        ``last_mile_ms`` for everyone); everything else is shared."""
        if (last_mile_ms, mode) == (self.last_mile_ms, self.last_mile_mode):
            return self
        out = replace(self, last_mile_ms=last_mile_ms, last_mile_mode=mode)
        out.last_mile  # noqa: B018 -- a bad mode or value fails here, before anything uses the topology
        return out

    def with_anycast(self, misroute: float, seed: int = 0) -> Topology:
        """The same world with imperfect anycast: a ``misroute`` share of user locations enters at its
        second-lowest-RTT PoP instead of the lowest (Calder et al., IMC 2015: anycast sent roughly 20% of a large
        CDN's clients to a suboptimal front-end). Which locations is a seeded function of each one's coordinates,
        so the workload and the placement's demand forecast see the same catchments. 0: ideal anycast."""
        if isinstance(misroute, bool) or not (isinstance(misroute, Real) and 0.0 <= misroute <= 1.0):
            raise UserError(f"anycast misroute share must be in [0, 1], got {misroute!r}")
        if misroute == self.anycast_misroute and (misroute == 0 or seed == self.anycast_seed):
            return self
        return replace(self, anycast_misroute=float(misroute), anycast_seed=int(seed))

    # Sites are the first nodes of the backbone, PoPs first then regions, in table order.
    @property
    def pop_nodes(self) -> np.ndarray:
        return np.arange(len(self.pops))

    def region_nodes(self, region_ids) -> np.ndarray:
        """Backbone node indices of cloud regions by id (one id or a list of them)."""
        ids = [region_ids] if isinstance(region_ids, str) else list(region_ids)
        pos = {r: len(self.pops) + i for i, r in enumerate(self.regions.id)}
        unknown = [r for r in ids if r not in pos]
        if unknown:
            raise UserError(f"unknown region id(s): {', '.join(map(repr, unknown[:5]))} (topology/data/regions.csv "
                            "lists them)")
        return np.array([pos[r] for r in ids], dtype=np.int64)

    def core_rtt_ms(self, lat1, lon1, lat2, lon2):
        """Data-centre-to-data-centre RTT (ms) between coordinates (scalars or broadcastable arrays); see
        ``topology.latency``."""
        for lat, lon in ((lat1, lon1), (lat2, lon2)):
            _check_coords(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64), "core_rtt_ms")
        return self.latency.core_rtt_ms(lat1, lon1, lat2, lon2)

    def user_pop_rtt(self, lat, lon, last_mile_ms=None) -> np.ndarray:
        """users x PoPs RTT matrix (ms, float32) including each user's last mile (scalar or per-user array)."""
        lat, lon = _user_coords(lat, lon, "user_pop_rtt")
        m = self.latency.site_rtt_matrix(lat, lon, self.pop_nodes)
        return m + self._last_mile(last_mile_ms, lat, lon)

    def user_region_rtt(self, lat, lon, region_ids, last_mile_ms=None) -> np.ndarray:
        """users x regions RTT matrix (ms, float32) including the last mile."""
        lat, lon = _user_coords(lat, lon, "user_region_rtt")
        m = self.latency.site_rtt_matrix(lat, lon, self.region_nodes(region_ids))
        return m + self._last_mile(last_mile_ms, lat, lon)

    def _last_mile(self, value, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        """Each user's last mile as a column: ``value`` when given, else the topology's mode (a country's or
        continent's figure by the country of the user's nearest city, as the demand cities get theirs)."""
        if value is None and self.last_mile_mode != "fixed":
            from topology.borders import point_countries
            from topology.last_mile import country_continents

            cc = point_countries(lat, lon)
            of = country_continents()
            value = self.last_mile.ms(cc, np.array([of.get(c, "") for c in cc], dtype=object))
        lm = self.last_mile_ms if value is None else value
        return np.broadcast_to(np.asarray(lm, dtype=np.float32), (lat.shape[0],))[:, None]

    def ingress(self, lat, lon, last_mile_ms=None) -> tuple[np.ndarray, np.ndarray]:
        """Anycast ingress: index of the lowest-RTT PoP for each user, and that RTT in ms (with
        :meth:`with_anycast`, the second-lowest for the misrouted share of locations).

        The last answer is kept (placement and the workload both ask for every demand city: a users x PoPs pass,
        a second of work at thousands of PoPs); it is reused only for the same latency model, PoP count and
        query values. Large answers also come from the disk cache of :mod:`topology.rtt_cache`."""
        lat, lon = _user_coords(lat, lon, "ingress")
        lm = np.ascontiguousarray(self._last_mile(last_mile_ms, lat, lon)[:, 0])
        key = (len(self.pops), lat.tobytes(), lon.tobytes(), lm.tobytes(), self.anycast_misroute, self.anycast_seed)
        hit = getattr(self, "_ingress_memo", None)
        if hit is None or hit[0] is not self.latency or hit[1] != key:
            idx, rtt = cached_argmin(self.latency, lat, lon, self.pop_nodes, lm, lambda: self._ingress(lat, lon, lm))
            if self.anycast_misroute > 0 and len(self.pops) > 1:
                self._misroute(lat, lon, lm, idx, rtt)
            hit = self._ingress_memo = (self.latency, key, idx, rtt)
        return hit[2].copy(), hit[3].copy()

    def _misroute(self, lat, lon, lm, idx: np.ndarray, rtt: np.ndarray) -> None:
        """Move the misrouted locations' ingress (in place) to their second-lowest-RTT PoP."""
        sel = np.flatnonzero(location_hash(lat, lon, self.anycast_seed) < self.anycast_misroute)
        if not len(sel):
            return
        m = self.user_pop_rtt(lat[sel], lon[sel], lm[sel])
        second = np.argsort(m, axis=1, kind="stable")[:, 1]
        idx[sel] = second
        rtt[sel] = m[np.arange(len(sel)), second]

    def _ingress(self, lat, lon, lm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lowest-RTT PoP of each user and that RTT (``lm``: each user's last mile), as the argmin of
        :meth:`user_pop_rtt`'s matrix, a block of rows at a time: the matrix with the last mile added is never
        whole in memory (tens of MB at the default demand; blocks of :data:`topology.geo.BLOCK_CELLS`)."""
        m = self.latency.site_rtt_matrix(lat, lon, self.pop_nodes)
        lm = lm.astype(np.float32)[:, None]
        idx, rtt = np.empty(len(lat), dtype=np.intp), np.empty(len(lat), dtype=np.float32)
        step = max(1, BLOCK_CELLS // max(1, m.shape[1]))
        for s in range(0, len(lat), step):
            block = m[s:s + step] + lm[s:s + step]
            idx[s:s + step] = np.argmin(block, axis=1)
            rtt[s:s + step] = block[np.arange(len(block)), idx[s:s + step]]
        return idx, rtt


def location_hash(lat: np.ndarray, lon: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per (lat, lon), fixed by the coordinates and ``seed`` (splitmix64 of their bits):
    the same location gets the same number in every call, whichever other locations come with it."""
    with np.errstate(over="ignore"):  # (+ 0.0: -0.0 is the same location as 0.0, with other bits)
        h = ((np.asarray(lat, dtype=np.float64) + 0.0).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             ^ (np.asarray(lon, dtype=np.float64) + 0.0).view(np.uint64) ^ np.uint64(int(seed) % 2**64))
        for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            h = (h ^ (h >> np.uint64(shift))) * np.uint64(mult)
        h ^= h >> np.uint64(31)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _user_coords(lat, lon, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Users' coordinates as two 1-D float arrays of one length (a single user may be given as scalars)."""
    try:
        lat = np.atleast_1d(np.asarray(lat, dtype=np.float64))
        lon = np.atleast_1d(np.asarray(lon, dtype=np.float64))
    except (TypeError, ValueError):
        raise UserError(f"{where}: lat and lon must be numbers or arrays of numbers") from None
    if lat.ndim != 1 or lat.shape != lon.shape:
        raise UserError(f"{where}: lat and lon must be 1-D and of one length, got shapes {lat.shape} and {lon.shape}")
    _check_coords(lat, lon, where)
    return lat, lon
