"""greedy-demand's swap search: it finds what plain greedy misses, never worsens the plan, keeps every packing rule."""

import numpy as np
import pandas as pd
import pytest
from kit.controlplane import line_rtt, make_fleet

from controlplane.catalog import default_catalog
from controlplane.placement import PlacementProblem, get_policy
from controlplane.placement.packing import GpuLedger

EXACT = {"warm_start": "none", "mip_rel_gap": 0.0, "time_limit_s": 60.0}
L8B, L1B, L3B = ("@cf/meta/llama-3.1-8b-instruct", "@cf/meta/llama-3.2-1b-instruct",
                 "@cf/meta/llama-3.2-3b-instruct")
L70B = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"  # tensor parallel 2
EMBED = "@cf/baai/bge-base-en-v1.5"


def line_problem(topo, rates, models, gpus_per_node, **options) -> PlacementProblem:
    """Ingress i (the first PoPs of ``topo``) and site s on a line, 10 ms apart; one node per site."""
    rates = np.asarray(rates, dtype=float)
    n_sites = len(gpus_per_node)
    rtt = np.full((len(topo.pops), n_sites), 500.0)
    rtt[:len(rates)] = line_rtt(len(rates), n_sites)
    demand = pd.DataFrame(rates, index=list(topo.pops.id[:len(rates)]), columns=models)
    return PlacementProblem(topo, default_catalog(), make_fleet(gpus_per_node), demand, rtt=rtt, **options)


def greedy(problem, swaps=True, seed=0):
    options = {} if swaps else {"swap_passes": 0}
    return get_policy("greedy-demand", **options).place(problem, np.random.default_rng(seed))


def assert_one_llm_per_gpu(placement):
    exclusive = {m for m in placement.problem.models if placement.problem.catalog[m].generative}
    llm = placement.table[placement.table.model.isin(exclusive)]
    seats = [(node, g) for node, gpus in zip(llm.node, llm.gpu_index, strict=True) for g in gpus]
    assert len(seats) == len(set(seats)), "a GPU computes for two language models"


def test_swap_gives_back_a_gpu_greedy_spent_too_early(topo):
    """Three one-GPU sites 10 ms apart, five ingress PoPs on the same line. The 8B model's thin demand is nearest
    site 2, so its first replica goes there; the 1B model, with ten times the demand and most of it at site 2, is
    left site 1, and the last GPU (site 0) gains the 8B model most. Plain greedy cannot take site 2 back; the swap
    search gives it to the 1B model and reaches the exact optimum, half the objective."""
    rates = [[0.05, 0.0], [0.2, 1.0], [0.05, 3.0], [0.05, 0.0], [0.2, 1.0]]
    problem = line_problem(topo, rates, [L8B, L1B], [1, 1, 1], one_llm_per_gpu=True)
    plain, swapped = greedy(problem, swaps=False), greedy(problem)
    exact = get_policy("ilp", **EXACT).place(problem, np.random.default_rng(0))
    assert plain.counts.tolist() == [[1, 0], [0, 1], [1, 0]]
    assert swapped.counts.tolist() == exact.counts.tolist() == [[1, 0], [0, 1], [0, 1]]
    assert swapped.objective_ms == pytest.approx(exact.objective_ms, rel=1e-6)
    assert swapped.objective_ms < 0.6 * plain.objective_ms
    assert swapped.solver["swaps"] >= 1


def test_swap_to_a_two_gpu_model_takes_both_language_models_off_a_node(topo):
    """Three two-GPU nodes 10 ms apart. The 70B model (two GPUs) has most of the demand, at ingress 1 and 2:
    greedy gives it node 2 and, charged a whole node for it, gives nodes 0 and 1 to the 8B and 1B models, one GPU
    each. Taking both off node 1 for a second 70B replica costs them 10 ms on a little demand and saves the 70B's
    1 rps at ingress 1 its 10 ms: the exact optimum, which a one-for-one swap could not reach."""
    rates = [[0.05, 0.05, 0.55], [1.0, 0.2, 0.05], [3.0, 0.0, 0.2]]
    problem = line_problem(topo, rates, [L70B, L8B, L1B], [2, 2, 2], one_llm_per_gpu=True)
    plain, swapped = greedy(problem, swaps=False), greedy(problem)
    exact = get_policy("ilp", **EXACT).place(problem, np.random.default_rng(0))
    assert plain.counts.tolist() == [[0, 1, 1], [0, 1, 1], [1, 0, 0]]
    assert swapped.counts.tolist() == exact.counts.tolist() == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert swapped.objective_ms == pytest.approx(exact.objective_ms, rel=1e-6)
    swapped.check_memory()
    assert_one_llm_per_gpu(swapped)


def test_swap_never_removes_a_models_last_replica(topo):
    """Two-GPU nodes at both ends, a one-GPU node between; the 70B model's demand dwarfs the others', so a second
    70B replica would gain more than leaving the 1B model's 0.15 rps unserved costs at the penalty. A plan must
    keep a replica of every model."""
    rates = [[3.0, 0.05, 0.05], [0.05, 0.05, 0.05], [3.0, 0.05, 0.05]]
    problem = line_problem(topo, rates, [L70B, L8B, L1B], [2, 1, 2], one_llm_per_gpu=True)
    swapped = greedy(problem)
    assert (swapped.counts.sum(axis=0) >= 1).all()
    assert swapped.objective_ms <= greedy(problem, swaps=False).objective_ms + 1e-9


def random_problem(topo, seed):
    """Small line problems with one- and two-GPU nodes, language models (the 70B among them) and an encoder."""
    rng = np.random.default_rng(seed)
    n_sites = int(rng.integers(3, 6))
    gpus = rng.choice([1, 1, 2], size=n_sites).tolist()
    models = [L8B, L1B, L3B, L70B, EMBED][:int(rng.integers(2, 6))]
    rates = rng.choice([0.0, 0.05, 0.2, 0.5, 1.0, 3.0], size=(n_sites + int(rng.integers(0, 3)), len(models)))
    rates[0] += 0.05  # every model demanded
    return line_problem(topo, rates, models, gpus, one_llm_per_gpu=bool(rng.integers(0, 4)))


@pytest.mark.parametrize("seed", range(24))
def test_swap_search_never_worsens_and_keeps_packing_rules(topo, seed):
    problem = random_problem(topo, seed)
    plain, swapped = greedy(problem, swaps=False), greedy(problem)
    # what the search guarantees on its own routing, and what the evaluator then sees on these problems
    assert swapped.solver["routed_ms"] <= swapped.solver["routed_ms_before_swaps"] + 1e-9
    assert swapped.objective_ms <= plain.objective_ms + 1e-9
    swapped.check_memory()
    if problem.one_llm_per_gpu:
        assert_one_llm_per_gpu(swapped)
    assert (swapped.counts.sum(axis=0) > 0).all()
    assert (swapped.counts <= swapped.net.max_replicas).all()


def test_random_problems_exercise_the_swaps(topo):
    """The parametrised problems above are not all trivially left alone by the search."""
    swaps = [greedy(random_problem(topo, seed)).solver["swaps"] for seed in range(24)]
    assert sum(s > 0 for s in swaps) >= 4


def test_swap_search_is_deterministic(topo):
    problem = line_problem(topo, [[0.05, 0.0], [0.2, 1.0], [0.05, 3.0], [0.05, 0.0], [0.2, 1.0]], [L8B, L1B],
                           [1, 1, 1], one_llm_per_gpu=True)
    a, b = greedy(problem, seed=1), greedy(problem, seed=2)
    assert a.solver["swaps"] >= 1
    pd.testing.assert_frame_equal(a.table, b.table)
    assert a.solver == b.solver


def test_ledger_remove_restores_the_gpus(topo):
    problem = line_problem(topo, [[1.0, 1.0, 1.0]], [L70B, L8B, EMBED], [2], one_llm_per_gpu=True)
    ledger = GpuLedger(problem.network())
    first = ledger.add(0, 1)
    ledger.add(0, 2)
    assert ledger.slot(0, 0) is None  # one GPU computes for the 8B model: no room for a two-GPU replica
    free_before = ledger.free[0].copy()
    assert ledger.remove(0, 1) == first
    assert not ledger.solo[0].any()
    assert ledger.slot(0, 0) == (0, 1)
    assert ledger.free[0][list(first)] == pytest.approx(free_before[list(first)] + ledger.net.bytes_per_gpu[1])
    assert [m for m, _ in ledger.held[0]] == [2]
