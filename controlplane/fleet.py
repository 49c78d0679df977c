"""Fleets: the GPU nodes a deployment may use, at sites of the topology's backbone (edge PoPs or cloud regions).

Both kinds share one table shape so that placement, routing and the simulator never care which one they drive:

``nodes``: node_id, site_id, site (row in ``sites``), gpu, gpus, gpu_memory_gb, memory_gb, price_usd_hr (per node).
``sites``: site_id, backbone (node index in the topology's latency backbone), lat, lon, tz, continent.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError, UserError
from topology import FIBRE_KM_PER_MS, Topology, baseline, haversine_km


@dataclass
class Fleet:
    """GPU nodes grouped by site; ``name`` is ``edge`` or ``central:<baseline>``."""

    name: str
    nodes: pd.DataFrame
    sites: pd.DataFrame

    @property
    def total_gpus(self) -> dict[str, int]:
        return self.nodes.groupby("gpu").gpus.sum().astype(int).to_dict()

    @property
    def site_of_node(self) -> np.ndarray:
        return self.nodes.site.to_numpy()

    def without_gpus(self, gpu_types: str) -> Fleet:
        """This fleet without its nodes of the comma-separated GPU types in ``gpu_types`` ("" keeps every node).
        A type the fleet does not hold is an error, so a typo cannot pass as a no-op."""
        types = [t.strip() for t in gpu_types.split(",")] if gpu_types.strip() else []
        if "" in types:
            raise UserError(f"without_gpus {gpu_types!r}: an empty GPU type (a stray comma?)")
        unknown = sorted(set(types) - set(self.nodes.gpu))
        if unknown:
            raise UserError(f"without_gpus {gpu_types!r}: {self.name} has no {', '.join(map(repr, unknown))} GPUs "
                            f"(it has {', '.join(sorted(set(self.nodes.gpu)))})")
        if not types:
            return self
        return Fleet(self.name, self.nodes[~self.nodes.gpu.isin(types)].reset_index(drop=True), self.sites)

    def summary(self) -> dict:
        return {"name": self.name, "sites": len(self.sites), "nodes": len(self.nodes),
                "gpus": int(self.nodes.gpus.sum()), "gpus_by_type": self.total_gpus,
                "memory_tb": round(float(self.nodes.memory_gb.sum()) / 1000, 2),
                "usd_per_hour": round(float(self.nodes.price_usd_hr.sum()), 2)}


def _node_table(rows: pd.DataFrame, site_index: dict[str, int], gpus: pd.DataFrame) -> pd.DataFrame:
    per_gpu = dict(zip(gpus.gpu, gpus.memory_gb, strict=True))
    price = dict(zip(gpus.gpu, gpus.price_usd_hr, strict=True))
    out = pd.DataFrame({
        "node_id": rows.node_id.to_numpy(), "site_id": rows.site_id.to_numpy(),
        "site": rows.site_id.map(site_index).to_numpy(), "gpu": rows.gpu.to_numpy(),
        "gpus": rows.gpus.to_numpy().astype(int),
    })
    out["gpu_memory_gb"] = out.gpu.map(per_gpu).astype(float)
    out["memory_gb"] = out.gpu_memory_gb * out.gpus
    out["price_usd_hr"] = out.gpu.map(price).astype(float) * out.gpus
    return out


def edge_fleet(topo: Topology, pops: list[str] | None = None) -> Fleet:
    """Every GPU node of the topology's PoPs (or of the listed PoP ids only)."""
    p = topo.pops
    if isinstance(pops, str):  # (a set of its letters would be looked up otherwise)
        raise UserError(f"pops must be a list of PoP ids, got the string {pops!r} (write [{pops!r}])")
    if pops is not None:
        unknown = sorted(set(pops) - set(p.id))
        if unknown:
            raise UserError(f"unknown PoP id(s): {', '.join(unknown[:5])}")
        p = p[p.id.isin(pops)]
    sites = pd.DataFrame({"site_id": p.id.to_numpy(), "backbone": topo.pop_nodes[p.index.to_numpy()],
                          "lat": p.lat.to_numpy(), "lon": p.lon.to_numpy(), "tz": p.tz.to_numpy(),
                          "continent": p.continent.to_numpy()})
    nodes = topo.nodes[topo.nodes.pop_id.isin(set(sites.site_id))].rename(columns={"pop_id": "site_id"})
    index = {s: i for i, s in enumerate(sites.site_id)}
    return Fleet("edge", _node_table(nodes, index, topo.gpus), sites)


BUDGETS = ("gpus", "usd")
RACKS = ("server", "edge")  # equal-GPU central: 8-GPU cloud servers, or servers the size of the edge's nodes
MAX_CENTRAL_SCALE = 100.0  # central's budget at most 100 x the edge's (beyond, fleets of millions of GPUs: hours)


def central_fleet(topo: Topology, regions: str | list[str] = "big3", like: Fleet | None = None,
                  scale: float = 1.0, budget: str = "gpus", node: str = "H100x8", rack: str = "server") -> Fleet:
    """A central fleet in a baseline region set with the budget of ``like`` (the edge fleet by default).

    The budget is shared between the regions by their users' demand (:func:`region_demand_shares`), as a cloud
    operator sizes its regions: ``budget="gpus"`` (equal GPUs): each GPU type of ``like``, ``scale`` x its count,
    split between the regions by demand share (largest remainders), racked in 8-GPU servers (``rack="server"``)
    or in servers no larger than ``like``'s largest node of that type (``rack="edge"``: where the edge has single
    GPUs, so does central; tensor-parallel models then fit where they fit at the edge). ``budget="usd"``
    (equal dollars per hour): ``node`` boxes (``GPUxCOUNT``, a cloud's standard server) for ``scale`` x the $/hour
    of ``like``, split the same way (at least one box). ``scale`` multiplies the budget (0.5: half the GPUs or
    half the dollars).
    """
    from topology.gpus import parse_node_list

    if isinstance(regions, str) and "," in regions:
        # region ids in a string: read (and refused) as baseline() reads them, then named by the ids as a list is
        regions = list(baseline(regions, topo.regions).id)
    if isinstance(regions, str):
        table = baseline(regions, topo.regions)
        name = regions.strip()
    else:
        if not regions:
            raise UserError("central fleet: no regions given (a baseline name such as 'big3', or region ids)")
        if "" in regions:
            raise UserError(f"central fleet: an empty region id in {list(regions)!r} (a stray comma?)")
        unknown = sorted(set(regions) - set(topo.regions.id))
        if unknown:
            raise UserError(f"unknown region id(s): {', '.join(map(repr, unknown[:5]))}")
        table = topo.regions[topo.regions.id.isin(regions)]
        name = "+".join(regions)
    if isinstance(scale, bool) or not isinstance(scale, Real) or not 0 < scale <= MAX_CENTRAL_SCALE:  # (NaN fails)
        raise UserError(f"central GPU scale must be positive and at most {MAX_CENTRAL_SCALE:g} (the budget x "
                        f"{MAX_CENTRAL_SCALE:g}), got {scale!r}")
    if budget not in BUDGETS:
        raise UserError(f"central budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if rack not in RACKS:
        raise UserError(f"central rack must be one of {', '.join(RACKS)}, got {rack!r}")
    if rack != "server" and budget != "gpus":
        raise UserError(f"central rack {rack!r} applies to an equal-GPU budget, not budget {budget!r}")
    like = like or edge_fleet(topo)
    if like.nodes.empty or int(like.nodes.gpus.sum()) == 0:
        raise UserError(f"central fleet: the fleet whose budget it copies ({like.name}) has no GPUs")
    backbone = topo.region_nodes(table.id)
    shares = region_demand_shares(topo, table)
    if budget == "usd":
        try:
            box = parse_node_list(node, set(topo.gpus.gpu), ("central node", None))[0]
        except (DataFileError, IndexError) as exc:  # (its field is the tier file's 'nodes'; the option is node)
            raise UserError(f"central node {node!r}: {getattr(exc, 'problem', 'not of the form GPUxCOUNT')}") from None
        nodes = _bought(topo, like.nodes, table.id.to_numpy(), shares, box, scale)
    else:
        nodes = _racked(like.nodes, table.id.to_numpy(), shares, scale, rack)
    near = topo.pops.iloc[[_nearest_pop(topo, lat, lon) for lat, lon in zip(table.lat, table.lon, strict=True)]]
    sites = pd.DataFrame({"site_id": table.id.to_numpy(), "backbone": backbone, "lat": table.lat.to_numpy(),
                          "lon": table.lon.to_numpy(), "tz": near.tz.to_numpy(), "continent": near.continent.to_numpy()})
    sites = sites[sites.site_id.isin(set(nodes.site_id))].reset_index(drop=True)
    index = {s: i for i, s in enumerate(sites.site_id)}
    return Fleet(f"central:{name}", _node_table(nodes, index, topo.gpus), sites)


RACK_GPUS = 8  # a cloud region's GPU server: 8 GPUs of one type (HGX H100/H200, 8 x L40S or L4 instances)


def region_demand_shares(topo: Topology, table: pd.DataFrame) -> np.ndarray:
    """Share of all users' demand whose nearest region (core RTT from their city: central users reach regions
    directly) is each region of ``table``: the demand cities' day-average weights, summed per region."""
    d = topo.demand
    rtt = topo.latency.site_rtt_matrix(d.lat.to_numpy(), d.lon.to_numpy(), topo.region_nodes(table.id))
    w = np.bincount(np.argmin(rtt, axis=1), weights=d.weight.to_numpy(dtype=float), minlength=len(table))
    return w / w.sum()


def apportion(total: int, shares: np.ndarray) -> np.ndarray:
    """``total`` whole units split by ``shares`` (largest remainders; ties to the earlier share)."""
    quota = total * shares
    whole = np.floor(quota + 1e-9).astype(int)
    left = total - int(whole.sum())
    if left > 0:
        order = np.lexsort((np.arange(len(shares)), -np.round(quota - whole, 9)))
        whole[order[:left]] += 1
    return whole


def _racked(like: pd.DataFrame, regions: np.ndarray, shares: np.ndarray, scale: float,
            rack: str = "server") -> pd.DataFrame:
    """``scale`` x the GPUs of each type in ``like``, split between ``regions`` by demand share, racked in 8-GPU
    servers (a region's last one of a type partial): the same GPUs, in the regions and servers a cloud would use.
    ``rack="edge"``: servers of at most ``like``'s largest node of each type instead."""
    per_type = like.groupby("gpu", sort=False).gpus.sum() * scale
    size = (like.groupby("gpu", sort=False).gpus.max() if rack == "edge" else
            pd.Series(RACK_GPUS, index=per_type.index)).clip(upper=RACK_GPUS)
    count = np.floor(per_type.to_numpy() + 0.5).astype(int)
    if count.sum() == 0:  # at least one GPU, of the largest type
        count[int(np.argmax(per_type.to_numpy()))] = 1
    split = {gpu: apportion(int(n), shares) for gpu, n in zip(per_type.index, count, strict=True)}
    rows = []
    for r, region in enumerate(regions.tolist()):
        k = 0
        for gpu in per_type.index:
            n = int(split[gpu][r])
            while n > 0:
                take = min(int(size[gpu]), n)
                rows.append({"node_id": f"{region}-{k}", "site_id": region, "gpu": gpu, "gpus": take})
                n, k = n - take, k + 1
    return pd.DataFrame(rows)


def _bought(topo: Topology, like: pd.DataFrame, regions: np.ndarray, shares: np.ndarray, box: tuple[str, int],
            scale: float) -> pd.DataFrame:
    """``box`` nodes worth ``scale`` x the $/hour of ``like``, split between ``regions`` by demand share."""
    gpu, count = box
    price = dict(zip(topo.gpus.gpu, topo.gpus.price_usd_hr, strict=True))
    usd = float((like.gpus.to_numpy() * like.gpu.map(price).to_numpy(dtype=float)).sum()) * scale
    boxes = apportion(max(1, int(round(usd / (price[gpu] * count)))), shares)
    return pd.DataFrame([{"node_id": f"{region}-{i}", "site_id": region, "gpu": gpu, "gpus": count}
                         for region, k in zip(regions.tolist(), boxes, strict=True) for i in range(int(k))])


def _nearest_pop(topo: Topology, lat: float, lon: float) -> int:
    """Row of the PoP nearest a region: regions inherit its time zone and continent."""
    return int(np.argmin(haversine_km(lat, lon, topo.pops.lat.to_numpy(), topo.pops.lon.to_numpy())))


def ingress_site_rtt(topo: Topology, fleet: Fleet, latency=None) -> np.ndarray:
    """RTT (ms) from every PoP (rows, as ingress) to every fleet site (columns): the WAN model's core RTT between
    their backbone nodes (base + g(d) x path, as users' RTTs to a site are computed).

    Serving at the ingress PoP itself costs no backbone RTT (0 ms). ``latency`` overrides the topology's model (a
    backbone with cut links). Pairs the backbone graph does not connect (custom PoP tables with isolated cities)
    fall back to a great-circle path inflated like a land route, so every pair has a finite RTT.
    """
    latency = latency or topo.latency
    sites = fleet.sites.backbone.to_numpy()
    pop_nodes = topo.pop_nodes
    rtt = latency.node_rtt_matrix(pop_nodes, sites)
    # (two reductions, not a mask of every cell: a 3,000 x 3,000 matrix's mask is 9 MB of fresh pages)
    if not (np.isfinite(rtt.min()) and np.isfinite(rtt.max())):  # the unconnected pairs: a few isolated PoPs
        gap = np.nonzero(~np.isfinite(rtt))
        a, b = pop_nodes[gap[0]], sites[gap[1]]
        km = haversine_km(latency.node_lat[a], latency.node_lon[a], latency.node_lat[b], latency.node_lon[b])
        rtt[gap] = latency.params.base_ms + 2.0 * latency.params.alpha_land * km / FIBRE_KM_PER_MS
    # Every (PoP row, site column) pair on the same backbone node, at once (a column at a time, the strided writes
    # took 0.4 s at 3,000 PoPs): the PoP rows sorted by node, each site's run of them found by bisection.
    order = np.argsort(pop_nodes, kind="stable")
    by_node = pop_nodes[order]
    lo = np.searchsorted(by_node, sites, side="left")
    counts = np.searchsorted(by_node, sites, side="right") - lo
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # 0, 1, ... in each run
    rtt[order[np.repeat(lo, counts) + within], np.repeat(np.arange(len(sites)), counts)] = 0.0
    return rtt
