"""The ILP's options are checked when a scenario is read: each bad value is a one-line error naming it."""

import numpy as np
import pytest

from controlplane.fleet import edge_fleet
from controlplane.placement import PLACEMENTS, PlacementProblem, get_policy
from controlplane.placement.central import Central
from edgepop.errors import UserError

WHERE = "s.toml [edge] placement_options"


@pytest.mark.parametrize(("options", "message"), [
    ({"exact_max_integers": -5}, "exact_max_integers must be >= 0, got -5"),
    ({"mip_rel_gap": float("inf")}, "mip_rel_gap must be finite and >= 0, got inf"),
    ({"mip_rel_gap": -0.1}, "mip_rel_gap must be finite and >= 0, got -0.1"),
    ({"warm_start": "central"}, "warm_start 'central' places on a fleet of its own"),
])
def test_a_bad_option_is_refused_when_read(options, message):
    with pytest.raises(UserError, match=rf"s\.toml \[edge\] placement_options: .*{message}") as err:
        PLACEMENTS.check("ilp", options, WHERE)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=message):
        get_policy("ilp", **options)


def test_a_warm_start_on_its_own_fleet_is_still_refused_at_placement(topo, monkeypatch):
    """A policy that builds its own fleet without saying so passes the check when read; its plan is refused."""
    monkeypatch.setattr(Central, "own_fleet", False)
    problem = PlacementProblem.build(topo, fleet=edge_fleet(topo, ["BOD", "GVA", "LUX"]), total_rps=20.0,
                                     mix={"@cf/meta/llama-3.2-1b-instruct": 1.0})
    policy = get_policy("ilp", warm_start="central", time_limit_s=10.0)
    with pytest.raises(UserError, match="warm_start 'central' places on a fleet of its own") as err:
        policy.place(problem, np.random.default_rng(0))
    assert "\n" not in str(err.value)


def test_a_branch_and_bound_stopped_by_its_node_limit_reads_node_limit():
    """HiGHS stops some searches at ``node_limit`` with its "solution limit" status, which scipy passes on as a
    status it does not recognize: the phase still says why it stopped."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    from controlplane.placement.ilp import _phase

    rng = np.random.default_rng(0)  # a 40-item, 5-constraint knapsack: the root node does not settle it
    c, a = -rng.integers(10, 100, 40).astype(float), rng.integers(5, 60, (5, 40)).astype(float)
    res = milp(c, constraints=LinearConstraint(a, -np.inf, a.sum(axis=1) / 3), integrality=np.ones(40),
               bounds=Bounds(0, 1), options={"node_limit": 1, "presolve": False})
    assert "HiGHS Status 16" in res.message  # (what this test is about: scipy's status is not 1)
    phase = _phase("exact", res)
    assert phase["status"] == "node limit" and phase["objective_ms"] == round(float(res.fun), 6)
