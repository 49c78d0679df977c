"""The WAN model's graph: backbone nodes (the sites, plus submarine-cable landing points) and links.

Terrestrial links join each node to its ``knn`` nearest neighbours within ``max_link_km``, across no border that
carries no transit (:mod:`topology.borders`); long-haul links are the named cable systems of
``data/backbone_links.csv``; a graph left in pieces is joined by the shortest allowed link between each smaller
piece and the rest. The link table is cached on disk (:func:`topology.rtt_cache.cached_links`, keyed by this
module's source and every input). What a link costs, and the paths over the graph, are
:class:`topology.latency.LatencyModel`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from topology.borders import NO_LAND_LINK, barred, codes, node_countries
from topology.geo import pairwise_km
from topology.rtt_cache import cached_links
from topology.tables import DATA_DIR

if TYPE_CHECKING:
    import networkx as nx


@dataclass
class Backbone:
    """Nodes (name, lat, lon, kind, cc) and undirected links (i, j, km, kind, system) of the backbone graph."""

    nodes: pd.DataFrame
    links: pd.DataFrame

    def to_networkx(self) -> nx.Graph:
        import networkx as nx  # (only for explanation and plots: importing it costs every command 0.2 s)

        g = nx.Graph()
        for i, n in enumerate(self.nodes.itertuples()):
            g.add_node(i, name=n.name, lat=n.lat, lon=n.lon, kind=n.kind)
        for e in self.links.itertuples():
            g.add_edge(int(e.i), int(e.j), km=float(e.km), kind=e.kind, system=e.system)
        return g


def load_landing_points() -> pd.DataFrame:
    """The shipped submarine-cable landing points (``data/landing_points.csv``), backbone nodes."""
    return pd.read_csv(DATA_DIR / "landing_points.csv")


def build_backbone(sites: pd.DataFrame, knn: int = 8, max_link_km: float = 1000.0) -> Backbone:
    """Backbone over ``sites`` (columns name, lat, lon, kind, optional cc) plus the cable landing points."""
    lp = load_landing_points().assign(kind="landing", cc="")
    site_cols = sites.assign(cc=sites.get("cc", pd.Series("", index=sites.index)).fillna(""))
    nodes = pd.concat([site_cols[["name", "lat", "lon", "kind", "cc"]], lp[["name", "lat", "lon", "kind", "cc"]]],
                      ignore_index=True)
    cables = pd.read_csv(DATA_DIR / "backbone_links.csv")
    links = cached_links(nodes, cables, (knn, max_link_km), lambda: _links(nodes, cables, knn, max_link_km))
    return Backbone(nodes=nodes, links=links)


def _links(nodes: pd.DataFrame, cables: pd.DataFrame, knn: int, max_link_km: float) -> pd.DataFrame:
    lat, lon = nodes.lat.to_numpy(), nodes.lon.to_numpy()
    dist = pairwise_km(lat, lon, lat, lon)
    np.fill_diagonal(dist, np.inf)
    # Landing points (and sites of a table without countries) take their nearest city's country: the rule holds
    # for them.
    cc = node_countries(lat, lon, nodes.cc.to_numpy())
    links: dict[tuple[int, int], tuple[float, str, str]] = {}
    order = np.argsort(dist, axis=1)[:, :knn]
    for i in range(len(nodes)):
        for j in order[i]:
            d = dist[i, j]
            if d > max_link_km or frozenset((cc[i], cc[j])) in NO_LAND_LINK:
                continue
            links[(min(i, j), max(i, j))] = (float(d), "land", "")
    # Named links join landing points, or PoPs where a trunk reaches inland; links to absent sites are skipped.
    index = {n: k for k, n in enumerate(nodes.name)}
    for c in cables.itertuples():
        if c.a not in index or c.b not in index:
            continue
        i, j = index[c.a], index[c.b]
        links[(min(i, j), max(i, j))] = (float(dist[i, j]), c.kind, c.system)
    _connect(links, dist, cc)
    return pd.DataFrame([(i, j, d, k, s) for (i, j), (d, k, s) in links.items()],
                        columns=["i", "j", "km", "kind", "system"])


def _connect(links: dict[tuple[int, int], tuple[float, str, str]], dist: np.ndarray, cc: np.ndarray) -> None:
    """Join the graph's components until it is one: each smaller component gets a link from its node nearest
    to the rest to that nearest outside node across no ``NO_LAND_LINK`` border (``system`` "joined"). The
    shipped sites need none; a PoP list of one's own can need some (a dense metro whose nearest neighbours are
    all its own, an island whose cable lands at a PoP the list does not hold), and without them its RTTs to
    everywhere else would be infinite. Whether such a link crosses water is unknown: it is costed as a
    terrestrial one (in the shipped fit the larger detour factor), so it does not make a path look faster than a
    cable would."""
    n = len(dist)
    while True:
        ends = np.array(list(links), dtype=np.int64).reshape(-1, 2)
        graph = coo_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(n, n))
        count, label = connected_components(graph, directed=False)
        if count <= 1:
            return
        main = int(np.argmax(np.bincount(label)))
        for comp in range(count):
            if comp == main:
                continue
            inside, outside = np.flatnonzero(label == comp), np.flatnonzero(label != comp)
            sub = dist[np.ix_(inside, outside)].copy()
            across = barred(codes(cc[inside])[:, None], codes(cc[outside])[None, :])
            if not across.all():
                sub[across] = np.inf
            a, b = np.unravel_index(int(np.argmin(sub)), sub.shape)
            i, j = int(inside[a]), int(outside[b])
            d = float(dist[i, j])
            links[(min(i, j), max(i, j))] = (d, "land", "joined")
