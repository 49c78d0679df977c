"""``central``'s options are checked when read, each error naming its option; its solver figures say which
rack or node its budget used."""

from __future__ import annotations

import re

import numpy as np
import pytest

from controlplane.placement import PLACEMENTS, PlacementProblem, get_policy
from edgepop.errors import UserError


@pytest.mark.parametrize(("options", "words"), [
    ({"budget": "eur"}, "budget must be one of gpus, usd, got 'eur'"),
    ({"rack": "rack"}, "rack must be one of server, edge, got 'rack'"),
    ({"rack": "edge", "budget": "usd"}, "rack 'edge' applies to budget 'gpus', not 'usd'"),
    ({"node": "Z"}, "node must be GPUxCOUNT with 1 to 16 GPUs (e.g. H100x8), got 'Z'"),
    ({"node": "H100x64", "budget": "usd"}, "node must be GPUxCOUNT"),
    ({"scale": 1e3}, "scale must be positive and at most 100, got 1000.0"),
    ({"scale": 0}, "scale must be positive and at most 100, got 0"),
])
def test_bad_options_fail_when_read_naming_the_option(options, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")) as got:
        get_policy("central", **options)
    assert "\n" not in str(got.value)
    with pytest.raises(UserError, match=r"s\.toml \[central\]: placement policy 'central': "):
        PLACEMENTS.check("central", options, "s.toml [central]")


def test_an_unknown_gpu_type_names_the_node_option(topo):
    problem = PlacementProblem.build(topo, total_rps=10.0)
    with pytest.raises(UserError, match="central node 'Q100x8': unknown GPU type 'Q100'") as got:
        get_policy("central", budget="usd", node="Q100x8").place(problem, np.random.default_rng(0))
    assert "'nodes'" not in str(got.value)


@pytest.mark.parametrize(("options", "used"), [({}, {"rack": "server"}), ({"rack": "edge"}, {"rack": "edge"}),
                                               ({"budget": "usd", "node": "H200x8"}, {"node": "H200x8"})])
def test_the_solver_figures_name_the_rack_or_node_used(topo, options, used):
    problem = PlacementProblem.build(topo, total_rps=50.0, mix={"@cf/baai/bge-base-en-v1.5": 1.0})
    p = get_policy("central", baseline="us-east", **options).place(problem, np.random.default_rng(0))
    assert p.solver == {"baseline": "us-east", "budget": options.get("budget", "gpus"), "scale": 1.0, **used}


@pytest.mark.parametrize("node", ["H100x17", "H100x0"])
def test_a_node_count_out_of_range_fails_when_the_scenario_or_grid_is_read(tmp_path, node):
    from sim.grid import parse_grid
    from sim.scenario import load_scenario

    path = tmp_path / "n.toml"
    path.write_text('[workload]\nkind = "poisson"\nrequests = 100\nrps = 10.0\n'
                    f'[central]\nbaseline = "big3"\nnode = "{node}"\n')
    with pytest.raises(UserError, match=rf"^n\.toml \[central\]: node must be GPUxCOUNT with 1 to 16 GPUs .*'{node}'$"):
        load_scenario(path)
    with pytest.raises(UserError, match=rf"\[central\]: node must be GPUxCOUNT with 1 to 16 GPUs .*'{node}'"):
        parse_grid({"base": "small", "axes": {"central.node": [node]}}, "g.toml")


@pytest.mark.parametrize("budget", ["gpus", "usd"])
def test_an_unknown_gpu_type_in_central_node_names_the_file_and_field(tmp_path, budget):
    """Checked against the topology's GPU table before any work, whatever the budget: under "gpus" the field was
    ignored unchecked, under "usd" its error named neither the file nor the field."""
    from sim.run import run_scenario

    path = tmp_path / "n.toml"
    path.write_text('[workload]\nkind = "poisson"\nrequests = 100\nrps = 10.0\n'
                    f'[central]\nbaseline = "big3"\nbudget = "{budget}"\nnode = "Z9x8"\n')
    with pytest.raises(UserError, match=r"^n\.toml \[central\]: field 'node': unknown GPU type 'Z9' in 'Z9x8' "
                                        r"\(known: .*H100.*\)$"):
        run_scenario(path)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_keep_groups_must_be_true_or_false(value):
    with pytest.raises(UserError, match="keep_groups"):
        get_policy("central", keep_groups=value)


def test_without_gpus_leaves_out_only_the_named_types(topo):
    problem = PlacementProblem.build(topo, total_rps=50.0)
    full = get_policy("central").place(problem, np.random.default_rng(0))
    less = get_policy("central", without_gpus="L40S, L4").place(problem, np.random.default_rng(0))
    kept = {k: v for k, v in full.fleet.total_gpus.items() if k not in ("L40S", "L4")}
    assert set(full.fleet.total_gpus) >= {"L40S", "L4"}
    assert less.fleet.total_gpus == kept
    assert set(less.table.gpu) <= set(kept) and "L40S" in set(full.table.gpu)
    assert less.solver["without_gpus"] == "L40S, L4" and "without_gpus" not in full.solver


@pytest.mark.parametrize(("value", "words"), [
    ("L40", "without_gpus 'L40': edge has no 'L40' GPUs (it has H100, H200, L4, L40S, T4)"),
    ("L40S,", "without_gpus 'L40S,': an empty GPU type (a stray comma?)"),
    ("H100,H200,L4,L40S,T4", "has no GPUs"),
])
def test_without_gpus_refuses_a_type_the_fleet_lacks_or_no_gpus_left(topo, value, words):
    problem = PlacementProblem.build(topo, total_rps=50.0)
    with pytest.raises(UserError, match=re.escape(words)) as got:
        get_policy("central", without_gpus=value).place(problem, np.random.default_rng(0))
    assert "\n" not in str(got.value)


def test_the_frontier_counts_the_gpus_central_places_on(tmp_path, topo):
    """The frontier's budget of a central line leaves out the GPU types its placement leaves out."""
    from sim.frontier import Line, fleet_budget
    from sim.scenario import load_scenario

    path = tmp_path / "w.toml"
    path.write_text('[workload]\nkind = "poisson"\nrequests = 100\nrps = 10.0\n'
                    '[central]\nplacement_options = { without_gpus = "L40S" }\n')
    sc = load_scenario(path)
    plain = load_scenario("small")
    gpus, _, ok, why = fleet_budget(sc, topo, Line("central", "global-6"), 1.0)
    gpus_all, _, _, _ = fleet_budget(plain, topo, Line("central", "global-6"), 1.0)
    problem = PlacementProblem.build(topo, total_rps=50.0)
    placed = get_policy("central", without_gpus="L40S").place(problem, np.random.default_rng(0))
    assert ok, why
    assert gpus == int(placed.fleet.nodes.gpus.sum()) < gpus_all
