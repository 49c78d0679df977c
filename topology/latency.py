"""WAN latency model: propagation over a backbone graph, calibrated on measured round-trip times.

RTT(a, b) = base + g(d) * min over backbone paths of  sum_e ( 2 * alpha_e * length_e / 200 km/ms + hop )

with d the great-circle distance between a and b and g(d) = 1 + short_inflation * short_scale_km / (d +
short_scale_km) the distance-dependent inflation: short paths detour proportionally more (metro rings, regional
aggregation, peering at a distant exchange) than long-haul ones, whose inflation the cable and land circuity
factors already carry. g falls from 1 + short_inflation at d = 0 towards 1, and d * g(d) still grows with d, so
a farther point is never predicted closer by it.

* Nodes are the PoPs, the cloud regions and the landing points of major submarine cables (the graph:
  :mod:`topology.backbone`).
* Terrestrial links join each node to its nearest neighbours (within ``max_link_km``); fibre follows roads
  and rail, so a terrestrial km costs ``alpha_land`` great-circle km. Long-haul links are the named cable
  systems of ``data/backbone_links.csv``; a cable km costs ``alpha_sea`` km (cables also bend).
* ``hop`` is the per-link processing/queueing cost and ``base`` the per-path fixed term (the two data-centre
  ends: top-of-rack to border, edge routers, the measurement stack).
* A graph left in pieces (a PoP list of one's own can leave a dense metro or an island apart) is joined by
  the shortest link between each smaller piece and the rest, costed as terrestrial; the shipped sites need none.
* Any point (a city, a user) attaches to its nearest nodes over a terrestrial link, so the model answers
  for arbitrary coordinates, and two nearby points may also use a direct terrestrial link. Every terrestrial
  link, these included, obeys one rule (:mod:`topology.borders`): none crosses a border that carries no transit,
  and a point reaches only nodes a backbone link could (within ``max_link_km``, or its nearest node).

Because every link is at least as long as its great circle, ``alpha >= 1`` and ``g >= 1``, the model never beats
light in fibre along the great circle (a property the tests check). ``topology.calibration`` fits the constants
on the shipped measured RTT sets (``topology.rtt_sets``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra

from edgepop.errors import DataFileError, UserError, is_real
from topology.backbone import Backbone, build_backbone, load_landing_points  # noqa: F401  (re-exported)
from topology.borders import SAME_SITE_KM, bar, barred, codes, node_countries, point_codes
from topology.geo import BLOCK_CELLS, FIBRE_KM_PER_MS, haversine_km, pairwise_km
from topology.rtt_cache import cached_matrix, cached_node_rtt, cached_paths, paths_key
from topology.tables import DATA_DIR

PARAMS_FILE = DATA_DIR / "latency_params.json"


# The calibration's own bounds on each parameter: (lowest value, whether it must be above it rather than at least it,
# whether it is a whole number). alpha >= 1 keeps every RTT at or above light in fibre along the great circle.
_BOUNDS = {"alpha_land": (1.0, False, False), "alpha_sea": (1.0, False, False), "hop_ms": (0.0, False, False),
           "base_ms": (0.0, False, False), "short_inflation": (0.0, False, False),
           "short_scale_km": (0.0, True, False), "knn": (1, False, True), "max_link_km": (0.0, True, False),
           "attach_k": (1, False, True)}


def _param_problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` for parameter ``name`` (None: nothing)."""
    if name == "meta":
        return None if isinstance(value, dict) else f"{value!r} is not a mapping"
    lo, strict, whole = _BOUNDS[name]
    if not is_real(value) or not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if whole and not float(value).is_integer():
        return f"{value!r} is not a whole number"
    if value < lo or (strict and value == lo):
        return f"{value!r} must be {'>' if strict else '>='} {lo:g}"
    return None


@dataclass(frozen=True)
class LatencyParams:
    """Calibrated constants of the latency model (see ``calibrate``); each is checked against the calibration's
    bounds (``_BOUNDS``) when made."""

    alpha_land: float = 1.6
    alpha_sea: float = 1.25
    hop_ms: float = 0.2
    base_ms: float = 1.0
    short_inflation: float = 0.0
    short_scale_km: float = 500.0
    knn: int = 8
    max_link_km: float = 1000.0
    attach_k: int = 3
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for f in fields(self):
            problem = _param_problem(f.name, getattr(self, f.name))
            if problem:
                raise UserError(f"latency parameter {f.name!r}: {problem}")
        for f in ("knn", "attach_k"):
            object.__setattr__(self, f, int(getattr(self, f)))

    @classmethod
    def load(cls, path: str | Path = PARAMS_FILE) -> LatencyParams:
        """Parameters from a JSON object of them (a missing one takes its default); one-line errors naming the file
        and the field."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise DataFileError(path, None, None, f"not a readable JSON file ({exc})") from None
        if not isinstance(raw, dict):
            raise DataFileError(path, None, None, "must hold a JSON object of latency parameters")
        known = [f.name for f in fields(cls)]
        for key, value in raw.items():
            if problem := (_param_problem(key, value) if key in known else f"unknown (known: {', '.join(known)})"):
                raise DataFileError(path, None, key, problem)
        return cls(**raw)

    def save(self, path: str | Path = PARAMS_FILE) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


class LatencyModel:
    """All-pairs backbone RTTs plus vectorised queries for arbitrary coordinates."""

    def __init__(self, backbone: Backbone, params: LatencyParams):
        self.backbone, self.params = backbone, params
        self.node_lat = backbone.nodes.lat.to_numpy(dtype=np.float64)
        self.node_lon = backbone.nodes.lon.to_numpy(dtype=np.float64)
        self.node_codes = node_codes(backbone)
        links = backbone.links
        self._paths = (len(backbone.nodes), links.i.to_numpy(), links.j.to_numpy(),
                       self._link_ms(links.km.to_numpy(), links.kind.to_numpy()))
        # The key of the all-pairs matrix's inputs: the matrix itself is read or computed on first use, which a run
        # whose derived matrices are all cached never makes. None once a matrix is set by hand.
        self.paths_key: str | None = paths_key(self, *self._paths)
        self._node_ms: np.ndarray | None = None
        self._attached: tuple | None = None  # the last site matrix's query points and their attachment

    @property
    def node_ms(self) -> np.ndarray:
        """All-pairs backbone RTT (ms, float64, nodes x nodes): shortest paths over the links, from the disk cache
        when kept there (:mod:`topology.rtt_cache`)."""
        if self._node_ms is None:
            self._node_ms = self._all_pairs()
        return self._node_ms

    @node_ms.setter
    def node_ms(self, value: np.ndarray) -> None:
        self._node_ms, self.paths_key = value, None

    def _link_ms(self, km: np.ndarray, kind: np.ndarray) -> np.ndarray:
        p = self.params
        alpha = np.where(kind == "sea", p.alpha_sea, p.alpha_land)
        return 2.0 * alpha * km / FIBRE_KM_PER_MS + p.hop_ms

    def _all_pairs(self) -> np.ndarray:
        n, i, j, w = self._paths
        return cached_paths(self.paths_key, n,
                            lambda: dijkstra(coo_matrix((w, (i, j)), shape=(n, n)).tocsr(), directed=False))

    def inflation(self, km) -> np.ndarray:
        """The distance-dependent factor g(d) applied to a path's propagation and hop cost."""
        p = self.params
        return 1.0 + p.short_inflation * p.short_scale_km / (np.asarray(km, dtype=np.float64) + p.short_scale_km)

    def _attach(self, lat: np.ndarray, lon: np.ndarray,
                d: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nearest ``attach_k`` nodes of each point, the terrestrial cost to reach each (ms), and the points'
        border-rule codes (:func:`topology.borders.point_codes`; a point on a node is in that node's country).
        ``d``: the points' distances to every node (km) when the caller has them (overwritten here).

        A point links only where a backbone link could: to nodes within ``max_link_km`` (its nearest node however
        far: a remote island still attaches to something) and across no barred border; a node out of reach
        repeats the nearest one."""
        idx, km, pcodes = self._attach_nodes(lat, lon, d)
        return idx, self._link_ms(km, np.array("land")), pcodes

    def _attach_nodes(self, lat: np.ndarray, lon: np.ndarray,
                      d: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_attach` before its costs: the nodes, their distances (km) and the points' codes, which depend on
        the backbone's structure (``attach_k``, ``max_link_km``, the border rule) and not on the fitted constants."""
        k = self.params.attach_k
        d = pairwise_km(lat, lon, self.node_lat, self.node_lon) if d is None else d
        pcodes = point_codes(lat, lon)
        on = np.argmin(d, axis=1)
        at_node = d[np.arange(len(on)), on] <= SAME_SITE_KM
        pcodes[at_node] = self.node_codes[on[at_node]]
        bar(d, pcodes, self.node_codes)
        idx = np.argpartition(d, k - 1, axis=1)[:, :k]
        km = np.take_along_axis(d, idx, axis=1)
        first = np.argmin(km, axis=1)[:, None]
        nearest = np.take_along_axis(km, first, axis=1)
        far = km > np.maximum(nearest, self.params.max_link_km)
        if far.any():
            idx = np.where(far, np.take_along_axis(idx, first, axis=1), idx)
            km = np.where(far, nearest, km)
        return idx, km, pcodes

    def core_rtt_ms(self, lat1, lon1, lat2, lon2) -> np.ndarray | float:
        """Data-centre to data-centre RTT in ms (no last mile); scalars or broadcastable arrays."""
        a = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (lat1, lon1, lat2, lon2)))
        shape = a[0].shape
        lat1, lon1, lat2, lon2 = (x.ravel() for x in a)
        out = np.empty(lat1.size)
        step = 20000
        for s in range(0, lat1.size, step):
            sl = slice(s, s + step)
            out[sl] = self._pair_rtt(lat1[sl], lon1[sl], lat2[sl], lon2[sl])
        return float(out[0]) if shape == () else out.reshape(shape)

    def _pair_rtt(self, lat1, lon1, lat2, lon2) -> np.ndarray:
        i1, c1, p1 = self._attach(lat1, lon1)
        i2, c2, p2 = self._attach(lat2, lon2)
        via = c1[:, :, None] + self.node_ms[i1[:, :, None], i2[:, None, :]] + c2[:, None, :]
        best = via.reshape(len(lat1), -1).min(axis=1)
        km = haversine_km(lat1, lon1, lat2, lon2)
        direct = np.where(barred(p1, p2), np.inf, self._direct_ms(km))
        return self.params.base_ms + self.inflation(km) * np.minimum(best, direct)

    def _direct_ms(self, km: np.ndarray) -> np.ndarray:
        """A direct terrestrial link between two nearby points (none beyond ``max_link_km``)."""
        return np.where(km <= self.params.max_link_km, self._link_ms(km, np.array("land")), np.inf)

    def node_rtt_matrix(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Core RTT (ms, float64) between backbone nodes ``a`` (rows) and ``b`` (columns), by the same model as
        :meth:`core_rtt_ms`: base + g(d) x the cheaper of the backbone path and a direct link (inf where the graph
        does not connect them and they are too far apart for a direct link)."""
        a, b = np.asarray(a), np.asarray(b)
        return cached_node_rtt(self, a, b, lambda: self._node_rtt_matrix(a, b))

    def _node_rtt_matrix(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        p = self.params
        km = pairwise_km(self.node_lat[a], self.node_lon[a], self.node_lat[b], self.node_lon[b])
        path = self.node_ms[np.ix_(a, b)]
        # As core_rtt_ms computes it, but the direct link only where one can exist (a few pairs of millions: the
        # rest are inf, which min() leaves alone), in place over one PoPs x sites array.
        near = np.flatnonzero(km.ravel() <= p.max_link_km)
        if len(near):  # and across no barred border
            near = near[~barred(self.node_codes[a][near // len(b)], self.node_codes[b][near % len(b)])]
        if len(near):
            flat = path.reshape(-1)
            flat[near] = np.minimum(flat[near], self._link_ms(km.ravel()[near], np.array("land")))
        path *= self.inflation(km)
        path += p.base_ms
        return path

    def site_rtt_matrix(self, lat, lon, site_nodes: np.ndarray) -> np.ndarray:
        """Core RTT (ms, float32) from each point (rows) to each backbone node in ``site_nodes`` (columns);
        large matrices come from :mod:`topology.rtt_cache` (read-only arrays)."""
        lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
        site_nodes = np.asarray(site_nodes)
        return cached_matrix(self, lat, lon, site_nodes, lambda: self._site_rtt_matrix(lat, lon, site_nodes))

    def _site_rtt_matrix(self, lat, lon, site_nodes: np.ndarray, chunk: int | None = None) -> np.ndarray:
        out = np.empty((lat.size, site_nodes.size), dtype=np.float32)
        sub = self.node_ms[:, site_nodes]
        scodes = self.node_codes[site_nodes]
        # Rows per block: BLOCK_CELLS node distances (2.1 s against 0.8 s in blocks of 8,192 rows, the default
        # demand cities x PoPs).
        chunk = chunk or max(256, BLOCK_CELLS // len(self.node_lat))
        # The same points against other sites (users x PoPs, then users x regions) attach as before: kept.
        key = (self.params, lat.tobytes(), lon.tobytes(), self.node_lat.tobytes(), self.node_lon.tobytes(),
               np.asarray(self.node_codes).tobytes())
        known = self._attached[1] if self._attached is not None and self._attached[0] == key else None
        attached = []
        for s in range(0, lat.size, chunk):
            sl = slice(s, s + chunk)
            if known is not None:
                idx, cost, pcodes = (a[sl] for a in known)
                km = pairwise_km(lat[sl], lon[sl], self.node_lat[site_nodes], self.node_lon[site_nodes])
            else:
                # One distance pass serves both the attachment and the direct links (the sites are backbone nodes):
                # the sites' columns are taken before the border rule bars links in the full matrix.
                d = pairwise_km(lat[sl], lon[sl], self.node_lat, self.node_lon)
                km = d[:, site_nodes]
                idx, cost, pcodes = self._attach(lat[sl], lon[sl], d)
                attached.append((idx, cost, pcodes))
            best = sub[idx[:, 0]]  # the cheapest of the attach_k entry nodes' paths, one node at a time
            best += cost[:, 0, None]
            for j in range(1, idx.shape[1]):
                np.minimum(best, sub[idx[:, j]] + cost[:, j, None], out=best)
            direct = self._direct_ms(km)
            bar(direct, pcodes, scodes)
            out[sl] = self.params.base_ms + self.inflation(km) * np.minimum(best, direct)
        if known is None:
            self._attached = (key, tuple(np.concatenate(a) for a in zip(*attached, strict=True)))
        return out

    def path(self, a: int, b: int) -> list[str]:
        """Names of the backbone nodes on the cheapest path between nodes ``a`` and ``b`` (for explanation)."""
        g = self.backbone.to_networkx()
        p = self.params
        for _, _, e in g.edges(data=True):
            alpha = p.alpha_sea if e["kind"] == "sea" else p.alpha_land
            e["ms"] = 2 * alpha * e["km"] / FIBRE_KM_PER_MS + p.hop_ms
        import networkx as nx

        nodes = nx.shortest_path(g, a, b, weight="ms")
        return [g.nodes[n]["name"] for n in nodes]


def node_codes(backbone: Backbone) -> np.ndarray:
    """The border-rule code of each backbone node's country (:mod:`topology.borders`)."""
    nodes = backbone.nodes
    cc = nodes.cc.fillna("").to_numpy() if "cc" in nodes else np.full(len(nodes), "", dtype=object)
    return codes(node_countries(nodes.lat.to_numpy(dtype=np.float64), nodes.lon.to_numpy(dtype=np.float64), cc))


def site_table(pops: pd.DataFrame, regions: pd.DataFrame) -> pd.DataFrame:
    """Backbone sites: the PoPs then the regions, in table order (callers rely on this order)."""
    return pd.concat([pops[["id", "lat", "lon", "cc"]].rename(columns={"id": "name"}).assign(kind="pop"),
                      regions.assign(cc=regions.get("cc", ""))[["id", "lat", "lon", "cc"]]
                      .rename(columns={"id": "name"}).assign(kind="region")],
                     ignore_index=True)


def default_sites() -> pd.DataFrame:
    """PoPs and cloud regions of the shipped tables, as backbone sites."""
    from topology.pops import load_pops
    from topology.regions import load_regions

    return site_table(load_pops(), load_regions())


@lru_cache(maxsize=4)
def default_model(params: LatencyParams | None = None) -> LatencyModel:
    """The model over the shipped PoPs and regions with the calibrated parameters (built once per process)."""
    params = params or LatencyParams.load()
    return LatencyModel(build_backbone(default_sites(), params.knn, params.max_link_km), params)


def check_coords(lat: np.ndarray, lon: np.ndarray, where: str) -> None:
    """Refuse coordinates out of range or NaN (one line naming ``where``)."""
    if not (np.all(np.abs(lat) <= 90) and np.all(np.abs(lon) <= 180)):  # (NaN fails both)
        raise UserError(f"{where}: latitudes must be in [-90, 90] and longitudes in [-180, 180] degrees (no NaN)")


def core_rtt_ms(lat1, lon1, lat2, lon2):
    """Data-centre-to-data-centre RTT in ms between coordinates (scalars or numpy arrays; no last mile), checked as
    :meth:`topology.Topology.core_rtt_ms` checks them."""
    for lat, lon in ((lat1, lon1), (lat2, lon2)):
        try:
            lat, lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError("core_rtt_ms: lat and lon must be numbers or arrays of numbers") from None
        check_coords(lat, lon, "core_rtt_ms")
    return default_model().core_rtt_ms(lat1, lon1, lat2, lon2)
