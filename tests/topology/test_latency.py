"""The WAN latency model: physics bounds, symmetry, calibration error, determinism, ingress."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import LatencyParams, core_rtt_ms, fibre_rtt_ms, haversine_km
from topology.calibration import (
    FREE,
    band_weights,
    errors,
    find_paths,
    network_weights,
    pair_geometry,
    plain_distance_fit,
    predict,
)
from topology.latency import LatencyModel, build_backbone, default_model, default_sites
from topology.rtt_sets import load_all

lat = st.floats(-60, 75, allow_nan=False)
lon = st.floats(-180, 180, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(lat, lon, lat, lon)
def test_rtt_positive_symmetric_and_above_light_in_fibre(a, b, c, d):
    ab = core_rtt_ms(a, b, c, d)
    ba = core_rtt_ms(c, d, a, b)
    assert ab > 0
    assert ab == pytest.approx(ba, rel=1e-9)
    assert ab >= float(fibre_rtt_ms(haversine_km(a, b, c, d))) - 1e-9


def test_vectorised_matches_scalar():
    rng = np.random.default_rng(7)
    la1, la2 = rng.uniform(-50, 70, 50), rng.uniform(-50, 70, 50)
    lo1, lo2 = rng.uniform(-180, 180, 50), rng.uniform(-180, 180, 50)
    vec = core_rtt_ms(la1, lo1, la2, lo2)
    assert vec.shape == (50,)
    assert np.allclose(vec, [core_rtt_ms(*x) for x in zip(la1, lo1, la2, lo2, strict=True)])


def test_calibration_error_on_measured_tables_beats_distance_fit():
    m = load_all(fitted_only=True)
    assert len(m) > 1500
    err = errors(predict(default_model(), m), m.rtt_ms.to_numpy())
    assert err["median_ape"] <= 0.10
    # About half the error of distance alone. The fit weighs networks, not pairs, so the pooled median (71% Azure
    # pairs) sits above a pair-weighted fit's: 8.5% against 17.0% for the straight line.
    assert err["median_ape"] < 0.55 * plain_distance_fit(m)["median_ape"]



@pytest.mark.parametrize("alpha_land, hop_ms", [(None, None), (2.6, 0.9)])
def test_the_fits_path_decomposition_is_the_models_rtt(alpha_land, hop_ms):
    """The calibration fits constants on each pair's route decomposed (land km, cable km, links): under any
    constants, that route priced by them is the model's own core RTT for the pair, and the pairs' attachment kept
    across a fit's rounds gives the routes found afresh."""
    from dataclasses import replace

    params = LatencyParams.load()
    if alpha_land is not None:  # constants far from the shipped ones: other routes win
        params = replace(params, alpha_land=alpha_land, hop_ms=hop_ms)
    m = load_all(fitted_only=True)
    backbone = build_backbone(default_sites(), params.knn, params.max_link_km)
    paths = find_paths(backbone, params, m)
    x = np.array([getattr(params, f) for f in FREE])
    np.testing.assert_allclose(paths.rtt(x), predict(LatencyModel(backbone, params), m), rtol=1e-9)
    assert (paths.links >= 1).all() and (paths.land_km + paths.sea_km >= paths.gc_km * (1 - 1e-9)).all()
    sub = m.iloc[::3].reset_index(drop=True)
    kept = find_paths(backbone, params, sub, pair_geometry(backbone, params, sub))
    fresh = find_paths(backbone, params, sub)
    for a, b in zip((kept.land_km, kept.sea_km, kept.links), (fresh.land_km, fresh.sea_km, fresh.links), strict=True):
        np.testing.assert_array_equal(a, b)


def test_network_weights_weigh_networks_not_pairs():
    """Inside a band, two networks that disagree count by far more alike than their sizes, a set with one pair
    counts little, every band keeps the same total, and a single set gets the plain band weights."""
    rng = np.random.default_rng(0)
    sizes = {("big", "far"): 400, ("small", "far"): 40, ("big", "near"): 40, ("small", "near"): 1}
    m = pd.DataFrame([(s, b) for (s, b), n in sizes.items() for _ in range(n)], columns=["set", "band"])
    resid = rng.normal(0.0, 0.1, len(m)) + np.where(m.set == "small", 0.06, 0.0)
    w = network_weights(m, resid)
    share = pd.Series(w).groupby([m.set, m.band]).sum()
    assert share.groupby(level="band").sum().to_numpy() == pytest.approx([1.0, 1.0])
    assert 0.3 < share["small", "far"] < 0.5  # a tenth of the pairs (plain weights: 0.09), a third or more of the say
    assert share["small", "near"] < 0.2  # one pair: its noise, not the network, dominates
    one = m[m.set == "big"].reset_index(drop=True)
    assert network_weights(one, resid[: len(one)]) == pytest.approx(band_weights(one))


def test_shipped_params_carry_the_cross_validated_error():
    p = LatencyParams.load()
    assert p.alpha_land >= 1 and p.alpha_sea >= 1 and p.short_inflation >= 0 and p.base_ms >= 0
    assert p.meta["leave_one_continent_out"]["median_ape"] <= 0.10
    assert p.meta["leave_one_set_out"]["median_ape"] <= 0.10


def test_paths_longer_than_great_circle_and_inflation_plausible(topo):
    # Bozkurt et al.: Internet RTTs run ~2x the great-circle fibre time; data-centre paths a bit less.
    pops = topo.pops.sample(120, random_state=1)
    la, lo = pops.lat.to_numpy(), pops.lon.to_numpy()
    rtt = core_rtt_ms(la[:, None], lo[:, None], la[None, :], lo[None, :])
    gc = fibre_rtt_ms(haversine_km(la[:, None], lo[:, None], la[None, :], lo[None, :]))
    far = gc > 20
    ratio = np.median(rtt[far] / gc[far])
    assert 1.3 <= ratio <= 2.5


def test_known_routes_detour_through_cables():
    # Sydney - Sao Paulo has no direct cable: the path crosses the Pacific then the Americas.
    model = default_model()
    sydney_sp = core_rtt_ms(-33.87, 151.21, -23.55, -46.63)
    assert sydney_sp > 1.3 * float(fibre_rtt_ms(haversine_km(-33.87, 151.21, -23.55, -46.63)))
    assert np.isfinite(model.node_ms).all()  # the backbone is connected


def test_same_input_same_output():
    a = core_rtt_ms(np.array([10.0, 20.0]), np.array([30.0, 40.0]), np.array([-5.0, 50.0]), np.array([1.0, 2.0]))
    b = core_rtt_ms(np.array([10.0, 20.0]), np.array([30.0, 40.0]), np.array([-5.0, 50.0]), np.array([1.0, 2.0]))
    assert np.array_equal(a, b)


def test_ingress_is_lowest_rtt_pop_and_matrices_include_last_mile(topo):
    d = topo.demand.iloc[::97]
    m = topo.user_pop_rtt(d.lat.to_numpy(), d.lon.to_numpy())
    idx, rtt = topo.ingress(d.lat.to_numpy(), d.lon.to_numpy())
    assert np.array_equal(idx, m.argmin(axis=1)) and np.allclose(rtt, m.min(axis=1))
    bare = topo.user_pop_rtt(d.lat.to_numpy(), d.lon.to_numpy(), last_mile_ms=0.0)
    assert np.allclose(m - bare, topo.last_mile_ms)
    paris = topo.pops.id[topo.ingress([48.86], [2.35])[0][0]]
    assert paris == "CDG"


def test_the_site_matrix_is_the_pair_model_whatever_its_blocks(topo):
    """The users x sites matrix is computed in blocks of rows, one shared distance pass and one entry node at a time:
    the blocks do not show, and each entry is :meth:`core_rtt_ms` of its pair less at most the one hop that the
    pair model spends attaching the site's own coordinates to its node (a 0 km link), inflated as the path is."""
    d = topo.demand.iloc[::41]
    lat, lon = d.lat.to_numpy(), d.lon.to_numpy()
    sites = np.concatenate([topo.pop_nodes[::7], topo.region_nodes(list(topo.regions.id[:5]))])
    m = topo.latency._site_rtt_matrix(lat, lon, sites)
    assert np.array_equal(m, topo.latency._site_rtt_matrix(lat, lon, sites, chunk=37))
    slat, slon = topo.latency.node_lat[sites], topo.latency.node_lon[sites]
    pairs = topo.latency.core_rtt_ms(lat[:, None], lon[:, None], slat[None, :], slon[None, :])
    hop = topo.latency.params.hop_ms * topo.latency.inflation(haversine_km(lat[:, None], lon[:, None], slat, slon))
    assert np.all(pairs - m >= -1e-4) and np.all(pairs - m <= hop + 1e-4)
    assert np.median(pairs - m) > 0.5 * topo.latency.params.hop_ms  # (the hop, not a different model)


def test_haversine_agrees_with_geopy_great_circle():
    from geopy.distance import great_circle

    rng = np.random.default_rng(3)
    pts = rng.uniform([-80, -180, -80, -180], [80, 180, 80, 180], size=(200, 4))
    ours = haversine_km(pts[:, 0], pts[:, 1], pts[:, 2], pts[:, 3])
    ref = [great_circle((a, b), (c, d), radius=6371.0088).km for a, b, c, d in pts]
    assert np.allclose(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (1300, 11), (0, 4)])
def test_distance_matrix_is_haversine_bit_for_bit(shape):
    """The blocked, in-place distance matrix equals the plain broadcast formula exactly (cached matrices and
    nearest-site ties depend on every bit), across block edges, at the poles, antipodes and identical points."""
    from topology.geo import pairwise_km

    rng = np.random.default_rng(shape[0])
    a = rng.uniform([-90, -180], [90, 180], size=(shape[0], 2))
    b = rng.uniform([-90, -180], [90, 180], size=(shape[1], 2))
    if shape[0] >= 7:
        a[:4] = [[90, 0], [-90, 10], [0, 0], b[0]]  # poles, a point of b itself, the antipode of the next row
        a[4] = [-b[1, 0], b[1, 1] - 180]
    expected = haversine_km(a[:, :1], a[:, 1:], b[None, :, 0], b[None, :, 1])
    for rows in (1, 5, 512):
        assert np.array_equal(pairwise_km(a[:, 0], a[:, 1], b[:, 0], b[:, 1], rows=rows), expected)


def test_a_backbone_left_in_pieces_is_joined_and_every_rtt_is_finite():
    """A PoP list of one's own can leave pieces apart: a dense metro whose nearest neighbours are all its own, a
    remote island, a PoP whose nearest neighbours sit across a border with no land link. Each gets one
    terrestrial link to the nearest node outside it across no barred border; the shipped sites need none."""
    from topology.latency import LatencyModel, build_backbone, default_sites

    shipped = build_backbone(default_sites())
    assert not (shipped.links.system == "joined").any()
    extra = [(f"M{i}", -45.0 + 0.01 * i, -120.0, "XX") for i in range(9)]  # a metro in the South Pacific
    extra.append(("ISLAND", -60.0, 0.0, "YY"))
    extra += [(f"PK{i}", 30.0 + 0.01 * i, 66.0, "PK") for i in range(8)]
    extra.append(("IN0", 30.0, 66.005, "IN"))  # its 8 nearest nodes are across the IN-PK border
    sites = pd.concat([default_sites(), pd.DataFrame(extra, columns=["name", "lat", "lon", "cc"]).assign(kind="pop")],
                      ignore_index=True)
    backbone = build_backbone(sites)
    model = LatencyModel(backbone, LatencyParams.load())
    assert np.isfinite(model.node_ms).all()
    joined = backbone.links[backbone.links.system == "joined"]
    assert len(joined) == 3 and (joined.kind == "land").all()
    names, cc = backbone.nodes.name.to_numpy(), backbone.nodes.cc.to_numpy()
    ends = [{names[i], names[j]} for i, j in zip(joined.i, joined.j, strict=True)]
    assert sum(1 for e in ends if any(n.startswith("M") for n in e)) == 1  # one link for the whole metro
    assert any("ISLAND" in e for e in ends)
    (in_link,) = [(i, j) for i, j in zip(joined.i, joined.j, strict=True) if "IN0" in (names[i], names[j])]
    assert "PK" not in {cc[in_link[0]], cc[in_link[1]]}
