"""greedy-demand's shortcuts change no plan: with each replaced by the plain computation it stands for (every
read of a key's offers a scan of all its takers, with no cached list, stale marks, merge or first offers sorted
all at once; every gain summed offer by offer, the swap search's too; the swap search's removal losses estimated
pair by pair and its removal sets computed node by node; freed nodes' models queued at +inf in one heap), the
same problems give the same placement and the same solver figures, on PoP subsets of the shipped topology with
several identical nodes per PoP (where ties between nodes are many)."""

import heapq
import math

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet
from controlplane.placement import PlacementProblem, get_policy, local_search, takers
from controlplane.placement import greedy as greedy_module
from controlplane.placement.greedy_routing import GreedyRouting

_EPS = 1e-9


def takers_of(net) -> dict[int, dict[int, float]]:
    """Per (site, model) key, the pairs listing the site among their candidates (ascending), pair -> RTT to it."""
    out: dict[int, dict[int, float]] = {}
    for p, m in enumerate(net.pair_model.tolist()):
        for s, r in zip(net.cand_site[p].tolist(), net.cand_rtt[p].tolist(), strict=True):
            if s >= 0:
                out.setdefault(s * net.n_models + m, {})[p] = r
    return out


def plain_offers_at(self, key):
    """A scan of every pair listing the key's site, its entries derived from where its demand is now."""
    if not hasattr(self, "plain_takers"):
        self.plain_takers = takers_of(self.net)
    out = []
    for p, r in self.plain_takers.get(key, {}).items():
        unserved, served = self.unserved[p], self.served[p]
        worst = self.penalty if unserved > _EPS else max((rtt for _, rtt in served.values()), default=0.0)
        if worst - r <= _EPS:
            continue
        if unserved > _EPS:
            out.append((r - self.penalty, p, -1, unserved, r))
        out.extend((r - rtt, p, other, amount, r) for other, (amount, rtt) in served.items() if rtt - r > _EPS)
    return sorted(out)


def no_initial_offers(self):
    pass


def plain_removal_set(self, node, a, b):
    return self._compute_removal_set(node, a, b)


class PlainQueue:
    """greedy's queue as one heap, the models of a node whose GPU time was freed pushed at +inf."""

    def __init__(self, n_nodes=None, n_models=None):  # (the sizes the fast queue is built with)
        self.heap, self.version = [], {}

    def push(self, node, m, value):
        self.version[node, m] = self.version.get((node, m), 0) + 1
        heapq.heappush(self.heap, (-value, node, m, self.version[node, m]))

    def push_unknown(self, entries):
        for node, m in entries:
            self.push(node, m, math.inf)

    def pop(self):
        while self.heap:
            _, node, m, v = heapq.heappop(self.heap)
            if self.version[node, m] == v:
                return node, m, True
        return None

    def best(self):
        return -self.heap[0][0] if self.heap else -math.inf


def plain_gain(self, node, m, capacity):
    total = 0.0
    for neg_gain, _, _, amount, _ in self.offers(node, m):
        if capacity <= _EPS:
            break
        take = min(amount, capacity)
        total -= neg_gain * take
        capacity -= take
    return total


def plain_removal_losses(self, nodes):
    """Pair by pair: the demand a replica serves goes to the pair's first candidate site where another node
    hosts the model with room (the penalty when none does)."""
    st, counts = self.state, self.state.counts
    loss = {}
    for p in range(len(st.served)):
        m = st.pair_model[p]
        for node, (amount, rtt) in st.served[p].items():
            if node not in nodes:
                continue
            if counts[node][m] > 1:
                over = st.flow[node][m] - (counts[node][m] - 1) * st.cap[node][m] * st.util
                if over <= _EPS:
                    loss.setdefault((node, m), 0.0)
                    continue
                amount = amount * min(1.0, over / st.flow[node][m])
            alt = st.penalty
            for s, r in zip(self.net.cand_site[p].tolist(), self.net.cand_rtt[p].tolist(), strict=True):
                if s < 0:
                    break
                if any(o != node and counts[o][m] and st.available(o, m) > _EPS for o in self.nodes_at[s]):
                    alt = r
                    break
            loss[node, m] = loss.get((node, m), 0.0) + amount * max(alt - rtt, 0.0)
    return loss


def problem(topo, seed, **options):
    rng = np.random.default_rng(seed)
    scaled = topo.with_gpu_scale(float(rng.choice([0.3, 1.0, 2.0])))
    pops = sorted(rng.choice(scaled.pops.id.to_numpy(), size=int(rng.integers(5, 30)), replace=False).tolist())
    catalog = default_catalog()
    ids = [s.id for s in catalog]
    mix = {m: float(rng.random()) + 0.05 for m in rng.choice(ids, size=int(rng.integers(2, 9)), replace=False)}
    return PlacementProblem.build(scaled, catalog=catalog, fleet=edge_fleet(scaled, pops),
                                  total_rps=float(rng.choice([20.0, 200.0, 2000.0])), mix=mix,
                                  one_llm_per_gpu=bool(rng.random() < 0.8), **options)


def place(p, seed):
    try:
        return get_policy("greedy-demand").place(p, np.random.default_rng(seed))
    except Exception as err:  # an infeasible problem must fail the same way with and without the shortcuts
        return repr(err)


# The last two: a penalty below some candidates' RTTs, so that some takers never offer (never marked stale
# during construction).
@pytest.mark.parametrize("seed,penalty", [(seed, 1000.0) for seed in range(8)] + [(2, 30.0), (5, 60.0)])
def test_shortcuts_change_no_plan(topo, seed, penalty, monkeypatch):
    p = problem(topo, seed, unserved_penalty_ms=penalty)
    fast = place(p, seed)
    monkeypatch.setattr(GreedyRouting, "_offers_at", plain_offers_at)
    monkeypatch.setattr(GreedyRouting, "_initial_offers", no_initial_offers)
    monkeypatch.setattr(GreedyRouting, "gain", plain_gain)
    monkeypatch.setattr(local_search, "takes_all", lambda capacity, rps: False)  # every swap estimate by gain()
    monkeypatch.setattr(local_search.SwapSearch, "_removal_losses", plain_removal_losses)
    monkeypatch.setattr(local_search.SwapSearch, "_removal_set", plain_removal_set)
    monkeypatch.setattr(greedy_module, "_LazyQueue", PlainQueue)
    plain = place(p, seed)
    if isinstance(fast, str) or isinstance(plain, str):
        assert fast == plain
        return
    pd.testing.assert_frame_equal(fast.table, plain.table)
    assert fast.solver == plain.solver


def test_the_problems_have_several_nodes_per_pop_and_swaps(topo):
    """The problems above are not trivially alike: PoPs with identical nodes, and swaps accepted."""
    several = swapped = 0
    for seed in range(8):
        p = problem(topo, seed)
        sites = p.network().node_site
        several += int(np.bincount(sites).max() > 1)
        placed = place(p, seed)
        swapped += int(not isinstance(placed, str) and placed.solver.get("swaps", 0) > 0)
    assert several >= 4 and swapped >= 2


@pytest.mark.parametrize("seed,penalty", [(0, 1000.0), (1, 1000.0), (3, 1000.0), (2, 30.0), (5, 60.0)])
def test_every_read_of_offers_is_a_fresh_scan(topo, seed, penalty, monkeypatch):
    """Each read of a key's offers (cached, merged from stale marks or scanned) equals a scan of all its takers
    at that moment, during construction and the swap search (where demand moves away again); the marks make the
    cache skip work, never a change."""
    reads = []
    cached = GreedyRouting._offers_at

    def checked(self, key):
        out = cached(self, key)
        assert out == plain_offers_at(self, key)
        reads.append(len(out))
        return out

    monkeypatch.setattr(GreedyRouting, "_offers_at", checked)
    placed = place(problem(topo, seed, unserved_penalty_ms=penalty), seed)
    # (not vacuous: hundreds of offers read; the low-penalty problem reads the fewest, as summed answers from
    # its cached sums whenever no move marked a key's offers since)
    assert not isinstance(placed, str) and sum(reads) > 500, sum(reads)


@pytest.mark.parametrize("seed,penalty", [(0, 1000.0), (3, 1000.0), (2, 30.0)])
def test_every_sum_of_offers_is_the_loop_over_a_fresh_scan(topo, seed, penalty, monkeypatch):
    """Each answer of ``summed`` (the first offers' sums found before their entries are built, or the sums cached
    with a list) equals the loop's over a scan of all the key's takers at that moment, bit for bit."""
    sums = []
    cached = GreedyRouting.summed

    def checked(self, node, m):
        out = cached(self, node, m)
        want_rps = want_total = 0.0
        for neg_gain, _, _, amount, _ in plain_offers_at(self, self.key_base[node] + m):
            want_total -= neg_gain * amount
            want_rps += amount
        assert out == (want_rps, want_total)
        sums.append(out)
        return out

    monkeypatch.setattr(GreedyRouting, "summed", checked)
    placed = place(problem(topo, seed, unserved_penalty_ms=penalty), seed)
    assert not isinstance(placed, str) and len(sums) > 100


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_each_pair_walks_its_own_candidates(topo, seed):
    """Per pair, its stale marks are its candidate keys' and its RTTs its own, nearest first, though pairs with the
    same RTTs share one list."""
    net = problem(topo, seed).network().in_planning_units()
    by_key, marks_of, rtts_of = takers.stale_marks(net)
    for p, m in enumerate(net.pair_model.tolist()):
        valid = net.cand_site[p] >= 0
        assert rtts_of[p] == net.cand_rtt[p][valid].tolist()
        assert [id(d) for d in marks_of[p]] == [id(by_key[s * net.n_models + m]) for s in net.cand_site[p][valid]]
    assert len({id(r) for r in rtts_of}) < len(rtts_of)  # some are shared


def test_first_entries_skip_the_pairs_asked():
    """A key's first entries built with pairs skipped are the whole list's, those pairs' left out."""
    rng = np.random.default_rng(0)
    n = 50
    fields = (-rng.random(n), takers.pair_ids(n), np.array(rng.random(n).tolist(), dtype=object), rng.random(n))
    first = takers.FirstOffers(5, 40)
    whole = takers.first_entries(fields, first, None)
    assert [e[1] for e in whole] == list(range(5, 40)) and all(e[2] == -1 for e in whole)
    for skip in ({}, {7: None, 12: 3.0}, dict.fromkeys(range(5, 40))):
        assert takers.first_entries(fields, first, skip) == [e for e in whole if e[1] not in skip]


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_every_removal_estimate_is_the_pair_by_pair_one(topo, seed, monkeypatch):
    """Each pass's removal losses (and the hosts with room they read, found on whole arrays) equal the pair by
    pair estimate and ``available()``, bit for bit."""
    calls = []
    fast = local_search.SwapSearch._removal_losses

    def checked(self, nodes):
        st = self.state
        room = [[bool(c and st.available(n, m) > _EPS) for m, c in enumerate(row)] for n, row in enumerate(st.counts)]
        assert self._has_room().tolist() == room
        out = fast(self, nodes)
        assert out == plain_removal_losses(self, nodes)
        calls.append(len(out))
        return out

    monkeypatch.setattr(local_search.SwapSearch, "_removal_losses", checked)
    assert not isinstance(place(problem(topo, seed), seed), str)
    assert calls and sum(calls) > 0


@pytest.mark.parametrize("seed,penalty", [(0, 1000.0), (1, 1000.0), (2, 30.0)])
def test_the_first_sums_are_the_loop_sums(topo, seed, penalty):
    """The sums of every key's first offers, found on whole arrays, are the Python loop's, bit for bit."""
    net = problem(topo, seed, unserved_penalty_ms=penalty).network().in_planning_units()
    state = GreedyRouting(net)
    assert state._sums and all(state._sums[key][0] is state._offers[key] for key in state._sums)
    for key, (_, rps, total) in list(state._sums.items()):
        want_rps = want_total = 0.0
        for neg_gain, _, _, amount, _ in state._offers_at(key):  # (the first read builds the entries)
            want_total -= neg_gain * amount
            want_rps += amount
        assert (rps, total) == (want_rps, want_total)


def test_running_sums_add_in_order():
    rng = np.random.default_rng(0)
    values = rng.random(3000) * 10.0 ** rng.integers(-8, 8, 3000)  # magnitudes far apart: order matters
    ends = np.cumsum(rng.choice([1, 2, 3, 4, 5, 8, 9, 16, 17, 100, 1000], 40))
    ends = ends[ends <= len(values)]
    bounds = np.stack([np.r_[0, ends[:-1]], ends], axis=1)
    want = []
    for a, b in bounds.tolist():
        total = 0.0
        for v in values[a:b].tolist():
            total += v
        want.append(total)
    assert takers.running_sums(values, bounds).tolist() == want
    assert want != [float(np.sum(values[a:b])) for a, b in bounds.tolist()]  # pairwise sums differ here


@pytest.mark.parametrize("n_codes", [40, 1 << 20])
def test_sorting_keys_as_16_bit_numbers_is_the_stable_sort(n_codes):
    codes = np.random.default_rng(0).integers(0, n_codes, 5000)
    assert takers._by_code(codes, n_codes).tolist() == np.argsort(codes, kind="stable").tolist()


def drive(queue, seed):
    """greedy's loop on a made-up problem (scores drawn from a few values, so ties are many; random nodes freed
    at each accept): every entry popped, its score, and what became of it."""
    rng = np.random.default_rng(seed)
    for node in range(6):
        for m in range(3):
            queue.push(node, m, float(rng.integers(1, 4)))
    trace = []
    while len(trace) < 400 and (entry := queue.pop()) is not None:
        node, m, weigh = entry
        value = float(rng.integers(0, 4))
        if value < 1:
            trace.append((node, m, value, "dropped"))
        elif not weigh or value < queue.best():
            trace.append((node, m, value, "requeued"))
            queue.push(node, m, value)
        else:
            trace.append((node, m, value, "accepted"))
            queue.push(node, m, value)
            freed = set(rng.choice(6, size=int(rng.integers(0, 4)), replace=False).tolist()) - {node}
            queue.push_unknown([(other, model) for other in freed for model in range(3)])
    return trace


@pytest.mark.parametrize("seed", range(20))
def test_the_queue_takes_freed_nodes_models_as_entries_at_infinity(seed):
    trace = drive(greedy_module._LazyQueue(6, 3), seed)
    assert trace == drive(PlainQueue(6, 3), seed)
    assert sum(what == "accepted" for *_, what in trace) > 20


def test_a_zero_gain_threshold_places_no_replica_that_gains_nothing(topo):
    """``min_gain_ms_per_gb = 0`` (accepted: it means "any gain") placed every replica that fit once nothing
    gained any more: 25,844 replicas on 171 of 173 TB instead of 654, the same objective."""
    problem = PlacementProblem.build(topo, total_rps=2.0, mix={"@cf/meta/llama-3.1-8b-instruct": 1,
                                                               "@cf/baai/bge-base-en-v1.5": 1})
    plans = [get_policy("greedy-demand", min_gain_ms_per_gb=v, swap_passes=0).place(problem, np.random.default_rng(0))
             for v in (1e-7, 0.0)]
    assert len(plans[1].table) == len(plans[0].table)
    assert plans[1].objective_ms == plans[0].objective_ms
