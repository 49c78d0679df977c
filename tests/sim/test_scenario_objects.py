"""Scenario objects built or edited in Python get the checks a scenario file gets (``dataclasses.replace`` skips
``parse_scenario``): one-line errors naming the field, before any work."""

import dataclasses
import re

import numpy as np
import pytest

from edgepop.errors import UserError
from sim.run import run_scenario
from sim.scenario import check_scenario, load_scenario
from sim.sweep import run_sweep


def _edited(sc, table: str | None, **kw):
    if table is None:
        return dataclasses.replace(sc, **kw)
    return dataclasses.replace(sc, **{table: dataclasses.replace(getattr(sc, table), **kw)})


def test_a_fixed_last_mile_value_beside_another_mode_is_refused(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('last_mile = "country"\nlast_mile_ms = 25\n')
    with pytest.raises(UserError, match="field 'last_mile_ms' applies with last_mile = \"fixed\" only"):
        load_scenario(f)
    f.write_text('last_mile = "country"\n')
    assert load_scenario(f).last_mile == "country"


@pytest.mark.parametrize("table, kw, words", [
    (None, {"sample_s": 0}, "scenario 'small': field 'sample_s' must be positive, got 0"),  # hung the sampler
    (None, {"seed": None}, "scenario 'small': field 'seed' must be a whole number, got None"),
    (None, {"last_mile": "fibre"}, "field 'last_mile' must be one of"),
    (None, {"anycast_misroute": 1.5}, "scenario 'small': field 'anycast_misroute' must be in [0, 1], got 1.5"),
    (None, {"faults": ["bogus"]}, "bad fault spec 'bogus'"),
    (None, {"workload": None}, "scenario 'small': workload must be a WorkloadConfig, got NoneType"),
    ("edge", {"pops": "FRA"}, "scenario 'small' [edge]: field 'pops' must be a list, got 'FRA'"),  # not F, R, A
    ("edge", {"queue_limit": 2.5}, "[edge]: field 'queue_limit' must be a whole number, got 2.5"),
    ("central", {"placement": "greedy-demand"}, "[central]: field 'placement' must be 'central'"),
    ("workload", {"requests": float("nan")}, "[workload]: requests must be an integer >= 1, got nan"),
    ("slo", {"ttft_ms": -1.0}, "[slo]: field 'ttft_ms' must not be negative, got -1.0"),
    ("techniques", {"spec_k": 10**6}, "[techniques]: spec_k must be at most 32"),
    # what a file would hold, given in Python (was an AttributeError or TypeError deep in the workload)
    ("workload", {"tokens": {"chat": 5}}, "[workload]: tokens: unknown task 'chat'"),
    ("workload", {"bursts": [{"start_s": 0}]}, "bursts[0]: duration_s is required"),
    ("edge", {"placement": "central"}, "[edge]: placement 'central' places on cloud regions, not PoPs"),
])
def test_a_scenario_edited_in_python_is_checked_like_a_file(table, kw, words):
    sc = _edited(load_scenario("small"), table, **kw)
    with pytest.raises(UserError, match=re.escape(words)):
        run_scenario(sc, requests=100)


def test_the_check_leaves_the_callers_scenario_as_it_was():
    sc = dataclasses.replace(load_scenario("small"), faults=["pop:FRA@1+5"])
    checked = check_scenario(sc)
    assert sc.faults == ["pop:FRA@1+5"]  # the caller's object is not rewritten
    assert [f.target for f in checked.faults] == ["FRA"]
    assert check_scenario(load_scenario("default")) == load_scenario("default")  # a file's scenario passes as is


def test_entry_points_name_an_argument_of_the_wrong_type():
    from controlplane.placement import PlacementProblem
    from sim.frontier import run_frontier
    from sim.grid import parse_grid
    from topology import Topology

    for call, words in ((lambda: run_scenario(None), "a scenario is an embedded name or a path, got None"),
                        (lambda: run_frontier(None), "a scenario is an embedded name or a path, got None"),
                        (lambda: parse_grid(None), "<grid>: a grid is a table of keys"),
                        (lambda: Topology.load(pops=5), "Topology.load: pops must be a file path or None, got 5"),
                        (lambda: run_sweep({"base": "small"}), "a grid is an embedded name, a path or a parsed Grid"),
                        (lambda: PlacementProblem.build(None, total_rps=None),
                         "PlacementProblem.build: total_rps must be a number of requests/s, got None")):
        with pytest.raises(UserError, match=re.escape(words)):
            call()


def test_numpy_integers_are_whole_numbers_to_the_python_entry_points(tmp_path):
    import numpy as np

    from sim.grid import parse_grid

    grid = parse_grid({"base": "small", "seeds": [np.int64(3), np.uint8(4)], "requests": 200}, source="g")
    assert grid.seeds == (3, 4) and all(type(s) is int for s in grid.seeds)
    result = run_sweep(grid, workers=np.int64(1), out=tmp_path / "sweep", progress=False)
    assert sorted(set(result.summary.seed)) == [3, 4]


def test_the_placement_utilisation_cap_is_a_deployment_field(tmp_path):
    """The share of capacity placement plans to use moves the tail (docs/simulate.md): a scenario sets it."""
    from sim.run import prepare, scenario_deployment

    sc = load_scenario("small")
    sc = dataclasses.replace(sc, edge=dataclasses.replace(sc.edge, utilisation_cap=0.35),
                             workload=dataclasses.replace(sc.workload, requests=300))
    dep = scenario_deployment(prepare(check_scenario(sc)), "edge")
    assert dep.placement.problem.utilisation_cap == 0.35
    for value in (0, 1.5):
        with pytest.raises(UserError, match=re.escape(f"[edge]: utilisation_cap must be in (0, 1], got {value!r}")):
            check_scenario(_edited(sc, "edge", utilisation_cap=value))
    with pytest.raises(UserError, match=re.escape("[edge]: field 'utilisation_cap' must be a finite number, got nan")):
        check_scenario(_edited(sc, "edge", utilisation_cap=float("nan")))
    path = tmp_path / "s.toml"
    path.write_text('[workload]\nrequests = 10\nrps = 1.0\n[edge]\nutilisation_cap = 2.0\n')
    with pytest.raises(UserError, match=r"s.toml \[edge\]: utilisation_cap must be in \(0, 1\], got 2.0"):
        load_scenario(path)


def test_central_rack_is_checked_and_belongs_to_central(tmp_path):
    sc = load_scenario("small")
    with pytest.raises(UserError, match=re.escape("[central]: rack must be one of server, edge, got 'rack8'")):
        check_scenario(_edited(sc, "central", rack="rack8"))
    with pytest.raises(UserError, match=re.escape("[central]: rack = 'edge' applies to budget = 'gpus'")):
        check_scenario(_edited(sc, "central", rack="edge", budget="usd"))
    path = tmp_path / "s.toml"
    path.write_text('[workload]\nrequests = 10\nrps = 1.0\n[edge]\nrack = "edge"\n')
    with pytest.raises(UserError, match=r"s.toml \[edge\]: field 'rack' sets the central deployment's"):
        load_scenario(path)


def test_option_ranges_and_central_only_settings_name_the_file(tmp_path):
    """A router option out of range is refused when the file is read, naming file and table; a placement cap on
    central (whose placement fills every GPU) is refused rather than ignored."""
    path = tmp_path / "s.toml"
    for bad in ("-1.0", "1e9", "nan"):
        path.write_text(f'[workload]\nrequests = 10\nrps = 1.0\n[edge]\nrouter = "nearest-balanced"\n'
                        f'router_options = {{ window_ms = {bad} }}\n')
        with pytest.raises(UserError, match=r"s.toml \[edge\] router_options: routing policy 'nearest-balanced': "
                                             r"(window_ms must be in \[0, 1000\] ms|option 'window_ms' must be a number)"):
            load_scenario(path)
    sc = load_scenario("small")
    with pytest.raises(UserError, match=re.escape("[central]: utilisation_cap has no effect on placement 'central'")):
        check_scenario(_edited(sc, "central", utilisation_cap=0.5))


def test_a_central_fleet_copying_an_empty_fleet_is_a_user_error(topo):
    from controlplane.fleet import central_fleet, edge_fleet

    world = topo.with_gpu_scale(0.018)
    empty = edge_fleet(world, pops=["ABJ"])
    assert empty.nodes.empty or empty.nodes.gpus.sum() == 0
    for budget in ("gpus", "usd"):
        with pytest.raises(UserError, match="central fleet: the fleet whose budget it copies .edge. has no GPUs"):
            central_fleet(world, "global-6", like=empty, budget=budget)
    with pytest.raises(UserError, match="central rack 'edge' applies to an equal-GPU budget, not budget 'usd'"):
        central_fleet(world, "global-6", budget="usd", rack="edge")


def test_imperfect_anycast_is_recorded_and_reaches_the_edge_only(tmp_path):
    import numpy as np

    from sim.outputs import write_outputs

    base = load_scenario("small")
    ideal = run_scenario(base, requests=400)
    skewed = run_scenario(dataclasses.replace(base, anycast_misroute=0.3), requests=400)
    assert ideal.summary["network"]["anycast_misroute"] == 0.0
    assert skewed.summary["network"]["anycast_misroute"] == 0.3
    r0, r1 = ideal.requests, skewed.requests
    e0, e1 = (r[r.deployment == "edge"].sort_values("request_id") for r in (r0, r1))
    c0, c1 = (r[r.deployment == "central"].sort_values("request_id") for r in (r0, r1))
    assert (e1.ingress_pop.to_numpy() != e0.ingress_pop.to_numpy()).mean() > 0.1
    np.testing.assert_array_equal(c1.network_rtt_ms.to_numpy(), c0.network_rtt_ms.to_numpy())  # central: direct
    write_outputs(skewed, tmp_path / "out")
    assert "Imperfect anycast: 30% of the user cities" in (tmp_path / "out" / "report.md").read_text()


def test_a_start_time_is_an_instant_whatever_zone_it_is_written_in():
    """21:00 at UTC+9 is 12:00 UTC: the same workload (its hour was read as 21:00 UTC, nine hours off), as a file
    writing it with its offset gets; a time given as text is read as a file reads it."""
    from datetime import timedelta, timezone

    sc = load_scenario("small")
    base = run_scenario(sc, requests=400, deployments=("edge",)).requests
    tokyo = sc.workload.start_utc.astimezone(timezone(timedelta(hours=9)))
    assert tokyo.hour != sc.workload.start_utc.hour
    for start in (tokyo, tokyo.isoformat()):
        assert run_scenario(_edited(sc, "workload", start_utc=start), requests=400,
                            deployments=("edge",)).requests.equals(base)
    # the workload generator and the scheduled autoscaler read the instant too, when called directly
    from controlplane.autoscale import Scheduled
    from sim.workload import generate
    from topology import Topology

    topo = Topology.load()
    frames = [generate(dataclasses.replace(sc.workload, start_utc=t, requests=300), topo, None,
                       np.random.default_rng(1)).requests for t in (sc.workload.start_utc, tokyo)]
    assert frames[0].equals(frames[1])
    assert Scheduled(start_utc=tokyo.isoformat()).start == Scheduled(start_utc=sc.workload.start_utc.isoformat()).start
    assert Scheduled(start_utc=tokyo.isoformat()).start.hour == sc.workload.start_utc.hour


def test_a_topology_given_takes_the_scenarios_last_mile(topo):
    sc = dataclasses.replace(load_scenario("small"), last_mile_ms=50.0)
    given = run_scenario(sc, requests=300, deployments=("edge",), topo=topo)
    assert given.summary["network"]["last_mile"] == "fixed 50 ms for every user"
    assert given.requests.equals(run_scenario(sc, requests=300, deployments=("edge",)).requests)


def test_a_sweep_checks_every_variants_models_before_any_runs(tmp_path):
    from sim.grid import parse_grid

    a, b = {"@cf/meta/llama-3.1-8b-instruct": 1.0}, {"@cf/meta/llama-3.1-8b-instruct": 2.0, "@cf/baai/bge-m3": 1.0}
    typo = {"@cf/meta/llama-3.1-8b-instrct": 1.0}
    grid = parse_grid({"base": "small", "requests": 300, "axes": {"workload.mix": [a, b, typo]}})
    with pytest.raises(UserError, match=r"variant 2 .* no model '@cf/meta/llama-3.1-8b-instrct'"):
        run_sweep(grid, workers=1, out=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_list_scenarios_prints_json_with_json(capsys):
    import json

    from edgepop.cli import main
    from sim.scenario import embedded_scenarios

    assert main(["simulate", "--list-scenarios", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert list(listed) == list(embedded_scenarios())
    assert listed["small"] == load_scenario("small").description
    assert main(["simulate", "--list-scenarios"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == list(listed)[0]
