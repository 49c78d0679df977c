"""The ILP keeps its time budget with its warm start and LP relaxation: each runs in a child process the clock
stops, and the policy says what it left out. Only structure is asserted, never how fast: a step made slow here
sleeps 30 s, so were it not stopped the call would still return (late) and the status checks would fail."""

import time

import numpy as np
import pytest

from controlplane.fleet import edge_fleet
from controlplane.placement import PlacementProblem, get_policy
from controlplane.placement.greedy import GreedyDemand
from controlplane.placement.ilp_model import IlpModel
from edgepop.errors import UserError

SITES = ["BOD", "GVA", "LUX"]  # one L4 each
MODELS = ["@cf/meta/llama-3.2-3b-instruct", "@cf/meta/llama-3.2-1b-instruct"]
STOPPED = "stopped_at_deadline"


@pytest.fixture(scope="module")
def small(topo):
    return PlacementProblem.build(topo, fleet=edge_fleet(topo, SITES), total_rps=20.0, mix={m: 1.0 for m in MODELS})


@pytest.fixture(scope="module")
def large(topo):
    return PlacementProblem.build(topo, total_rps=2000.0)  # greedy takes seconds here, its relaxation too


def _slow(original):
    def slow(*args, **kwargs):
        time.sleep(30.0)
        return original(*args, **kwargs)
    return slow


def test_a_warm_start_the_clock_stops_is_left_out_and_the_rounded_relaxation_remains(small, monkeypatch):
    monkeypatch.setattr(GreedyDemand, "place", _slow(GreedyDemand.place))
    plan = get_policy("ilp", time_limit_s=2.0).place(small, np.random.default_rng(0))
    solver = plan.solver
    assert solver["warm_start_status"] == STOPPED and solver["relaxation_status"] == "optimal"
    assert "greedy-demand" not in solver["evaluated_ms"] and solver["plan"] in ("rounding", "milp")
    assert solver["deterministic"] is False and plan.policy == "ilp"


@pytest.mark.parametrize("warm_start", ["greedy-demand", "rounding"])
def test_a_relaxation_the_clock_stops_falls_back_to_the_warm_start_or_is_a_one_line_error(small, monkeypatch,
                                                                                          warm_start):
    monkeypatch.setattr(IlpModel, "relaxation", _slow(IlpModel.relaxation))
    policy = get_policy("ilp", time_limit_s=2.0, warm_start=warm_start)
    if warm_start == "rounding":  # no plan without the relaxation
        with pytest.raises(UserError, match=r"LP relaxation did not finish within time_limit_s = 2 s; raise "
                                            r"time_limit_s \(edgepop place: --time-limit\)$") as err:
            policy.place(small, np.random.default_rng(0))
        assert "\n" not in str(err.value)
        return
    plan = policy.place(small, np.random.default_rng(0))
    solver = plan.solver
    assert solver["plan"] == "greedy-demand" and solver["status"] == "relaxation stopped at deadline"
    assert solver["warm_start_status"] == "done" and solver["relaxation_status"] == STOPPED
    assert solver["deterministic"] is False and solver["lower_bound_ms"] is None and plan.policy == "ilp"
    assert all(phase["skipped"] for phase in solver["phases"])
    assert plan.objective_ms == get_policy("greedy-demand").place(small, np.random.default_rng(0)).objective_ms


def test_a_budget_too_short_for_greedy_and_the_relaxation_is_a_one_line_error_naming_both(large):
    """Neither greedy (stopped at half the budget) nor the relaxation fits in 0.05 s: before, both ran to their end
    and the policy returned seconds late."""
    with pytest.raises(UserError, match=r"time_limit_s = 0.05 s \(nor did the warm start\); raise time_limit_s "
                                        r"\(edgepop place: --time-limit\)$") as err:
        get_policy("ilp", time_limit_s=0.05).place(large, np.random.default_rng(0))
    assert "\n" not in str(err.value)


def test_the_warm_start_in_its_child_advances_rng_as_it_would_here(small, monkeypatch):
    """The child's draws are handed back: what is drawn after the policy is the same as had greedy run here."""
    original = GreedyDemand.place

    def drawing(self, problem, rng):
        rng.random(7)
        return original(self, problem, rng)

    monkeypatch.setattr(GreedyDemand, "place", drawing)
    rng, expected = np.random.default_rng(0), np.random.default_rng(0)
    plan = get_policy("ilp", time_limit_s=60.0).place(small, rng)
    expected.random(7)
    assert plan.solver["warm_start_status"] == "done"
    assert rng.bit_generator.state == expected.bit_generator.state
