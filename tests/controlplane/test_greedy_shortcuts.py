"""greedy-demand's shortcuts change no plan: with each replaced by the plain computation it stands for (every
read of a key's offers a scan of all its takers, with no cached list, live rows, merge or first offers sorted all
at once; every gain summed offer by offer; the swap search's removal losses estimated pair by pair), the same
problems give the same placement and the same solver figures, on PoP subsets of the shipped topology with several
identical nodes per PoP (where ties between nodes are many)."""

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet
from controlplane.placement import PlacementProblem, get_policy, local_search
from controlplane.placement import greedy as greedy_module

_EPS = 1e-9


def plain_offers_at(self, key):
    return self._compute_offers(self.takers.get(key, {}).items(), [], {})


def no_initial_offers(self):
    pass


def plain_gain(self, node, m, capacity):
    total = 0.0
    for neg_gain, _, _, amount in self.offers(node, m):
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


# The last two: a penalty below some candidates' RTTs, so that some takers never offer (the first offers leave
# them out of the key's live rows).
@pytest.mark.parametrize("seed,penalty", [(seed, 1000.0) for seed in range(8)] + [(2, 30.0), (5, 60.0)])
def test_shortcuts_change_no_plan(topo, seed, penalty, monkeypatch):
    p = problem(topo, seed, unserved_penalty_ms=penalty)
    fast = place(p, seed)
    monkeypatch.setattr(greedy_module._Routing, "_offers_at", plain_offers_at)
    monkeypatch.setattr(greedy_module._Routing, "_initial_offers", no_initial_offers)
    monkeypatch.setattr(greedy_module._Routing, "gain", plain_gain)
    monkeypatch.setattr(local_search.SwapSearch, "_removal_losses", plain_removal_losses)
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
