"""A policy's plan is checked when its Placement is built: indices in range, integers, ``tensor_parallel`` distinct
GPUs of the node, GPU memory within its limit. A bad plan is one InvalidPlacementError naming the policy, the
replica and the bound (also through ``edgepop place``); shipped policies' plans pass (tests/controlplane/
test_placement.py checks every policy)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet
from controlplane.placement import PLACEMENTS, Placement, PlacementPolicy, PlacementProblem
from edgepop.cli import main
from edgepop.errors import UserError

L8 = "@cf/meta/llama-3.1-8b-instruct"  # 21.4 GB per GPU: three fit an 80 GB H100
L70 = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"  # tensor_parallel 2
E = "@cf/baai/bge-base-en-v1.5"
# AMS-0 (row 0): 8 x H100 80 GB; AMS-1 (row 1): 2 x L40S 48 GB; FRA-0 (row 2), FRA-1 (row 3) alike.
OK = [(0, 0, (0,)), (2, 0, (1,)), (0, 1, (2, 3)), (1, 2, (0,))]


@pytest.fixture(scope="module")
def problem(topo):
    fleet = edge_fleet(topo, ["AMS", "FRA"])
    demand = pd.DataFrame({L8: [5.0], L70: [1.0], E: [2.0]}, index=["AMS"])
    return PlacementProblem(topo=topo, catalog=default_catalog(), fleet=fleet, demand=demand)


def build(problem, placed, policy="mine"):
    return Placement(problem, problem.fleet, policy, placed)


def test_a_valid_plan_is_accepted_numpy_integers_too(problem):
    p = build(problem, [(np.int64(n), np.int32(m), tuple(np.int64(g) for g in gs)) for n, m, gs in OK])
    assert len(p.table) == 4 and list(p.table.node) == [0, 0, 1, 2]
    p.check_memory()


@pytest.mark.parametrize("extra, message", [
    ((4, 0, (0,)), r"placed\[4\] = \(4, 0, \(0,\)\) names node row 4; fleet 'edge' has node rows 0 to 3$"),
    ((99, 0, (0,)), "names node row 99; fleet 'edge' has node rows 0 to 3"),
    ((-1, 0, (0,)), "names node row -1; fleet 'edge' has node rows 0 to 3"),
    ((0, -1, (0,)), r"names model index -1; problem.models has indices 0 to 2$"),
    ((0, 3, (0,)), "names model index 3; problem.models has indices 0 to 2"),
    ((0, 0, (8,)), r"names GPU 8 of node AMS-0 \(row 0, 8 x H100\), whose GPUs are 0 to 7$"),
    ((1, 0, (-1,)), r"names GPU -1 of node AMS-1 \(row 1, 2 x L40S\), whose GPUs are 0 to 1$"),
    ((0, 0, ()), f"puts {L8} on 0 GPU\\(s\\); its tensor_parallel is 1"),
    ((0, 1, (4,)), f"puts {L70} on 1 GPU\\(s\\); its tensor_parallel is 2"),
    ((0, 1, (4, 4)), r"placed\[4\] = \(0, 1, \(4, 4\)\) names a GPU twice"),
    ((1.5, 0, (0,)), r"placed\[4\] = \(1.5, 0, \(0,\)\) is not \(node row, model index, GPU indices\) of integers"),
    ((True, 0, (0,)), "is not .* of integers"),
    ((0, 0, (0.0,)), "is not .* of integers"),
    ((0, 0), r"placed\[4\] = \(0, 0\) is not"),
    ((0, 0, 0), "is not"),
])
def test_a_bad_replica_is_one_error_naming_the_policy_the_replica_and_the_bound(problem, extra, message):
    with pytest.raises(UserError, match=f"^policy 'mine': .*{message}"):
        build(problem, OK + [extra])


def test_memory_over_a_gpus_limit_is_refused(problem):
    fits = OK + [(0, 0, (0,)), (0, 0, (0,))]  # three 21.4 GB replicas on GPU 0 of AMS-0: 64.3 GB of 80
    build(problem, fits)
    with pytest.raises(UserError, match=rf"^policy 'mine': placed\[6\] = \(0, 0, \(0,\)\) \({L8}\) overfills GPU 0 "
                                        r"of node AMS-0 \(row 0, 8 x H100\): its 4 replicas need 85.71 GB, over its "
                                        "80 GB of memory$"):
        build(problem, fits + [(0, 0, (0,))])
    with pytest.raises(UserError, match=r"overfills GPU 1 of node AMS-1 \(row 1, 2 x L40S\): its 3 replicas need "
                                        "64.29 GB, over its 48 GB"):
        build(problem, OK + [(1, 0, (1,))] * 3)


def test_an_overcommitted_problem_allows_its_factor_and_no_more(topo, problem):
    over = PlacementProblem(topo=topo, catalog=problem.catalog, fleet=problem.fleet, demand=problem.demand,
                            overcommit=True, overcommit_ratio=1.25)
    build(over, OK + [(0, 0, (0,))] * 3)  # 85.7 GB on an 80 GB GPU: within 100 GB
    with pytest.raises(UserError, match=r"need 107.14 GB, over its limit of 100 GB \(80 GB x memory factor 1.25\)"):
        build(over, OK + [(0, 0, (0,))] * 4)


def test_check_memory_still_asserts_on_an_edited_table(problem):
    """check_memory is the independent reference the policy tests use."""
    p = build(problem, OK)
    p.table.at[0, "gpu_index"] = (9,)
    with pytest.raises(AssertionError, match=r"replica 0"):
        p.check_memory()


@dataclass
class Overfull(PlacementPolicy):
    """A researcher's policy that stacks ten extra replicas of its largest one-GPU model on GPU 0 of node 0."""

    cacheable = False

    def place(self, problem, rng):
        net = problem.network()
        placed = [(n, m, (0,)) for m in range(net.n_models) if net.tp[m] == 1
                  for n in range(net.n_nodes) if net.fits[n, m]][:net.n_models]
        placed += [(n, m, tuple(range(int(net.tp[m])))) for m in range(net.n_models) if net.tp[m] > 1
                   for n in range(net.n_nodes) if net.fits[n, m]][:1]
        big = int(np.argmax(np.where(net.tp == 1, net.bytes_per_gpu, 0)))
        return Placement(problem, problem.fleet, self.name, placed + [(0, big, (0,))] * 10)


def test_edgepop_place_refuses_an_outside_policys_overfull_plan_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(PLACEMENTS, "_entries", dict(PLACEMENTS._entries))
    PLACEMENTS.register("t-overfull")(Overfull)
    assert main(["place", "--policy", "t-overfull", "--rps", "100", "--models", f"{L8},{E}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("edgepop: error: policy 't-overfull': placed[") and "overfills GPU 0 of node" in err
