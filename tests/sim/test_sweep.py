"""Sweeps: grid parsing and validation, the local engine (pool and in-process), the Ray engine, the CLI."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from edgepop.cli import main
from edgepop.errors import UserError
from sim.grid import load_grid, parse_grid
from sim.sweep import run_sweep

REQUESTS = 250
# 2 x 2 variants; everywhere-fits places in about a second, so a variant takes ~2-3 s on one core.
GRID = {"base": "small", "requests": REQUESTS,
        "axes": {"edge.placement": ["everywhere-fits"], "edge.router": ["nearest-with-capacity", "p2c"],
                 "workload.rps": [20, 60.0]}}


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """The 2 x 2 grid on a two-process pool (the engine CI and laptops use)."""
    out = tmp_path_factory.mktemp("sweep") / "pool"
    return run_sweep(parse_grid(GRID, "grid.toml"), engine="local", workers=2, out=out, progress=False)


# ---------------------------------------------------------------- parsing and validation
def test_variants_are_the_ordered_product_with_seeds_innermost():
    g = parse_grid({**GRID, "seeds": [3, 4]}, "g.toml")
    assert len(g.variants) == 2 * 2 * 2
    assert [v.id for v in g.variants] == list(range(8))
    assert [v.seed for v in g.variants] == [3, 4] * 4
    assert [(v.values["edge.router"], v.values["workload.rps"]) for v in g.variants[::2]] == [
        ("nearest-with-capacity", 20), ("nearest-with-capacity", 60.0), ("p2c", 20), ("p2c", 60.0)]
    v = g.variants[5]
    assert v.scenario.edge.router == "p2c" and v.scenario.workload.rps == 20.0
    assert v.scenario.edge.placement == "everywhere-fits"
    assert v.scenario.central.router == "nearest-balanced"  # only the addressed table changes
    assert v.label == "edge.placement='everywhere-fits', edge.router='p2c', workload.rps=20, seed=4"
    assert g.axis_column("workload.rps") == [20.0, 60.0]  # one type per column: ints widened with floats


def test_an_option_axis_is_judged_with_the_axis_that_makes_it_valid():
    g = parse_grid({"base": "small", "axes": {"edge.router": ["p2c"], "edge.router_options.k": [2, 3]}}, "g.toml")
    assert [v.scenario.edge.router_options for v in g.variants] == [{"k": 2}, {"k": 3}]
    with pytest.raises(UserError, match=r"axis 'edge.router_options.k' value 2: .*no option 'k'"):
        parse_grid({"base": "small", "axes": {"edge.router": ["p2c", "nearest-with-capacity"],
                                              "edge.router_options.k": [2]}}, "g.toml")


def test_a_table_field_key_may_hold_dots():
    """A mix weight axis names a model id, and ids hold dots (llama-3.1, bge-base-en-v1.5)."""
    key = "workload.mix.@cf/meta/llama-3.2-1b-instruct"  # ablation's mix is llama-3.1-8b alone: a second model
    g = parse_grid({"base": "ablation", "axes": {key: [0.5, 2.0]}}, "g.toml")
    assert [v.scenario.workload.mix for v in g.variants] == [
        {"@cf/meta/llama-3.1-8b-instruct": 1.0, "@cf/meta/llama-3.2-1b-instruct": share} for share in (0.5, 2.0)]


def test_a_mix_key_needs_a_mix_table_in_the_base(tmp_path):
    """small has no mix (the default mix): a mix.<model> key would make that model the whole mix, every value
    of the axis the same 100% of it."""
    path = tmp_path / "g3.toml"
    path.write_text('base = "small"\nrequests = 300\n[axes]\n'
                    '"workload.mix.@cf/meta/llama-3.1-8b-instruct" = [0.2, 0.5]\n')
    with pytest.raises(UserError, match=r"^g3\.toml: axis 'workload\.mix\.@cf/meta/llama-3\.1-8b-instruct': base "
                                        r"scenario 'small' has no \[workload\] mix table: .*whole mix; give "
                                        r"workload\.mix whole"):
        load_grid(path)
    with pytest.raises(UserError, match=r"variant 'a' key 'workload\.mix\.@cf/meta/llama-3\.1-8b-instruct': base "
                                        r"scenario 'small' has no \[workload\] mix"):
        parse_grid({"base": "small", "variants": [{"name": "a", "workload.mix.@cf/meta/llama-3.1-8b-instruct": 1}]},
                   "g.toml")
    # tables whose absence means "the defaults" take a key: the rest stays default
    g = parse_grid({"base": "small", "axes": {"workload.tokens.text-generation": [{"output": {"median": 50}}],
                                              "techniques.spec_acceptance.text-generation": [0.5]}}, "g.toml")
    sc = g.variants[0].scenario
    assert sc.workload.tokens["text-generation"].output.median == 50 and len(sc.workload.tokens) > 1
    assert sc.techniques.spec_acceptance == {"text-generation": 0.5} and sc.workload.mix is None


def test_defaults_table_keys_and_embedded_grid(tmp_path):
    g = parse_grid({"base": "small"}, "g.toml")
    assert len(g.variants) == 1 and g.seeds == (7,) and g.deployments == ("edge", "central")
    g = parse_grid({"base": "small", "deployments": ["central", "edge"],
                    "axes": {"edge.placement_options.min_gain_ms_per_gb": [1e-7, 1e-6], "slo.ttft_ms": [500.0],
                             "planning_rps": [30.0], "central.enabled": [True, False]}}, "g.toml")
    assert g.deployments == ("edge", "central")
    assert g.variants[0].scenario.edge.placement_options == {"min_gain_ms_per_gb": 1e-7}
    assert g.variants[0].scenario.slo.ttft_ms == 500.0 and g.variants[0].scenario.planning_rps == 30.0
    assert g.variants[1].scenario.central is None
    policies = load_grid("policies")
    assert len(policies.variants) == 6 and policies.requests == 2000
    (tmp_path / "mine.toml").write_text('[workload]\nrequests = 10\nrps = 3.0\n')
    (tmp_path / "grid.toml").write_text('base = "mine.toml"\n[axes]\n"workload.rps" = [1.0, 2.0]\n')
    g = load_grid(tmp_path / "grid.toml")  # a base path is relative to the grid file
    assert [v.scenario.workload.rps for v in g.variants] == [1.0, 2.0]


@pytest.mark.parametrize("doc, message", [
    ({"base": "small", "axes": {"edge.placment": ["x"]}}, r"unknown axis 'edge.placment': \[edge\] has no field"),
    ({"base": "small", "axes": {"cloud.router": ["p2c"]}}, r"unknown axis 'cloud.router'"),
    ({"base": "small", "axes": {"seed": [1, 2]}}, r"unknown axis 'seed'.*seeds = \[...\]"),
    ({"base": "small", "axes": {"edge.router.k": [1]}}, r"only table fields"),
    ({"base": "small", "axes": {"edge": {"placement": ["ilp"]}}}, r"quote dotted keys"),
    ({"base": "small", "variants": [{"name": "a", "edge": {"placement": "ilp"}}]},
     r"^grid\.toml \[\[variants\]\] 'a': key 'edge' must be a value; quote dotted keys"),
    ({"base": "small", "axes": {"edge.router": "p2c"}}, r"'edge.router' must be a non-empty list"),
    # policy options are typed and checked when the grid is parsed, before anything runs
    ({"base": "small", "axes": {"edge.placement_options.time_limit_s": [1.0]}},
     r"placement policy 'greedy-demand' has no option 'time_limit_s' \(options: min_gain_ms_per_gb, swap_passes, swap_trials\)"),
    ({"base": "small", "axes": {"edge.router_options.k": ["4"]}, "deployments": ["edge"]},
     r"routing policy 'nearest-balanced' has no option 'k'"),
    ({"base": "small", "axes": {"edge.router": []}}, r"'edge.router' must be a non-empty list"),
    ({"base": "small", "axes": {"edge.router": ["p2c", "p2c"]}}, r"repeats a value"),
    ({"base": "small", "axes": {"edge.placement": ["ilp", "nope"]}},
     r"axis 'edge.placement' value 'nope': .*\[edge\]: field 'placement': unknown placement policy 'nope'"),
    ({"base": "small", "axes": {"central.router": ["fastest"]}}, r"value 'fastest'.*unknown routing policy"),
    ({"base": "small", "axes": {"workload.rps": [10.0, -3.0]}}, r"axis 'workload.rps' value -3.0: .*rps must be in \(0, 1e\+07\]"),
    ({"base": "small", "axes": {"edge.queue_limit": ["big"]}}, r"value 'big': .*'queue_limit' must be a whole number"),
    ({"base": "small", "axes": {"workload.kind": ["azure"]}}, r"value 'azure': .*does not apply to kind"),
    ({"base": "small", "axes": {"faults": [["pop:FRA@bad"]]}}, r"axis 'faults' value \['pop:FRA@bad'\]"),
    ({"base": "nosuch"}, r"base 'nosuch' not found"),
    ({"axes": {}}, r"'base' is required"),
    ({"base": "small", "rquests": 5}, r"unknown key 'rquests'"),
    ({"base": "small", "requests": 0}, r"requests must be a positive integer"),
    ({"base": "small", "requests": 5, "duration_s": 2.0}, r"not both"),
    # the grid's size is set on every variant last: an axis or a variant varying it would be overridden silently
    ({"base": "small", "requests": 200, "axes": {"workload.requests": [100, 300]}},
     r"'workload.requests' varies the size, which the grid's requests = 200 sets"),
    ({"base": "small", "duration_s": 5.0, "variants": [{"name": "long", "workload.duration_s": 9.0}]},
     r"'workload.duration_s' varies the size"),
    ({"base": "small", "seeds": [1, 1]}, r"seeds must be a non-empty list of distinct"),
    ({"base": "small", "seeds": [2**64]}, r"seeds must be .* integers in \[0, 2\*\*63 - 1\]"),
    ({"base": "small", "deployments": ["edge", "cloud"]}, r"deployments must be"),
    # a baseline that is no name at all (a list or table is not hashable: it crashed the lookup)
    ({"base": "small", "baseline": [1], "variants": [{"name": "a"}]},
     r"^grid\.toml: baseline must be a variant name, got \[1\]$"),
    ({"base": "small", "baseline": {"name": "a"}, "variants": [{"name": "a"}]},
     r"^grid\.toml: baseline must be a variant name, got \{'name': 'a'\}$"),
    # an unquoted dotted key arrives as nested tables: the hint quotes its whole path
    ({"base": "small", "variants": [{"name": "a", "edge": {"router_options": {"window_ms": 5.0}}}]},
     r"key 'edge' must be a value; quote dotted keys, e.g. \"edge\.router_options\.window_ms\" = \.\.\.$"),
    # a quoted key whose value is a table is quoted already: an axis still needs a list of values
    ({"base": "small", "axes": {"edge.router_options": {"window_ms": 5.0}}},
     r"axis 'edge.router_options' must be a non-empty list of values, got \{'window_ms': 5.0\}$"),
    # a key of a deployment the grid does not simulate would label variants that run identically
    ({"base": "small", "deployments": ["edge"], "axes": {"central.baseline": ["big3", "global-12"]}},
     r"axis 'central.baseline' sets the central deployment, which deployments = \['edge'\] does not simulate"),
    ({"base": "small", "deployments": ["edge"], "variants": [{"name": "a", "central.enabled": False}]},
     r"variant 'a': key 'central.enabled' sets the central deployment"),
    ({"base": "small", "deployments": ["central"], "axes": {"edge.router": ["p2c", "nearest-balanced"]}},
     r"axis 'edge.router' sets the edge deployment, which deployments = \['central'\] does not simulate"),
    ({"base": "small", "deployments": ["central"], "axes": {"techniques.batch_policy": ["none", "night"]}},
     r"axis 'techniques.batch_policy' acts on the edge deployment, which deployments = \['central'\]"),
])
def test_bad_grids_are_one_line_errors_naming_key_and_value(doc, message):
    with pytest.raises(UserError, match=message) as info:
        parse_grid(doc, "grid.toml")
    text = str(info.value)
    assert text.startswith("grid.toml") and "\n" not in text


def test_unknown_engine_and_bad_workers(tmp_path):
    g = parse_grid({"base": "small"}, "g.toml")
    with pytest.raises(UserError, match="unknown sweep engine 'spark'"):
        run_sweep(g, engine="spark", out=tmp_path / "o")
    with pytest.raises(UserError, match="workers must be a positive integer"):
        run_sweep(g, workers=0, out=tmp_path / "o")


# ---------------------------------------------------------------- running
def test_pool_sweep_writes_the_expected_rows(pooled):
    s = pooled.summary
    assert list(s.variant) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(s.deployment) == ["edge", "central"] * 4
    assert list(s["edge.router"]) == ["nearest-with-capacity"] * 4 + ["p2c"] * 4
    assert list(s["workload.rps"]) == [20.0, 20.0, 60.0, 60.0] * 2 and s["workload.rps"].dtype == "float64"
    assert (s.seed == 7).all() and (s.requests == REQUESTS).all()
    assert (s.ok + s.rejected + s.failed == s.requests).all()
    assert list(s.placement) == ["everywhere-fits", "central"] * 4
    assert s.ttft_p50_ms.notna().all() and ((s.slo_attainment >= 0) & (s.slo_attainment <= 1)).all()
    assert (s.gpu_usd > 0).all() and (s.neurons > 0).all()
    # gains belong to the variant: the same on its edge and central rows, and they match the two rows' figures
    for _, pair in s.groupby("variant"):
        edge, central = pair.iloc[0], pair.iloc[1]
        assert edge.gain_ttft_ms_p50_reduction_pct == central.gain_ttft_ms_p50_reduction_pct
        expect = 100 * (central.ttft_p50_ms - edge.ttft_p50_ms) / central.ttft_p50_ms
        assert edge.gain_ttft_ms_p50_reduction_pct == pytest.approx(expect, abs=0.01)
    # the central deployment does not depend on the edge's router: same arrivals, same seed, same figures
    assert s[s.deployment == "central"].groupby("workload.rps").ttft_p99_ms.nunique().eq(1).all()

    r = pooled.requests()
    assert list(r.columns[:6]) == ["variant", "seed", "edge.placement", "edge.router", "workload.rps", "deployment"]
    assert len(r) == 4 * 2 * REQUESTS
    counts = r.groupby(["variant", "deployment"]).size()
    assert (counts == REQUESTS).all()
    keyed = r.groupby("variant")[["edge.router", "workload.rps"]].first()
    assert keyed.reset_index().equals(s[s.deployment == "edge"][["variant", "edge.router", "workload.rps"]]
                                      .reset_index(drop=True))
    assert (r.groupby(["variant", "deployment"]).outcome.apply(lambda o: o.isin(["ok", "rejected", "failed"]).all())
            .all())
    # busy GPU-hours are over the whole run, drain included: utilisation x GPUs x (arrivals until the last end)
    for (v, d), g in r.groupby(["variant", "deployment"]):
        row = s[(s.variant == v) & (s.deployment == d)].iloc[0]
        end = max(row.simulated_span_s, (g.arrival_s + g.e2e_ms / 1e3).max())
        assert row.gpu_busy_hours == pytest.approx(row.gpu_utilisation * row.gpus * end / 3600, rel=0.01)
    on_disk = pd.read_parquet(pooled.path / "sweep_summary.parquet")
    pd.testing.assert_frame_equal(on_disk, s)
    manifest = json.loads((pooled.path / "sweep.json").read_text())
    assert [v["variant"] for v in manifest["variants"]] == [0, 1, 2, 3]
    assert all(v["wall_s"] > 0 for v in manifest["variants"]) and manifest["engine"] == "local"
    assert sorted(p.name for p in pooled.path.parent.iterdir()) == ["pool"]  # no temporary directory left


def test_same_tables_in_process_and_on_the_pool(pooled, tmp_path):
    inline = run_sweep(pooled.grid, engine="local", workers=1, out=tmp_path / "inline", progress=False)
    pd.testing.assert_frame_equal(inline.summary, pooled.summary)
    pd.testing.assert_frame_equal(inline.requests(), pooled.requests())


def test_ray_engine_gives_the_same_tables(pooled, tmp_path, monkeypatch):
    import ray  # in the test extra

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        result = run_sweep(pooled.grid, engine="ray", workers=2, out=tmp_path / "ray", progress=False)
        assert ray.is_initialized()  # a session the caller started is left running
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(result.summary, pooled.summary)
    pd.testing.assert_frame_equal(result.requests(), pooled.requests())


@pytest.mark.parametrize("address", ["bogus", "ray://127.0.0.1:1", "127.0.0.1:1"])  # (the last: Ray retried for
# minutes; the hang guard below is the test's timeout)
def test_a_ray_address_ray_cannot_join_is_one_error(address, monkeypatch):
    import ray

    from sim.sweep_ray import start_ray

    monkeypatch.setenv("RAY_ADDRESS", address)
    assert not ray.is_initialized()
    with pytest.raises(UserError, match=f"RAY_ADDRESS='{address}': Ray could not join it"):
        start_ray(2)
    assert not ray.is_initialized()


def test_starting_ray_keeps_the_callers_sigterm_handler():
    """ray.init installs its own SIGTERM handler (exit at once), which left a killed sweep's staged folder behind;
    the CLI's handler (unwind, remove it) must stay."""
    import signal

    import ray

    from sim.sweep_ray import start_ray

    def mine(signum, frame):
        raise AssertionError("not called here")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert start_ray(1)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_handlers_exception_wrapped_by_ray_is_raised_as_itself():
    """A SIGTERM or Ctrl-C during ray.wait comes back as a SystemError caused by the handler's exception: it is
    raised as itself (the CLI's exit status 143 / 130 and its clean-up), other SystemErrors as they are."""
    from edgepop.cli import Terminated
    from sim.sweep_ray import signal_safe

    def wrapped(cause):
        def call():
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from cause
        return call

    for cause in (Terminated(), KeyboardInterrupt()):
        with pytest.raises(type(cause)):
            signal_safe(wrapped(cause))
    with pytest.raises(SystemError):
        signal_safe(wrapped(ValueError("a bug")))
    assert signal_safe(lambda x: x + 1, 1) == 2


def test_a_grid_of_too_many_variants_is_refused_at_once():
    axes = {f"slo.{k}": [float(v) for v in range(1, 11)] for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    axes["workload.rps"] = [float(v) for v in range(1, 11)]
    with pytest.raises(UserError, match=r"grid.toml: 30,000 variants .* more than 10,000"):
        parse_grid({"base": "small", "requests": 50, "axes": axes, "seeds": [1, 2, 3]}, "grid.toml")


def test_a_failing_variant_is_named_and_nothing_is_written(tmp_path):
    # A fleet too small for the mix's 70B model is found when the variant builds it, after the others ran.
    g = parse_grid({"base": "small", "requests": 50, "deployments": ["edge"],
                    "axes": {"edge.pops": [["FRA"], ["LHR"]]}}, "grid.toml")
    with pytest.raises(UserError) as info:
        run_sweep(g, engine="local", workers=2, out=tmp_path / "out", progress=False)
    # both variants fail (LHR's fleet holds no replica of the small models either): the lower one is reported
    assert re.fullmatch(r"grid\.toml: variant 0 \(edge\.pops=\['FRA'\], seed=7\) failed: small\.toml \[edge\]: "
                        r"model @cf/meta/llama-3\.3-70b-instruct-fp8-fast needs .*", str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_the_lowest_failing_variant_is_reported_whichever_fails_first(monkeypatch):
    """Two variants fail, the later one first: the error is the lower variant's, as a one-worker run reports it
    (it was whichever came back first, so the same grid could name either)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sim import sweep

    second_failed = threading.Event()

    def fake_run(task):
        if task == 0:
            second_failed.wait(timeout=60)  # (a hang guard only)
        return {"id": task, "error": f"boom {task}"}

    def collect(result):
        if result["id"] == 1:
            second_failed.set()
        raise UserError(result["error"])

    monkeypatch.setattr(sweep, "run_variant", fake_run)
    with ThreadPoolExecutor(2) as pool, pytest.raises(UserError, match="^boom 0$"):
        sweep._run_local([0, 1], 2, collect, pool)


@pytest.mark.parametrize("axis, message", [
    ({"edge.pops": [["FRA"], ["FRA", "XXX"]]}, r"small\.toml \[edge\]: field 'pops': unknown PoP id\(s\) 'XXX'"),
    ({"faults": [[], ["link:FRA-AMS@2+50"]]},
     r"fault link:FRA-AMS: there is no direct backbone link between FRA and AMS"),
    ({"faults": [[], ["node:XXX-0@2+50"]]}, r"fault node:XXX-0: no node can have this id"),
])
def test_names_a_variant_refers_to_are_checked_before_any_variant_runs(tmp_path, monkeypatch, axis, message):
    import sim.sweep_variant

    monkeypatch.setattr(sim.sweep_variant, "run_variant", lambda *a, **k: pytest.fail("a variant ran"))
    g = parse_grid({"base": "small", "requests": 50, "deployments": ["edge"], "axes": axis}, "grid.toml")
    with pytest.raises(UserError, match=r"^grid\.toml: variant 1 \(.*\): " + message):
        run_sweep(g, engine="local", workers=1, out=tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_sweep_table_json_and_errors(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('base = "small"\nrequests = 60\ndeployments = ["edge"]\n'
                    '[axes]\n"edge.placement" = ["everywhere-fits"]\n"slo.ttft_ms" = [200.0, 2000.0]\n')
    assert main(["sweep", "--grid", str(grid), "--workers", "1", "--out", str(tmp_path / "o"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["variant"], r["deployment"], r["slo.ttft_ms"]) for r in rows] == [(0, "edge", 200.0),
                                                                                 (1, "edge", 2000.0)]
    assert rows[0]["slo_attainment"] <= rows[1]["slo_attainment"]  # same runs, looser objective
    assert rows[0]["gain_ttft_ms_p50_reduction_pct"] is None  # no central deployment, no gain
    assert rows[0]["placement_deterministic"] is True  # (false only where a solver's clock decided the plan)
    assert (tmp_path / "o" / "sweep.parquet").exists()
    assert main(["sweep", "--grid", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.strip().startswith("edgepop: error: grid ")
    grid.write_text('base = "small"\n[axes]\n"edge.router" = ["fastest"]\n')
    assert main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgepop: error: g.toml: axis 'edge.router' value 'fastest'") and "\n" not in err


def test_a_file_in_the_way_of_out_is_refused_before_the_sweep_runs(tmp_path):
    (tmp_path / "afile").write_text("x")
    g = parse_grid({"base": "small", "requests": 50, "deployments": ["edge"]}, "g.toml")
    with pytest.raises(UserError, match="exists and is not a folder"):
        run_sweep(g, engine="local", workers=1, out=tmp_path / "afile", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_named_variant_sets_a_table_field_as_a_whole_as_an_axis_does(tmp_path):
    # TOML text, not a dict: a quoted "a.b" key stays one key holding a dot, an unquoted a.b becomes nested tables
    path = tmp_path / "g.toml"
    path.write_text('base = "small"\n[axes]\n"edge.router_options" = [{ window_ms = 5.0 }]\n')
    by_axis = load_grid(path).variants[0].scenario
    path.write_text('base = "small"\n[[variants]]\nname = "w5"\n"edge.router_options" = { window_ms = 5.0 }\n'
                    '[[variants]]\nname = "one-model"\n"workload.mix" = { "@cf/meta/llama-3.1-8b-instruct" = 1.0 }\n')
    g = load_grid(path)
    assert g.variants[0].scenario.edge.router_options == by_axis.edge.router_options == {"window_ms": 5.0}
    assert g.variants[1].scenario.workload.mix == {"@cf/meta/llama-3.1-8b-instruct": 1.0}
    path.write_text('base = "small"\n[[variants]]\nname = "w5"\n"edge.router_options" = { k = 5 }\n')
    with pytest.raises(UserError, match=r"variant 'w5': .*routing policy 'nearest-balanced' has no option 'k'"):
        load_grid(path)  # the table's keys are checked as an axis value's are
    path.write_text('base = "small"\n[[variants]]\nname = "w5"\nedge.router_options.window_ms = 5.0\n')
    with pytest.raises(UserError, match=r"key 'edge' must be a value; quote dotted keys, "
                                        r"e.g. \"edge.router_options.window_ms\""):
        load_grid(path)


def test_a_central_only_grid_may_vary_the_edge_pops_central_budget_follows(tmp_path):
    from topology.pops import load_pops

    ids = load_pops().id.tolist()
    g = parse_grid({"base": "small", "requests": 150, "deployments": ["central"],
                    "axes": {"gpu_inventory_scale": [1.0], "edge.pops": [ids[:60], ids[:120]]}}, "g.toml")
    summary = run_sweep(g, workers=1, out=tmp_path / "c", progress=False).summary
    assert summary.deployment.tolist() == ["central", "central"]
    small, large = summary.gpus.tolist()
    assert small < large  # not a no-op: the refusal of edge.* keys in a central-only grid leaves it out


@pytest.mark.parametrize("doc, message", [
    ({"axes": {"edge.router_options.window_ms": [1.0, 500.0], "edge.router_options": [{"window_ms": 50.0}]}},
     r"axis 'edge\.router_options\.window_ms' sets a key of 'edge\.router_options', which \[axes\] also varies as "
     r"a whole .*: drop one of them$"),
    ({"variants": [{"name": "a", "edge.router_options": {"window_ms": 50.0}}],
      "axes": {"edge.router_options.window_ms": [1.0, 500.0]}},
     r"variant 'a' sets 'edge\.router_options', which \[axes\] also varies as 'edge\.router_options\.window_ms'"),
    ({"variants": [{"name": "a", "edge.router_options.window_ms": 5.0}],
      "axes": {"edge.router_options": [{"window_ms": 50.0}]}},
     r"variant 'a' sets 'edge\.router_options\.window_ms', which \[axes\] also varies as 'edge\.router_options'"),
    ({"variants": [{"name": "a", "edge.router_options.window_ms": 5.0, "edge.router_options": {"window_ms": 50.0}}]},
     r"variant 'a' sets both 'edge\.router_options\.window_ms' and 'edge\.router_options'"),
])
def test_a_table_and_one_of_its_keys_are_not_set_together(doc, message):
    """The last one written would win, whole or in part: variants labelled with values they did not run."""
    with pytest.raises(UserError, match=message) as info:
        parse_grid({"base": "small", "requests": 100, **doc}, "g5.toml")
    assert str(info.value).startswith("g5.toml: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("doc, message", [
    ({"axes": {"workload.rps": [20, 20.0]}}, r"^g\.toml \[axes\]: axis 'workload\.rps' repeats a value: \[20, 20\.0\]$"),
    ({"axes": {"edge.router_options": [{"window_ms": 5}, {"window_ms": 5.0}]}}, r"axis 'edge\.router_options' repeats"),
    ({"variants": [{"name": "a", "workload.rps": 20.0}, {"name": "b", "workload.rps": 20}]},
     r"^g\.toml \[\[variants\]\]: variants 'a' and 'b' set the same values: drop one of them$"),
    ({"variants": [{"name": "a"}, {"name": "b"}]}, r"variants 'a' and 'b' set the same values"),
])
def test_a_value_or_named_variant_that_repeats_is_refused(doc, message):
    with pytest.raises(UserError, match=message):
        parse_grid({"base": "small", **doc}, "g.toml")


def test_a_bool_is_not_the_number_one_when_values_are_compared():
    # not "repeats a value" / "set the same values": the 1 is a different value, which the scenario parser refuses
    for doc in ({"axes": {"techniques.prefix_cache": [True, 1]}},
                {"variants": [{"name": "on", "techniques.prefix_cache": True},
                              {"name": "one", "techniques.prefix_cache": 1}]}):
        with pytest.raises(UserError, match=r"'prefix_cache' must be true or false, got 1$"):
            parse_grid({"base": "small", **doc}, "g.toml")
    g = parse_grid({"base": "small", "axes": {"workload.rps": [20, 20.5]}}, "g.toml")
    assert [v.values["workload.rps"] for v in g.variants] == [20, 20.5]


def test_grid_refuses_a_variant_value_an_axis_would_overwrite():
    doc = {"base": "small", "requests": 100, "axes": {"edge.router": ["nearest-balanced", "p2c"]},
           "variants": [{"name": "a", "edge.router": "prefix-aware"}, {"name": "b"}]}
    with pytest.raises(UserError, match="variant 'a' sets 'edge.router', which \\[axes\\] also varies"):
        parse_grid(doc, source="t.toml")


def test_sweep_manifest_holds_toml_datetimes_and_central_only_variants_are_checked_first(tmp_path):
    import datetime as dt

    when = [dt.datetime(2024, 3, 20, 12, tzinfo=dt.UTC), dt.datetime(2024, 3, 20, 0, tzinfo=dt.UTC)]
    g = parse_grid({"base": "small", "requests": 150, "deployments": ["edge"],
                    "axes": {"workload.start_utc": when}}, source="t.toml")
    run_sweep(g, workers=1, out=tmp_path / "dt", progress=False)
    axes = json.loads((tmp_path / "dt" / "sweep.json").read_text())["axes"]
    assert axes == {"workload.start_utc": ["2024-03-20T12:00:00+00:00", "2024-03-20T00:00:00+00:00"]}
    summary = pd.read_parquet(tmp_path / "dt" / "sweep_summary.parquet")  # the same ISO text in the axis column
    assert summary["workload.start_utc"].tolist() == axes["workload.start_utc"]
    g = parse_grid({"base": "small", "requests": 150, "deployments": ["central"],
                    "axes": {"central.enabled": [True, False]}}, source="t.toml")
    with pytest.raises(UserError, match=r"variant 1 \(.*\): only central asked for: scenario '.*' has no central "
                                        r"deployment \(\[central\] enabled = false\); nothing to simulate$"):
        run_sweep(g, workers=1, out=tmp_path / "cen", progress=False)
    assert not (tmp_path / "cen").exists()  # refused before variant 0 ran



def test_a_fault_no_deployment_of_a_variant_applied_is_warned_and_in_the_summary(tmp_path, capsys):
    grid = parse_grid({"base": "small", "requests": 200,
                       "axes": {"faults": [["pop:FRA@1+5"], ["node:FRA-999@1+1", "pop:LHR@99999+5"]]}}, "f.toml")
    s = run_sweep(grid, workers=1, out=tmp_path / "o", progress=False, keep_requests=False).summary
    err = capsys.readouterr().err.strip().splitlines()
    # the PoP fault applies to the edge (central users enter through no PoP): no warning for variant 0
    assert len(err) == 1 and err[0].startswith("warning: f.toml: variant 1 (") and "fault not applied: " in err[0]
    assert ("node:FRA-999@1+1 (edge: no node 'FRA-999' in the edge fleet; central: no node 'FRA-999' in the "
            "central fleet), pop:LHR@99999+5 (edge: starts after the run ended") in err[0]
    rows = s.set_index(["variant", "deployment"]).faults_skipped
    assert rows[0, "edge"] == "" and rows[0, "central"] == "pop:FRA@1+5: central users do not enter through PoPs"
    assert rows[1, "edge"].startswith("node:FRA-999@1+1: no node 'FRA-999' in the edge fleet; pop:LHR@99999+5: ")


def test_gain_interval_columns_are_there_when_no_variant_has_an_interval(tmp_path):
    from sim.sweep_variant import GAINS

    g = parse_grid({"base": "small", "requests": 20, "seeds": [1], "axes": {"workload.rps": [20.0]}}, "g2.toml")
    run_sweep(g, workers=1, out=tmp_path / "s", progress=False)
    summary = pd.read_parquet(tmp_path / "s" / "sweep_summary.parquet")  # 20 requests: too few for any interval
    for k in (k for k in GAINS if k != "e2e_ms_p50_reduction_pct"):
        for end in ("lo", "hi"):
            col = summary[f"gain_{k}_ci95_{end}"]
            assert col.isna().all() and col.dtype == float, (k, end)
    assert "gain_e2e_ms_p50_reduction_pct_ci95_lo" not in summary  # the one headline figure with no interval
