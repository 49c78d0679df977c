"""Barred borders: one rule for every terrestrial link (backbone links, direct links, users' attachment), and
coordinates answered as the simulator's own matrices answer for the same places."""

import numpy as np
import pytest

from topology.borders import NO_LAND_LINK, RULED, barred, codes, point_codes
from topology.latency import Backbone, LatencyModel
from topology.rtt_cache import model_digest

DEMAND_CITIES_ACROSS = [("IN", "PK"), ("PK", "IN"), ("IN", "CN"), ("CN", "IN"), ("EG", "IL"), ("JO", "IL"),
                        ("LB", "IL"), ("SY", "IL"), ("IL", "JO"), ("IL", "EG")]


def test_no_demand_city_enters_the_network_across_a_barred_border(topo):
    d = topo.demand
    idx, _ = topo.ingress(d.lat.to_numpy(), d.lon.to_numpy())
    ingress_cc = topo.pops.cc.to_numpy()[idx]
    crossing = {(a, b): int(((d.cc.to_numpy() == a) & (ingress_cc == b)).sum()) for a, b in DEMAND_CITIES_ACROSS}
    assert all(frozenset(pair) in NO_LAND_LINK for pair in crossing)
    assert not any(crossing.values()), crossing
    # Amritsar lies 45 km from the Lahore PoP and 450 km from New Delhi's: it enters in India all the same.
    amritsar = d[(d.name == "Amritsar") & (d.cc == "IN")]
    got = topo.pops.cc.iloc[topo.ingress(amritsar.lat.to_numpy(), amritsar.lon.to_numpy())[0][0]]
    assert got == "IN"


def test_pops_across_a_barred_border_have_no_direct_link(topo):
    pops = topo.pops.reset_index(drop=True)
    lhe, dl = (int(pops.index[pops.id == x][0]) for x in ("LHE", "DEL"))
    rtt = topo.latency.node_rtt_matrix(np.array([lhe]), np.array([dl]))[0, 0]
    p = topo.latency.params
    km = 427.0  # Lahore - New Delhi, great circle
    direct = p.base_ms + topo.latency.inflation(km) * (2 * p.alpha_land * km / 200.0 + p.hop_ms)
    assert rtt > 3 * direct  # a detour through third countries, not the 12 ms a cross-border fibre would give
    assert topo.core_rtt_ms(pops.lat[lhe], pops.lon[lhe], pops.lat[dl], pops.lon[dl]) == pytest.approx(rtt, abs=0.2)


def test_coordinates_of_pops_get_the_simulators_pop_to_pop_rtts(topo):
    """``core_rtt_ms`` between PoPs' coordinates is the backbone RTT the simulator routes with, for every pair:
    a point attaches only where a link could reach (no barred border, nothing beyond ``max_link_km`` but its
    nearest node), so a remote PoP (Manaus, Noumea) or a border one (Lahore) is not given a shortcut."""
    pops = topo.pops
    n = len(pops)
    nodes = np.arange(n)
    matrix = topo.latency.node_rtt_matrix(nodes, nodes)
    lat, lon = pops.lat.to_numpy(), pops.lon.to_numpy()
    coords = topo.core_rtt_ms(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    off = ~np.eye(n, dtype=bool)
    assert np.abs(coords - matrix)[off].max() < 0.2  # hop cost of the attachment at most


def test_a_point_takes_the_country_of_the_node_it_is_on_else_of_its_nearest_city(topo):
    assert RULED[point_codes([31.62234], [74.87534])[0]] == "IN"  # Amritsar
    assert RULED[point_codes([31.5580], [74.3507])[0]] == "PK"  # Lahore
    assert point_codes([48.86], [2.35])[0] == len(RULED)  # Paris: no rule names France
    # Microsoft's published coordinates of its Israel Central region lie in the Sinai, nearest an Egyptian city;
    # the region's node there takes Israel's rule (its documented country, regions.csv), and so does the point on it.
    assert RULED[point_codes([31.26557], [33.45066])[0]] == "EG"
    _, _, on_node = topo.latency._attach(np.array([31.26557]), np.array([33.45066]))
    assert RULED[on_node[0]] == "IL"


def test_node_countries_are_part_of_the_rtt_caches_key(topo):
    backbone = topo.latency.backbone
    nodes = backbone.nodes.copy()
    nodes.loc[nodes.name == "LHE", "cc"] = "IN"  # the same coordinates, another country
    moved = LatencyModel(Backbone(nodes=nodes, links=backbone.links), topo.latency.params)
    assert (moved.node_codes != topo.latency.node_codes).sum() >= 1
    assert codes(["IN"])[0] in moved.node_codes[nodes.name == "LHE"]
    assert model_digest(moved) != model_digest(topo.latency)


def test_no_land_link_crosses_a_barred_border_whatever_gave_its_ends_their_countries(topo):
    """Every node's country counts, a region far from any PoP too (Jamnagar's azure:jioindiawest, 267 km from the
    nearest PoP, takes India's from its nearest city): no land link joins it to Karachi."""
    model = topo.latency
    links = model.backbone.links
    land = links[links.kind == "land"]
    i, j = land.i.to_numpy(), land.j.to_numpy()
    assert not barred(model.node_codes[i], model.node_codes[j]).any()
    names = model.backbone.nodes.name.to_numpy()
    jio = int(np.flatnonzero(names == "azure:jioindiawest")[0])
    assert RULED[model.node_codes[jio]] == "IN"
    pops = topo.pops.reset_index(drop=True)
    lhe, dl = (int(pops.index[pops.id == x][0]) for x in ("LHE", "DEL"))
    assert not {"azure:jioindiawest", "KHI"} <= set(model.path(lhe, dl))


def test_a_pop_table_without_countries_keeps_the_rule_and_a_finer_demand_table_too(topo, tmp_path):
    from topology import Topology

    pops = topo.pops.drop(columns=["cc"])
    path = tmp_path / "pops.csv"
    pops.to_csv(path, index=False)
    bare = Topology.load(pops=path)
    ids = bare.pops.id.tolist()
    lhe, dl = ids.index("LHE"), ids.index("DEL")
    same = topo.latency.node_rtt_matrix(np.array([lhe]), np.array([dl]))[0, 0]
    assert bare.latency.node_rtt_matrix(np.array([lhe]), np.array([dl]))[0, 0] == pytest.approx(same)
    # Demand cities down to 15,000 people: each still enters in its own country or a neighbour the rule allows.
    fine = Topology.load(min_population=15_000)
    d = fine.demand
    assert len(d) > len(topo.demand)
    idx, _ = fine.ingress(d.lat.to_numpy(), d.lon.to_numpy())
    assert not barred(codes(d.cc), codes(fine.pops.cc.to_numpy()[idx])).any()


def test_coordinates_that_are_not_numbers_give_nan_not_a_traceback(topo):
    # (the model answers NaN; topology.core_rtt_ms and Topology.core_rtt_ms refuse such coordinates first)
    assert np.isnan(topo.latency.core_rtt_ms(float("nan"), 2.35, 51.5, -0.12))
    assert point_codes([np.nan], [0.0])[0] == len(RULED)
