"""The ILP's memory tie-breaker and its reported lower bound, on a problem where routing costs nothing: one small
language model at 200 req/s over the whole topology, which every plan serves at 0 ms, so memory alone tells
plans apart."""

import numpy as np
import pytest

from controlplane.catalog import default_catalog
from controlplane.placement import PlacementProblem, get_policy
from edgepop.errors import UserError

MODEL = "@cf/meta/llama-3.2-1b-instruct"


@pytest.fixture(scope="module")
def free_routing(topo):
    problem = PlacementProblem.build(topo, default_catalog(), total_rps=200.0, mix={MODEL: 1.0})
    greedy = get_policy("greedy-demand").place(problem, np.random.default_rng(0))
    assert greedy.objective_ms == 0.0  # every pair served at its own PoP: the plans differ in memory only
    return problem, float(greedy.table.memory_gb.sum())


@pytest.mark.parametrize("tiebreak", [None, 1e-8, 0.0])
def test_at_equal_objective_the_ilp_returns_the_plan_with_least_memory(free_routing, tiebreak):
    """The default tie-breaker is one HiGHS sees (the old 1e-8 ms/GB was under its tolerance: the MILP's plan held
    2,281 replicas, 13,004 GB, where 338 serve the same); and whatever the MILP returns, the plan chosen among
    equally scored ones is the one with least memory."""
    problem, greedy_gb = free_routing
    options = {} if tiebreak is None else {"memory_tiebreak_ms_per_gb": tiebreak}
    plan = get_policy("ilp", **options).place(problem, np.random.default_rng(0))
    solver = plan.solver
    assert plan.objective_ms == 0.0
    gb = float(plan.table.memory_gb.sum())
    assert gb == pytest.approx(greedy_gb)
    assert gb == pytest.approx(min(solver["evaluated_gb"].values()))
    if tiebreak is None:  # the MILP itself found the lean plan
        assert solver["evaluated_gb"]["milp"] == pytest.approx(greedy_gb)


@pytest.mark.parametrize("tiebreak", [None, 1e-8])
def test_the_lower_bound_never_exceeds_a_feasible_plans_cost(free_routing, tiebreak):
    problem, _ = free_routing
    options = {} if tiebreak is None else {"memory_tiebreak_ms_per_gb": tiebreak}
    solver = get_policy("ilp", **options).place(problem, np.random.default_rng(0)).solver
    assert solver["lower_bound_ms"] <= min(solver["start_objectives_ms"].values())
    assert solver["lower_bound_ms"] <= solver["ilp_objective_ms"] and 0 <= solver["milp_gap"] <= 1


@pytest.mark.parametrize("value", [-1e-6, float("inf")])  # (NaN: the registry says "must be a number")
def test_a_bad_tiebreak_is_a_one_line_error(value):
    from controlplane.placement import PLACEMENTS

    with pytest.raises(UserError, match=r"s\.toml \[edge\] placement_options.*memory_tiebreak_ms_per_gb must be "
                                        r"finite and >= 0, got"):
        PLACEMENTS.check("ilp", {"memory_tiebreak_ms_per_gb": value}, "s.toml [edge] placement_options")
    with pytest.raises(UserError, match="memory_tiebreak_ms_per_gb must be finite and >= 0, got") as err:
        get_policy("ilp", memory_tiebreak_ms_per_gb=value)
    assert "\n" not in str(err.value)
