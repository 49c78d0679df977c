"""The Python entry points as a notebook calls them: ``progress`` of ``run_scenario``, ``run_frontier``'s
arguments checked before any work, and numpy numbers where a scenario or grid takes a number."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from edgepop.errors import UserError
from sim.run import run_scenario
from sim.scenario import check_scenario, load_scenario


def test_run_scenario_takes_progress_as_a_flag_or_a_function(capsys):
    seen = []
    run_scenario("small", requests=300, deployments=("edge",), progress=lambda *a: seen.append(a))
    assert seen and seen[-1][0] == "edge" and seen[-1][2] == 300
    out = run_scenario("small", requests=300, deployments=("edge",), progress=True)  # the bar, on stderr
    assert len(out.requests) == 300 and capsys.readouterr().out == ""
    for flag in (False, None):
        assert len(run_scenario("small", requests=300, deployments=("edge",), progress=flag).requests) == 300
    with pytest.raises(UserError, match=re.escape("progress must be True, False, None or a function")):
        run_scenario("small", requests=300, progress="yes")


@pytest.mark.parametrize("kw, words", [
    ({"workers": 1.5}, "workers must be a positive integer, got 1.5"),
    ({"workers": 0}, "workers must be a positive integer, got 0"),
    ({"tolerance": "0.1"}, "tolerance must be a number in [0, 1), got '0.1'"),
    ({"seeds": 3}, "seeds must be a list of distinct integers in [0, 2**63 - 1], got 3"),
    ({"seeds": [1, 1]}, "seeds must be a list of distinct integers"),
    ({"requests": "500"}, "requests must be a positive integer, got '500'"),
    ({"budgets": 3}, "budgets must be at least two different positive numbers, got 3"),
    ({"budgets": [0.5, "1"]}, "budgets must be at least two different positive numbers"),
    ({"max_steps": 2.0}, "max-steps must be a non-negative integer, got 2.0"),
    ({"engine": "dask"}, "unknown engine 'dask' (known: local, ray)"),
    ({"baselines": 5}, "baselines must be a region set name"),
    ({"slo": 500}, "slo must be METRIC=VALUE text"),
    ({"out": 5}, "out must be a folder path, got 5"),
    ({"progress": "yes"}, "progress must be True, False or None"),
    ({"absolute": 1}, "absolute must be True or False, got 1"),
])
def test_run_frontier_names_a_bad_argument_in_one_line(tmp_path, kw, words):
    from sim.frontier import run_frontier

    with pytest.raises(UserError, match=re.escape(words)) as info:
        run_frontier("small", out=tmp_path / "f", **kw) if "out" not in kw else run_frontier("small", **kw)
    assert "\n" not in str(info.value) and not (tmp_path / "f").exists()


def test_run_frontier_takes_numpy_numbers(tmp_path):
    from sim.frontier_args import checked_arguments

    args = checked_arguments(budgets=np.array([0.5, 1.0]), seeds=np.arange(1, 3),
                             engine="local", workers=np.int64(2), requests=np.int32(400), baselines=None,
                             tolerance=np.float32(0.1), max_steps=np.int64(2), out=tmp_path, progress=None,
                             absolute=False)
    assert args["budgets"] == [0.5, 1.0] and args["seeds"] == (1, 2) and args["workers"] == 2
    assert all(type(args[k]) is int for k in ("workers", "requests", "max_steps"))
    assert type(args["tolerance"]) is float and all(type(s) is int for s in args["seeds"])


def test_numpy_integers_fill_integer_fields_as_ints():
    sc = load_scenario("small")
    edited = dataclasses.replace(sc, seed=np.int64(3), edge=dataclasses.replace(sc.edge, queue_limit=np.int64(32)),
                                 gpu_inventory_scale=np.float64(0.5))
    checked = check_scenario(edited)
    assert checked.edge.queue_limit == 32 and type(checked.edge.queue_limit) is int
    assert type(checked.seed) is int and type(checked.gpu_inventory_scale) is float
    with pytest.raises(UserError, match="field 'queue_limit' must be a whole number, got True"):
        check_scenario(dataclasses.replace(sc, edge=dataclasses.replace(sc.edge, queue_limit=True)))
    with pytest.raises(UserError, match="field 'queue_limit' must be a whole number"):
        check_scenario(dataclasses.replace(sc, edge=dataclasses.replace(sc.edge, queue_limit=np.float64(32.0))))


def test_a_grid_of_numpy_values_runs_and_labels_them_as_plain_numbers():
    from sim.grid import parse_grid

    grid = parse_grid({"base": "small", "requests": 200,
                       "axes": {"workload.rps": np.arange(20.0, 41.0, 20.0), "edge.queue_limit": [np.int64(32)]},
                       "variants": [{"name": "a", "planning_rps": np.float64(25.0)}]}, source="g")
    assert [v.label for v in grid.variants] == [
        "a, workload.rps=20.0, edge.queue_limit=32, seed=7", "a, workload.rps=40.0, edge.queue_limit=32, seed=7"]
    assert grid.axis_column("workload.rps") == [20.0, 40.0]
    assert all(type(x) is float for x in grid.axis_column("workload.rps"))
    assert grid.variants[1].scenario.workload.rps == 40.0 and grid.variants[0].scenario.edge.queue_limit == 32
    assert grid.variants[0].scenario.planning_rps == 25.0
