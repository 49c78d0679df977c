"""Anycast ingress: a repeated query reuses the last answer, any change of input computes it again."""

import copy

import numpy as np
import pytest

from topology.world import Topology


def _fresh(topo, lat, lon, last_mile=None):
    m = topo.user_pop_rtt(lat, lon, last_mile)
    idx = np.argmin(m, axis=1)
    return idx, m[np.arange(len(idx)), idx]


def test_the_last_answer_is_reused_only_for_the_same_query(topo, monkeypatch):
    topo = copy.copy(topo)
    d = topo.demand.iloc[:500]
    lat, lon = d.lat.to_numpy(), d.lon.to_numpy()
    first = topo.ingress(lat, lon)
    for got, want in zip(first, _fresh(topo, lat, lon), strict=True):
        np.testing.assert_array_equal(got, want)
    first[0][:] = -1  # callers own what they get
    with monkeypatch.context() as m:
        m.setattr(Topology, "_ingress", lambda *a, **k: pytest.fail("recomputed the same query"))
        again = topo.ingress(lat.copy(), lon.copy(), np.full(len(lat), topo.last_mile_ms))  # equal values
    np.testing.assert_array_equal(again[0], _fresh(topo, lat, lon)[0])
    # Other points, another last mile, another latency model or PoP table: computed again.
    for args, change in (((lat + 1.0, lon), None), ((lat, lon, 25.0), None), ((lat, lon), "latency"),
                         ((lat, lon), "pops")):
        if change == "latency":
            topo.latency = copy.copy(topo.latency)
            topo.latency.node_ms = topo.latency.node_ms + 1.0
            topo.latency._digest = None
        if change == "pops":
            topo.pops = topo.pops.iloc[:-1]
        got = topo.ingress(*args)
        for g, w in zip(got, _fresh(topo, *args), strict=True):
            np.testing.assert_array_equal(g, w)


def test_imperfect_anycast_moves_a_seeded_share_of_locations_to_their_second_best_pop(topo):
    from edgepop.errors import UserError

    d = topo.demand
    lat, lon = d.lat.to_numpy(), d.lon.to_numpy()
    ideal_idx, ideal_rtt = topo.ingress(lat, lon)
    assert topo.with_anycast(0.0, seed=5) is topo
    skewed = topo.with_anycast(0.2, seed=5)
    idx, rtt = skewed.ingress(lat, lon)
    moved = idx != ideal_idx
    assert 0.18 < moved.mean() < 0.22  # the share asked for, of the demand cities
    m = topo.user_pop_rtt(lat[moved], lon[moved])
    second = np.argsort(m, axis=1, kind="stable")[:, 1]
    np.testing.assert_array_equal(idx[moved], second)  # each to its second-lowest-RTT PoP, at that RTT
    np.testing.assert_allclose(rtt[moved], m[np.arange(len(second)), second])
    assert (rtt >= ideal_rtt).all() and (rtt[~moved] == ideal_rtt[~moved]).all()
    # the catchment is the location's: the same in a query of a few of them, and again for the same seed
    np.testing.assert_array_equal(skewed.ingress(lat[:50], lon[:50])[0], idx[:50])
    np.testing.assert_array_equal(topo.with_anycast(0.2, seed=5).ingress(lat, lon)[0], idx)
    other = topo.with_anycast(0.2, seed=6).ingress(lat, lon)[0]
    assert (other != idx).any()  # another seed, other catchments
    everyone = topo.with_anycast(1.0, seed=5).ingress(lat, lon)[0]
    assert (everyone != ideal_idx).all()
    for bad in (1.5, True, "0.2"):
        with pytest.raises(UserError, match=r"anycast misroute share must be in \[0, 1\], got"):
            topo.with_anycast(bad)
    assert topo.with_anycast(np.float32(0.2), seed=5).anycast_misroute == pytest.approx(0.2)


def test_the_location_hash_is_the_locations_own():
    from topology.world import location_hash

    lat, lon = np.array([0.0, -0.0, 12.5, 12.5]), np.array([10.0, 10.0, -3.0, -3.0])
    h = location_hash(lat, lon, 1)
    assert h[0] == h[1] and h[2] == h[3] and h[0] != h[2]  # -0.0 is 0.0; the same point, the same number
    np.testing.assert_array_equal(location_hash(lat[2:], lon[2:], 1), h[2:])  # whatever comes with it
    assert ((0 <= h) & (h < 1)).all() and (location_hash(lat, lon, 2) != h).all()


def test_the_city_table_follows_the_anycast_of_its_topology(topo):
    from sim.arrivals import city_table

    world = copy.copy(topo)
    ideal = city_table(world).ingress.copy()
    world.anycast_misroute, world.anycast_seed = 0.2, 1  # changed in place: the cached table must not serve
    skewed = city_table(world).ingress
    d = world.demand
    np.testing.assert_array_equal(skewed, world.ingress(d.lat.to_numpy(), d.lon.to_numpy())[0])
    assert (skewed != ideal).mean() > 0.15


def test_coordinates_are_checked_not_broadcast(topo):
    """Two latitudes and one longitude were broadcast into an answer for a place nobody asked about; a latitude of
    200 or NaN got a PoP; one user given as scalars failed deep in numpy; a region id given as a string was read
    letter by letter."""
    import math

    import numpy as np
    import pytest

    from edgepop.errors import UserError

    with pytest.raises(UserError, match="of one length"):
        topo.ingress(np.array([51.5, 35.7]), np.array([-0.1]))
    for lat in (200.0, math.nan):
        with pytest.raises(UserError, match=r"latitudes must be in \[-90, 90\]"):
            topo.ingress(lat, 0.0)
    with pytest.raises(UserError, match="latitudes must be"):
        topo.core_rtt_ms(200.0, 0.0, 0.0, 0.0)
    with pytest.raises(UserError, match="unknown region id"):
        topo.user_region_rtt(51.5, -0.1, ["aws:nope"])
    idx, rtt = topo.ingress(51.5, -0.1)  # London, as one user
    assert idx.shape == rtt.shape == (1,) and topo.pops.id.iloc[int(idx[0])] == "LHR"
    assert topo.user_region_rtt(51.5, -0.1, "aws:us-east-1").shape == (1, 1)


def test_the_api_uses_its_topologys_last_mile_mode_for_any_point():
    beijing, paris = ([39.9], [116.4]), ([48.86], [2.35])
    for mode in ("country", "continent"):
        topo = Topology.load(last_mile=mode)
        d = topo.demand
        for (lat, lon), cc in ((beijing, "CN"), (paris, "FR")):
            own = topo.demand_last_mile_ms()[np.flatnonzero(d.cc.to_numpy() == cc)[0]]
            core = topo.user_pop_rtt(lat, lon, 0.0)
            assert topo.user_pop_rtt(lat, lon) == pytest.approx(core + own, abs=1e-4)
            assert topo.ingress(lat, lon)[1] == pytest.approx(core.min() + own, abs=1e-4)
    fixed = Topology.load()
    assert fixed.user_pop_rtt(*paris) == pytest.approx(fixed.user_pop_rtt(*paris, 0.0) + fixed.last_mile_ms)
