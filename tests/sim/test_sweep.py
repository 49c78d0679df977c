"""Sweeps: the local engine (pool and in-process), the Ray engine, the CLI (grid parsing: test_grid.py)."""

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
    assert list(s.router) == ["nearest-with-capacity", "nearest-balanced"] * 2 + ["p2c", "nearest-balanced"] * 2
    assert (pooled.path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sweep_figure_draws_one_deployment_without_gains(tmp_path):
    """A sweep of the edge alone has no gains: the figure is its latency panel only."""
    import matplotlib.image as mpimg

    from sim.sweep_plot import plot_sweep

    rows = pd.DataFrame({"variant": [0, 1], "deployment": ["edge", "edge"], "ttft_p50_ms": [40.0, 900.0],
                         "ttft_p95_ms": [120.0, 4000.0]})
    one = mpimg.imread(plot_sweep(rows, ["a", "b"], tmp_path / "one.png"))
    both = rows.assign(deployment="central")
    both = pd.concat([rows, both]).assign(gain_ttft_ms_p50_reduction_pct=5.0, gain_ttft_ms_p95_reduction_pct=1.0,
                                          gain_tpot_ms_p50_reduction_pct=-2.0)
    two = mpimg.imread(plot_sweep(both, ["a", "b"], tmp_path / "two.png"))
    assert one.shape[1] < two.shape[1]  # (the gains panel widens the figure)


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
