"""The nearest-k helper gives exactly the first k columns of a stable full sort, ties included; candidate lists
cut for all ingresses at once, or built for the pairs a workload names, equal those built one ingress at a
time; a placement network's nearest sites per demand pair are a stable full sort of the allowed sites' RTTs."""

import itertools
from bisect import bisect_right
from types import SimpleNamespace

import numpy as np
import pytest
from kit.controlplane import LLAMA, TINY, make_fleet, placement

from controlplane import candidates
from controlplane.candidates import FEW_SITES
from controlplane.ordering import RttRow, SiteRtts, candidate_slots, first_k_stable, window_end
from controlplane.placement.network import Network
from controlplane.state import ClusterState


@pytest.mark.parametrize("seed", range(5))
def test_first_k_equals_a_stable_full_sort(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        rows, cols = int(rng.integers(1, 12)), int(rng.integers(1, 500))
        values = rng.integers(0, 25, (rows, cols)).astype(float)  # many ties, also at the cut
        k = int(rng.integers(1, cols + 1))
        expected = np.argsort(values, axis=1, kind="stable")[:, :k]
        assert np.array_equal(first_k_stable(values, k), expected)


@pytest.mark.parametrize("seed", range(3))
def test_first_k_equals_a_stable_full_sort_with_few_ties(seed):
    """Distinct values in most rows (the partition's own choice stands), a few repeated columns and unreachable
    (infinite) ones in others (those rows choose ties by column)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        rows, cols = int(rng.integers(1, 20)), int(rng.integers(2, 700))
        values = rng.random((rows, cols)) * 300
        some = rng.random(rows) < 0.3
        values[some, rng.integers(0, cols)] = values[some, rng.integers(0, cols)]  # a tie in those rows
        values[rng.random((rows, cols)) < 0.05] = np.inf
        k = int(rng.integers(1, max(2, cols // 4)))
        expected = np.argsort(values, axis=1, kind="stable")[:, :k]
        assert np.array_equal(first_k_stable(values, k), expected)


def plain_slots(sizes, order, n):
    """candidate_slots one row at a time: the groups in the row's order, each group's members in turn, up to
    n."""
    start = np.cumsum(sizes) - sizes
    slots, members = [], []
    for row in order.tolist():
        slot, member = [], []
        for i, g in enumerate(row):
            for j in range(int(sizes[g])):
                slot.append(i)
                member.append(int(start[g]) + j)
        slots.append(slot[:n])
        members.append(member[:n])
    return slots, members


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("one_each", [False, True])
def test_candidate_slots_take_each_groups_members_in_the_rows_order(seed, one_each):
    """With several members per group or one each (a large edge: one replica of a model per PoP), and lists
    cut short or not."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n_groups, rows = int(rng.integers(1, 60)), int(rng.integers(1, 9))
        sizes = np.ones(n_groups, dtype=np.int64) if one_each else rng.integers(1, 4, n_groups)
        n = int(rng.integers(1, 2 * int(sizes.sum()) + 2))
        k = min(n_groups, n)  # the first k groups of each row always hold enough members
        order = np.argsort(rng.random((rows, n_groups)), axis=1)[:, :k]
        slot, member = candidate_slots(sizes, order, n)
        assert (slot.tolist(), member.tolist()) == plain_slots(sizes, order, n)


@pytest.mark.parametrize("seed", range(4))
def test_nearest_sites_of_each_pair_are_a_stable_sort_of_its_models_sites(seed):
    """Per demand pair, the k nearest sites its model may use, in (RTT, site) order, padded with -1 / inf: also when
    models share one mask (their rows are sorted together) and when a model may use no site at all."""
    rng = np.random.default_rng(seed)
    n_ingress, n_sites, n_models = int(rng.integers(1, 30)), int(rng.integers(1, 80)), int(rng.integers(1, 7))
    rtt = rng.integers(0, 9, (n_ingress, n_sites)).astype(float)  # many ties
    demand = rng.random((n_ingress, n_models)) < 0.6
    ingress, model = np.nonzero(demand)
    net = SimpleNamespace(n_sites=n_sites, n_models=n_models, rtt=rtt, pair_ingress=ingress, pair_model=model,
                          pair_demand=np.ones(len(ingress)))
    shared = rng.random(n_sites) < 0.5
    mask = np.column_stack([shared if rng.random() < 0.6 else rng.random(n_sites) < rng.random()
                            for _ in range(n_models)])
    for k in (1, 3, n_sites, n_sites + 5):
        site, near = Network.nearest_sites(net, mask, k)
        kk = min(k, n_sites)
        assert site.shape == near.shape == (len(ingress), kk)
        for p, (i, m) in enumerate(zip(ingress, model, strict=True)):
            allowed = np.flatnonzero(mask[:, m])
            want = allowed[np.argsort(rtt[i, allowed], kind="stable")][:kk]
            assert site[p, :len(want)].tolist() == want.tolist()
            assert near[p, :len(want)].tolist() == rtt[i, want].tolist()
            assert (site[p, len(want):] == -1).all() and np.isinf(near[p, len(want):]).all()


@pytest.mark.parametrize("seed", range(4))
def test_precomputed_candidates_equal_the_per_ingress_lists(catalog, seed):
    """The candidate lists cut from all rows at once, and those built for a workload's (ingress, model) pairs, are
    those one ingress's lookup builds: same replicas, same order, same RTTs, with several replicas per site, ties
    in RTT, lists cut short or not, and models on few sites (shared lists) or many."""
    rng = np.random.default_rng(seed)
    n_sites, n_ingress = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    nodes = rng.integers(0, n_sites, int(rng.integers(n_sites, 3 * n_sites)))
    nodes[:n_sites] = np.arange(n_sites)  # every site has a node
    fleet = make_fleet([8] * len(nodes), sites=nodes.tolist())
    models = (TINY, LLAMA)
    random_table = placement([(m, n) for n in range(len(nodes)) for m in models if rng.random() < 0.7]
                             or [(TINY, 0)])
    same_layout = placement([(m, n) for n in range(len(nodes)) for m in models])  # one ordering for both models
    rtt = rng.integers(0, 6, (n_ingress, n_sites)).astype(float)
    for table, max_candidates in itertools.product((random_table, same_layout), (None, 1, 3, 64)):
        lazy = ClusterState(catalog, fleet, table, rtt, max_candidates=max_candidates)
        eager = ClusterState(catalog, fleet, table, rtt, max_candidates=max_candidates)
        eager.precompute()
        # the pairs a workload names (repeats, models absent from the placement, ingresses left out)
        ingresses = rng.integers(0, n_ingress, 30)
        codes = rng.integers(0, len(models), 30)
        pairs = ClusterState(catalog, fleet, table, rtt, max_candidates=max_candidates)
        pairs.precompute_pairs(ingresses, codes, list(models))
        named = {(int(i), models[c]) for i, c in zip(ingresses, codes, strict=True) if models[c] in lazy.by_model}
        assert set(pairs._cand) == {(i, m, False) for i, m in named}
        pairs.precompute_pairs([], [], list(models))  # a workload without requests names no pairs
        assert set(pairs._cand) == {(i, m, False) for i, m in named}
        for ingress in range(n_ingress):
            for m in models:
                if m not in lazy.by_model:
                    continue
                expected = lazy.candidates(ingress, m)
                built = [eager._cand[(ingress, m, False)]]
                if (ingress, m) in named:
                    built.append(pairs._cand[(ingress, m, False)])
                for got in built:
                    assert [r.id for r in got[0]] == [r.id for r in expected[0]]
                    assert list(got[1]) == list(expected[1])
        for state in (lazy, eager, pairs):
            assert_near_mirrors_the_cache(state)


def assert_near_mirrors_the_cache(state) -> None:
    """The routers' by-row index of the not full lists holds exactly the cache's entries, the same objects."""
    cached = {(int(i), m): hit for (i, m, full), hit in state._cand.items() if not full}
    indexed = {(i, m): hit for m, row in state._near.items() for i, hit in enumerate(row) if hit is not None}
    assert cached.keys() == indexed.keys() and all(indexed[k] is cached[k] for k in cached)
    assert all(len(row) == len(state.rtt) for row in state._near.values())


def test_the_by_row_index_follows_the_cache_through_builds_and_clears(catalog):
    """Lists built on demand (full or not, an ingress given as a numpy integer), cut for every ingress or for a
    workload's pairs appear in the routers' by-row index as in the cache; a replica added or an RTT change clears
    both, and the lists built again are the new ones."""
    fleet = make_fleet([8] * 4, sites=[0, 1, 2, 2])
    rtt = np.array([[1.0, 5.0, 9.0], [9.0, 1.0, 5.0], [5.0, 9.0, 1.0]])
    state = ClusterState(catalog, fleet, placement([(TINY, n) for n in range(3)]), rtt, max_candidates=2)
    state.candidates(1, TINY)
    state.candidates(2, TINY, full=True)
    state.candidates(np.int64(0), TINY)
    assert_near_mirrors_the_cache(state)
    assert state._near[TINY][1] is state._cand[(1, TINY, False)] and state._near[TINY][2] is None
    state.precompute()
    assert_near_mirrors_the_cache(state)
    state.add_replica(catalog[TINY], 3)
    assert state._cand == {} and state._near == {}
    state.precompute_pairs([0, 2], [0, 0], [TINY])
    assert_near_mirrors_the_cache(state)
    assert [r.site for r in state._near[TINY][2][0]] == [2, 2]
    state.set_rtt(rtt[::-1].copy())
    assert state._cand == {} and state._near == {}
    state.candidates(0, TINY)
    assert_near_mirrors_the_cache(state)
    assert [r.site for r in state._near[TINY][0][0]] == [2, 2]


def test_site_rtts_reads_as_the_list_it_stands_for():
    site_rtt, pos = [5.0, 1.0, 3.0], [1, 1, 2, 0, 0]
    plain = [site_rtt[p] for p in pos]
    view = SiteRtts(site_rtt, pos)
    assert len(view) == len(plain) and list(view) == plain and view == plain and plain == view
    assert [view[i] for i in range(len(view))] == plain and view[-1] == plain[-1]
    assert view[1:4] == plain[1:4] and view[:0] == []
    assert all(bisect_right(view, x) == bisect_right(plain, x) for x in (0.0, 1.0, 2.0, 3.0, 9.0))
    assert view != [1.0] and list(zip(view, "abcde", strict=True))[2] == (3.0, "c")


def test_rtt_rows_read_as_the_lists_they_stand_for():
    """An RttRow (RTTs as C doubles) gives the same floats as the list it replaces: index, slice, iterate, bisect,
    compare equal either way round."""
    values = np.array([[0.0, 1.0, 2.5, 2.5, 1e-300, 7.0], [3.0, 0.1 + 0.2, 4.0, 4.0, 5.0, 9.5]])
    values[0] = np.sort(values[0])
    rows = RttRow.rows(values)
    assert len(rows) == 2 and RttRow.rows(np.zeros((3, 0))) == [[], [], []]
    for row, plain in zip(rows, values.tolist(), strict=True):
        assert type(row) is RttRow and len(row) == len(plain) and list(row) == plain and row == plain
        assert plain == row and not row != plain and row != plain[:-1]
        assert all(type(row[i]) is float and row[i] == plain[i] for i in range(len(plain)))
        assert list(row[1:4]) == plain[1:4] and row[-1] == plain[-1]
        assert all(bisect_right(row, x) == bisect_right(plain, x) for x in (0.0, 1.0, 2.5, 4.0, 9.5, 10.0))
        assert all(window_end(row, x, 1, 5) == bisect_right(plain, x, 1, 5) for x in (0.0, 2.5, 5.0))
    with pytest.raises(TypeError):
        hash(rows[0])


@pytest.mark.parametrize("rows_from", [0, 10**9])
def test_lists_of_models_on_many_sites_precompute_their_rtts_as_rows(catalog, monkeypatch, rows_from):
    """Models on more than FEW_SITES sites get their lists cut from sorted rows, with RttRow RTTs where a layout's
    lists hold RTT_ROWS_FROM or more (lists of floats below): the same values as the lists one ingress's lookup
    builds."""
    monkeypatch.setattr(candidates, "RTT_ROWS_FROM", rows_from)
    rng = np.random.default_rng(11)
    n_sites, n_ingress = FEW_SITES + 16, 9
    fleet = make_fleet([8] * n_sites, sites=list(range(n_sites)))
    table = placement([(m, n) for n in range(n_sites) for m in (TINY, LLAMA)])
    rtt = rng.integers(0, 40, (n_ingress, n_sites)) * 0.7
    lazy = ClusterState(catalog, fleet, table, rtt, max_candidates=16)
    eager = ClusterState(catalog, fleet, table, rtt, max_candidates=16)
    eager.precompute_pairs(np.arange(n_ingress).repeat(2), np.tile([0, 1], n_ingress), [TINY, LLAMA])
    for ingress in range(n_ingress):
        for m in (TINY, LLAMA):
            got, expected = eager._cand[(ingress, m, False)], lazy.candidates(ingress, m)
            assert type(got[1]) is (RttRow if rows_from == 0 else list)
            assert [r.id for r in got[0]] == [r.id for r in expected[0]]
            assert list(got[1]) == list(expected[1]) and len(got[1]) == 16


def test_window_end_bisects_lists_and_site_views_alike():
    rng = np.random.default_rng(3)
    site_rtt = rng.choice([1.0, 2.5, 2.5, 4.0, 7.5, 10.0], size=12).tolist()
    pos = sorted(rng.integers(0, 12, size=40).tolist(), key=lambda p: site_rtt[p])  # ascending RTTs, repeats
    plain = [site_rtt[p] for p in pos]
    view = SiteRtts(site_rtt, pos)
    for x in (0.0, 1.0, 2.5, 3.0, 7.5, 11.0):
        for lo, hi in ((0, 40), (1, 40), (5, 30), (39, 40), (40, 40)):
            expected = bisect_right(plain, x, lo, hi)
            assert window_end(plain, x, lo, hi) == window_end(view, x, lo, hi) == expected
            # the first index past the window: every value before it (from lo) is at most x
            assert all(v <= x for v in plain[lo:expected]) and (expected == hi or plain[expected] > x)
