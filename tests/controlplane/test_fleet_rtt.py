"""The ingress x site RTT matrix: pairs the backbone does not connect fall back to an inflated great circle."""

import copy

import numpy as np

from controlplane.fleet import edge_fleet, ingress_site_rtt
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
    # Reference: every pair's great circle, taken where the backbone has no path.
    sites = fleet.sites.backbone.to_numpy()
    p = latency.params
    path = p.base_ms + node_ms[np.ix_(topo.pop_nodes, sites)]
    km = haversine_km(latency.node_lat[topo.pop_nodes][:, None], latency.node_lon[topo.pop_nodes][:, None],
                      latency.node_lat[sites][None, :], latency.node_lon[sites][None, :])
    expected = np.where(np.isfinite(path), path, p.base_ms + 2.0 * p.alpha_land * km / FIBRE_KM_PER_MS)
    expected = np.where(topo.pop_nodes[:, None] == sites[None, :], 0.0, expected)
    assert np.isfinite(got).all()
    assert (~np.isfinite(path)).sum() > 0
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ingress_site_rtt(topo, fleet), ingress_site_rtt(topo, fleet, topo.latency))
