"""The ILP at extreme load: demand far beyond the fleet, where every replica serves a sliver of it. A fixed
memory price per GB then outweighed what a replica serves: the MILP kept one replica and the policy returned
it (999.9999 ms) over the greedy warm start's 1,042 replicas, which the evaluator scores better (999.9549 ms)."""

import numpy as np
import pytest

import controlplane.placement.ilp_model as ilp_model
from controlplane.catalog import default_catalog
from controlplane.placement import PlacementProblem, get_policy
from controlplane.placement.ilp import choose_plan
from controlplane.placement.ilp_model import IlpModel

LLAMA_70B = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
LLAMA_8B = "@cf/meta/llama-3.1-8b-instruct"


def overloaded(topo, model: str, rps: float) -> PlacementProblem:
    return PlacementProblem.build(topo, default_catalog(), total_rps=rps, mix={model: 1.0})


@pytest.mark.parametrize(("model", "rps"), [(LLAMA_70B, 1e8), (LLAMA_8B, 1e9)])
def test_the_milp_keeps_the_replicas_that_serve_demand(topo, model, rps):
    """Without a warm start the MILP's own plan must serve what greedy's does (its memory price is capped by
    what a replica's capacity is worth, not fixed per GB)."""
    problem = overloaded(topo, model, rps)
    greedy = get_policy("greedy-demand").place(problem, np.random.default_rng(0))
    plan = get_policy("ilp", warm_start="none", time_limit_s=60.0).place(problem, np.random.default_rng(0))
    assert plan.solver["plan"] == "milp"
    assert plan.objective_ms <= greedy.objective_ms + 1e-6
    assert len(plan.table) > 100  # (it kept 1 replica)


def test_the_policy_returns_the_best_scored_plan_whatever_memory_costs(topo, monkeypatch):
    """Memory priced per GB whatever the load, as the MILP once did: its plan drops replicas, and the policy must
    still return the plan the evaluator scores best (memory decides only at equal objective)."""
    monkeypatch.setattr(ilp_model, "TIEBREAK_SHARE_OF_WORTH", np.inf, raising=False)
    problem = overloaded(topo, LLAMA_70B, 1e8)
    plan = get_policy("ilp", time_limit_s=60.0).place(problem, np.random.default_rng(0))
    scores = plan.solver["evaluated_ms"]
    assert scores["milp"] > min(scores.values()) + 1e-3  # the situation this test is about
    assert plan.objective_ms == pytest.approx(min(scores.values()), abs=1e-6)
    assert plan.solver["plan"] == "greedy-demand"


def test_memory_decides_only_among_equally_scored_plans():
    assert choose_plan({"milp": 1.0, "greedy-demand": 1.0 + 1e-6}, {"milp": 9e4, "greedy-demand": 1.0}) == "milp"
    assert choose_plan({"milp": 1.0, "greedy-demand": 1.0 + 1e-12}, {"milp": 9e4, "greedy-demand": 1.0}) == \
        "greedy-demand"
    assert choose_plan({"milp": 0.0, "rounding": 0.0}, {"milp": 5.0, "rounding": 5.0}) == "milp"
    assert choose_plan({"rounding": 999.9, "milp": 999.9 + 1e-7}, {"rounding": 9.0, "milp": 1.0}) == "milp"


def test_at_ordinary_load_memory_is_priced_per_gb(topo):
    """The cap binds only where a replica's capacity is a sliver of the demand: at 20,000 req/s every replica's
    price is the plain per-GB one, so ordinary problems' MILPs are unchanged."""
    problem = PlacementProblem.build(topo, default_catalog(), total_rps=20_000.0)
    net = problem.network().in_planning_units()
    model = IlpModel(net, 8, 1e-6)
    priced = 1e-6 * net.replica_bytes[model.unit_model] / 1e9
    assert np.array_equal(model.cost[model.prog.n:], priced)
