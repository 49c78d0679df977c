"""The ingress x site RTT matrix: pairs the backbone does not connect fall back to an inflated great circle."""

import copy

import numpy as np
import pytest

from controlplane.fleet import edge_fleet, ingress_site_rtt
from edgepop.errors import UserError
from topology.borders import barred
from topology.geo import FIBRE_KM_PER_MS, haversine_km


def test_unconnected_pairs_get_the_great_circle_fallback_and_the_rest_is_untouched(topo):
    fleet = edge_fleet(topo)
    latency = copy.copy(topo.latency)
    node_ms = latency.node_ms.copy()
    cut = topo.pop_nodes[[0, 5, 17]]  # three PoPs cut off from the backbone
    node_ms[cut, :] = np.inf
    node_ms[:, cut] = np.inf
    node_ms[cut, cut] = 0.0
    latency.node_ms = node_ms
    got = ingress_site_rtt(topo, fleet, latency)
    # Reference: the WAN model's core RTT (base + g(d) x the cheaper of path and direct link, as users' RTTs to
    # sites are computed), and every pair's great circle where neither exists.
    sites = fleet.sites.backbone.to_numpy()
    p = latency.params
    km = haversine_km(latency.node_lat[topo.pop_nodes][:, None], latency.node_lon[topo.pop_nodes][:, None],
                      latency.node_lat[sites][None, :], latency.node_lon[sites][None, :])
    across = barred(latency.node_codes[topo.pop_nodes][:, None], latency.node_codes[sites][None, :])
    core = np.minimum(node_ms[np.ix_(topo.pop_nodes, sites)],
                      np.where((km <= p.max_link_km) & ~across, 2.0 * p.alpha_land * km / FIBRE_KM_PER_MS + p.hop_ms,
                               np.inf))
    path = p.base_ms + latency.inflation(km) * core
    expected = np.where(np.isfinite(path), path, p.base_ms + 2.0 * p.alpha_land * km / FIBRE_KM_PER_MS)
    expected = np.where(topo.pop_nodes[:, None] == sites[None, :], 0.0, expected)
    assert np.isfinite(got).all()
    assert (~np.isfinite(path)).sum() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ingress_site_rtt(topo, fleet), ingress_site_rtt(topo, fleet, topo.latency))
    # Between PoPs, the same RTT as the model gives for their coordinates (LHR -> MAN: 262 km, g(d) 1.19).
    pops = topo.pops.reset_index(drop=True)
    i, j = pops.index[pops.id == "LHR"][0], list(fleet.sites.site_id).index("MAN")
    full = ingress_site_rtt(topo, fleet)
    m = pops.index[pops.id == "MAN"][0]
    assert full[i, j] == pytest.approx(topo.core_rtt_ms(pops.lat[i], pops.lon[i], pops.lat[m], pops.lon[m]), rel=1e-9)



def test_serving_on_the_ingress_node_costs_nothing_for_every_pop_on_it(topo):
    """Every (PoP, site) pair on one backbone node is 0 ms, and only those: here with several PoPs on one node (a
    custom table's PoPs can share a city), a site on no PoP's node, and sites in another order than the PoPs."""
    from types import SimpleNamespace

    fleet = edge_fleet(topo, pops=["FRA", "LHR", "SIN", "IAD"])
    sites = fleet.sites.backbone.to_numpy()
    nodes = topo.pop_nodes.copy()
    nodes[[3, 10, 20]] = sites[1]  # three more PoP rows on the second site's node
    nodes[nodes == sites[2]] = nodes[0] if nodes[0] != sites[2] else nodes[1]  # no PoP on the third site's node
    shared = SimpleNamespace(pop_nodes=nodes, latency=topo.latency)
    got = ingress_site_rtt(shared, fleet)
    on_node = nodes[:, None] == sites[None, :]
    assert on_node.sum() >= 6 and not on_node[:, 2].any()
    assert (got[on_node] == 0).all() and (got[~on_node] > 0).all()


def test_central_splits_each_gpu_type_between_its_regions_by_their_users_demand(topo):
    """A central operator sizes regions by demand: each type's count is the edge's, and a region's share of it is
    its users' share of the demand within one GPU (largest remainders), whatever the edge's PoP tiers."""
    from controlplane.fleet import central_fleet, region_demand_shares
    from topology import baseline

    world = topo.with_gpu_scale(0.1)
    edge = edge_fleet(world)
    table = baseline("global-6", world.regions)
    shares = region_demand_shares(world, table)
    assert np.isclose(shares.sum(), 1.0) and (shares > 0).all()
    for scale in (1.0, 0.15):
        central = central_fleet(world, "global-6", like=edge, scale=scale)
        counts = central.nodes.groupby(["gpu", "site_id"]).gpus.sum()
        for gpu, n in edge.total_gpus.items():
            total = int(np.floor(n * scale + 0.5))
            assert central.total_gpus.get(gpu, 0) == total
            got = np.array([counts.get((gpu, r), 0) for r in table.id])
            assert np.all(np.abs(got - total * shares) < 1.0)
        assert (central.nodes.gpus <= 8).all()  # racked in 8-GPU servers
    bought = central_fleet(world, "global-6", like=edge, budget="usd")
    boxes = bought.nodes.groupby("site_id").size()
    n = len(bought.nodes)
    assert np.all(np.abs(np.array([boxes.get(r, 0) for r in table.id]) - n * shares) < 1.0)
    # the regions' shares follow where the users are: Europe's region outweighs the US West's many times over
    share = dict(zip(table.id, shares, strict=True))
    assert share["aws:eu-central-1"] > 5 * share["aws:us-west-2"]


def test_central_racked_like_the_edge_keeps_each_types_count_in_servers_no_larger_than_the_edges(topo):
    """``rack="edge"``: the same GPUs per type and per region as in 8-GPU servers, in servers no larger than the
    edge's largest node of that type (single GPUs where the edge has only single GPUs)."""
    from controlplane.fleet import central_fleet

    world = topo.with_gpu_scale(0.1)
    edge = edge_fleet(world)
    largest = edge.nodes.groupby("gpu").gpus.max()
    server = central_fleet(world, "global-6", like=edge)
    racked = central_fleet(world, "global-6", like=edge, rack="edge")
    per = ["gpu", "site_id"]
    assert racked.nodes.groupby(per).gpus.sum().equals(server.nodes.groupby(per).gpus.sum())
    assert (racked.nodes.gpus.to_numpy() <= racked.nodes.gpu.map(largest).to_numpy()).all()
    assert (server.nodes.gpus.max() == 8) and (largest < 8).all() and len(racked.nodes) > len(server.nodes)
    with pytest.raises(UserError, match="central rack must be one of server, edge, got 'tiny'"):
        central_fleet(world, "global-6", like=edge, rack="tiny")
