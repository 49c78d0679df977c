"""The scripts in benchmarks/ refuse bad arguments with argparse's one-line error before any work starts (no
traceback, no server started), answer --help, and end on strict JSON (null, never NaN); no run is made twice."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgepop.argtypes import json_line

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

BAD = [
    ("bench_fidelity_live.py", ["--requests", "0"], "--requests"),
    ("bench_fidelity_live.py", ["--budget-s", "nan"], "--budget-s"),
    ("bench_frontier.py", ["--seeds", "a"], "--seeds"),
    ("bench_frontier.py", ["--workers", "0"], "--workers"),
    ("bench_workload.py", ["--repeat", "0"], "--repeat"),
    ("bench_workload.py", ["--requests", "0"], "--requests"),
    ("sim_cache_techniques.py", ["--requests", "0"], "--requests"),
    ("sim_cache_techniques.py", ["--rps", "0"], "--rps"),
    ("bench_techniques.py", ["--requests", "0"], "--requests"),
    ("bench_dataplane.py", ["--encoder", "nosuch"], "--encoder"),
    ("bench_dataplane.py", ["--lm", "nosuch"], "--lm"),
    ("bench_quant_lora.py", ["--models", "nosuch"], "--models"),
    ("bench_quant_lora.py", ["--repeats", "0"], "--repeats"),
    ("bench_topology.py", ["--users", "0"], "--users"),
    ("bench_perf.py", ["--calls", "0"], "--calls"),
    ("bench_live_techniques.py", ["--depth", "0"], "--depth"),
    ("bench_engine_lock.py", ["--model", "nosuch"], "--model"),
    ("loadtest_gateway.py", ["--threads", "0"], "--threads"),
    ("loadtest_gateway.py", ["--malformed-fraction", "2"], "malformed-fraction"),
    ("loadtest_gateway.py", ["--levels", "4,2"], "--levels must include 1 (the unloaded level), got '4,2'"),
    # --levels is the sweep's: the mixed run takes any (here it gets as far as the gateway's health check)
    ("loadtest_gateway.py", ["--mixed", "--levels", "8,16", "--url", "http://127.0.0.1:9"], "no gateway answers there"),
    ("decode_context_bias.py", ["--output", "0"], "--output"),
    ("decode_context_bias.py", ["--output", "-5"], "--output"),
    ("decode_context_bias.py", ["--gpus", "XYZ"], "--gpus: unknown GPU type 'XYZ'"),
    ("decode_context_bias.py", ["--output", "200000"], "--output: decode bias: prompt 100 + output 200000 tokens"),
    ("interval_audit.py", ["--seeds", "1"], "--seeds: an interval over seeds needs at least 2"),
    ("interval_audit.py", ["--bootstrap-seeds", "1"], "--bootstrap-seeds"),
    ("interval_audit.py", ["--scenario", "nosuch"], "--scenario: scenario 'nosuch' not found"),
    ("interval_audit.py", ["--blocks", "10,x"], "--blocks: must be comma-separated whole numbers, got '10,x'"),
    ("interval_audit.py", ["--blocks", "1,50"], "--blocks: each block count must be at least 2"),
    ("frontier_demand_proxy.py", ["--factors", "1.2,x"], "--factors: must be comma-separated numbers, got '1.2,x'"),
    ("frontier_demand_proxy.py", ["--factors", "0"], "--factors: each factor must be between 0.1 and 10"),
    ("frontier_demand_proxy.py", ["--seeds", "a"], "--seeds"),
    ("frontier_demand_proxy.py", ["--kind", "speed"], "--kind: invalid choice: 'speed'"),
    ("frontier_demand_proxy.py", ["--router", "nosuch"], "--router: unknown routing policy 'nosuch'"),
    ("frontier_demand_proxy.py", ["--router-option", "x=1"], "--router-option needs --router"),
    ("frontier_demand_proxy.py", ["--router", "least-ttft", "--router-option", "scale"],
     "--router-option: must be KEY=NUMBER"),
    ("prefill_wait.py", ["--prefill-scale", "0"], "--prefill-scale: must be in (0, 100], got '0'"),
    ("prefill_wait.py", ["--scenario", "nosuch"], "scenario 'nosuch' not found"),
    ("prefill_wait.py", ["--edge-utilisation-cap", "1.5"], "--edge-utilisation-cap must be at most 1, got 1.5"),
    ("prefill_wait.py", ["--router", "nosuch"], "unknown routing policy 'nosuch'"),
    ("bench_routing_sim.py", ["--routers", "nearest-balanced,nosuch"], "--routers: unknown routing policy 'nosuch'"),
    ("bench_routing_sim.py", ["--routers", ","], "--routers: name at least one routing policy"),
    ("bench_routing_sim.py", ["--requests", "0"], "--requests"),
    ("edge_detour.py", ["--requests", "0"], "--requests"),
    ("edge_detour.py", ["--scenario", "nosuch"], "--scenario: scenario 'nosuch' not found"),
]


def _run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize(("script", "args", "named"), BAD, ids=[f"{s}{' '.join(a)}" for s, a, _ in BAD])
def test_bad_argument_is_a_one_line_error(script, args, named):
    r = _run(script, args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: ") and named in last, last
    assert r.stdout == ""  # nothing ran


def test_placement_default_answers_help_without_running():
    r = _run("placement_default.py", ["--help"])
    assert r.returncode == 0 and r.stdout.startswith("usage: placement_default.py"), r.stderr[-2000:]
    assert "greedy" in r.stdout and "{" not in r.stdout.splitlines()[-1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_frontier_idle_estimate_uses_the_processes_that_compute():
    est = _module("bench_frontier").idle_2core_estimate
    assert est(100.0, 1, 16) == (100.0, 1)  # one worker: one core computes, CPU time is the wall time
    assert est(100.0, None, 16) == (50.0, 2)  # a pool of every CPU: 2 idle cores share the work
    assert est(100.0, 8, 16) == (50.0, 2)
    assert est(100.0, None, 1) == (100.0, 1)


def test_frontier_meets_goal_only_for_the_goals_run():
    """It said true for any quick run under 600 s (--requests 500, one seed) though the goal is the default run."""
    meets = _module("bench_frontier").meets_goal
    assert meets(500.0, None, [1, 2, 3]) is True and meets(700.0, None, [1, 2, 3]) is False
    assert meets(30.0, 500, [1, 2, 3]) is None  # shortened runs
    assert meets(30.0, None, [1]) is None and meets(900.0, None, [1, 2, 3, 4]) is None


def test_interval_audit_block_lengths_reports_every_count_and_recomputes_the_shipped_interval():
    """The shipped block count's widths are the run's own intervals' (the same bootstrap, seed and blocks)."""
    audit = _module("interval_audit")
    run = audit._run_sides("small", 2000)
    got = audit.block_lengths(run, [5, 50, 200])
    assert got["shipped_blocks"] == 50 and got["blocks"] == [5, 50, 200]
    ci = run[0].summary["gains"]["ci95"]["ttft_ms_p50_reduction_pct"]
    widths = got["widths"]["ttft_ms_p50_reduction_pct"]
    assert set(widths) == {"5", "50", "200"} and all(w > 0 for w in widths.values())
    assert widths["50"] == pytest.approx(ci[1] - ci[0], abs=0.011)  # (the summary rounds each end to 2 digits)
    assert got["widest_with_longer_blocks_over_shipped"]["ttft_ms_p50_reduction_pct"] == pytest.approx(
        max(widths["5"], widths["50"]) / widths["50"], abs=1e-3)


def test_measured_relays_through_a_metro_region_cost_what_the_wan_model_says():
    """docs/simulate.md says the edge's second fixed per-path term is what a relay through a nearby data centre
    measurably costs: in the shipped RTT tables, a detour through a region within 100 km of the source is about
    3.5 ms at the median, and the model's for the same triples within a millisecond of it."""
    relays = _module("edge_detour").relays
    metro = relays(near_km=100.0)
    pooled = metro["pooled"]
    assert pooled["triples"] >= 50 and 2.0 <= pooled["measured_detour_ms_p50"] <= 5.0
    assert abs(pooled["model_minus_measured_ms_p50"]) <= 1.0
    assert metro["model_base_ms"] == pytest.approx(pooled["measured_detour_ms_p50"], abs=1.0)
    wider = relays(near_km=300.0)
    assert wider["pooled"]["triples"] > pooled["triples"] and set(wider["by_set"]) >= {"azure-2026", "gcp-2023"}
    assert abs(wider["pooled"]["model_minus_measured_ms_p50"]) <= 2.0


def test_demand_proxy_scenarios_scale_rate_and_requests_and_nothing_else(tmp_path):
    """The docs' table of the frontier under raised demand comes from these copies: the default scenario with its
    workload's rps and requests x the factor (the same span), every other field as shipped."""
    from sim.scenario import load_scenario

    proxy = _module("frontier_demand_proxy")
    base = load_scenario("default")
    for factor, requests in ((1.45, 217_500), (1.7, 255_000)):
        sc = load_scenario(str(proxy.scaled_scenario(factor, tmp_path)))
        assert sc.workload.requests == requests and sc.workload.rps == pytest.approx(250.0 * factor)
        assert sc.workload.requests / sc.workload.rps == pytest.approx(base.workload.requests / base.workload.rps)
        assert (sc.seed, sc.gpu_inventory_scale, sc.edge, sc.central) == (base.seed, base.gpu_inventory_scale,
                                                                        base.edge, base.central)
    assert load_scenario(str(proxy.scaled_scenario(1.2, tmp_path, requests=1000))).workload.requests == 1200


def test_slowed_scenarios_scale_service_times_and_nothing_else(tmp_path):
    """The frontier under slower replicas: the default scenario with one or both service-time scales set."""
    from dataclasses import replace

    from sim.scenario import load_scenario

    proxy = _module("frontier_demand_proxy")
    base = load_scenario("default")
    for phases, want in ((("prefill", "decode"), (1.45, 1.45)), (("prefill",), (1.45, 1.0)), (("decode",), (1.0, 1.45))):
        sc = load_scenario(str(proxy.slowed_scenario(1.45, tmp_path, phases=phases)))
        assert (sc.prefill_time_scale, sc.decode_time_scale) == want
        assert replace(sc, prefill_time_scale=1.0, decode_time_scale=1.0, name=base.name, source=base.source) == base
    assert load_scenario(str(proxy.slowed_scenario(1.2, tmp_path, requests=1000))).workload.requests == 1000
    routed = load_scenario(str(proxy.with_router(proxy.slowed_scenario(1.0, tmp_path), "least-ttft")))
    assert (routed.edge.router, routed.central.router) == ("least-ttft", "least-ttft")
    assert routed.edge.router_options == base.edge.router_options  # (the window kept)
    assert replace(routed, edge=base.edge, central=base.central, name=base.name, source=base.source) == base
    tuned = load_scenario(str(proxy.with_router(proxy.slowed_scenario(1.0, tmp_path), "least-ttft",
                                                {"prefill_estimate_scale": 0.69})))
    for side in (tuned.edge, tuned.central):
        assert side.router_options == {"window_ms": 10.0, "prefill_estimate_scale": 0.69}


def test_loadtest_unloaded_p99_is_the_fewest_clients_level(monkeypatch):
    """It took the first level listed, so --levels 8,1 called the 8-client p99 unloaded."""
    monkeypatch.syspath_prepend(str(BENCH))  # (it imports http_light from beside it, as when run as a script)
    rows = [{"clients": 8, "p99_ms": 90.0}, {"clients": 1, "p99_ms": 12.0}, {"clients": 2, "p99_ms": 20.0}]
    assert _module("loadtest_gateway").unloaded_p99(rows) == 12.0


def test_quant_lora_quick_keeps_explicit_models_and_repeats():
    options = _module("bench_quant_lora").options
    assert options(["--quick"]) == (["minilm-l6-v2", "gpt2-tiny", "resnet-tiny"], 5)
    assert options(["--quick", "--models", "gpt2-tiny", "--repeats", "2"]) == (["gpt2-tiny"], 2)
    assert options(["--models", "resnet-tiny"]) == (["resnet-tiny"], 30)


def test_final_json_line_has_null_not_nan():
    line = json_line({"median_ms": float("nan"), "rows": [np.float64("inf"), np.float32("-inf"), 1.5, 2],
                      "nested": {"x": np.nan, "n": np.int64(3)}}, default=int)
    assert json.loads(line) == {"median_ms": None, "rows": [None, None, 1.5, 2], "nested": {"x": None, "n": 3}}
    assert "NaN" not in line and "Infinity" not in line


def test_placement_figures_runs_each_distinct_policy_once(monkeypatch):
    """The 60 s ILP is the default ILP (60 s is its time limit): one run gives both sets of keys."""
    from types import SimpleNamespace

    from controlplane.placement import get_policy

    figures = _module("placement_figures")
    built = []

    def fake_timed(policy, problem, **options):
        built.append(get_policy(policy, **options))
        return SimpleNamespace(objective_ms=2.0 + len(built), solver={"plan": policy, "status": "x"}), 1.0

    monkeypatch.setattr(figures, "_timed", fake_timed)
    out = figures.run(quick=False)
    assert [p for i, p in enumerate(built) if p in built[:i]] == []  # (policies are dataclasses: equal = same work)
    assert out["ilp60_objective_ms"] == out["ilp_default_objective_ms"]
    assert out["greedy_over_ilp60"] == out["greedy_over_ilp_default"]
    assert {"ilp60_solve_s", "ilp60_plan", "ilp60_status", "ilp60_milp_gap", "greedy_over_ilp"} <= set(out)


def test_image_pass_candidates_are_fitted_and_checked_as_the_shipped_profile_and_the_docs_quote_them():
    """benchmarks/perf_limitations.py's other forms of the image server's model: fitted on the datacenter boards'
    rows, scored on the L4 and T4 check's rows (every one of them); docs/perf-model.md quotes the figures it
    prints."""
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE, load_reference

    out = _module("perf_limitations").image_pass_candidates()
    rows = load_reference(HOLDOUT_IMAGE_FILE)
    docs = (ROOT / "docs" / "perf-model.md").read_text()
    for name, c in out.items():
        errors = c["check_error"]
        assert set(errors) == {f"{g} batch {b}" for g, b in zip(rows.gpu, rows.batch, strict=True)}
        assert c["check_mape"] == pytest.approx(np.mean(np.abs(list(errors.values()))), abs=2e-3)
        assert c["in_sample_mape"] < c["check_mape"]
        assert f"{c['check_mape']:.1%}" in docs, name


def test_prefill_wait_splits_what_the_replicas_took(monkeypatch):
    """Own prefill + wait is each request's prefill_ms, and no request waited less than nothing: the replicas'
    lone prefill is the run's own (scaled) service-time model, so the split reads the simulator's own times."""
    from controlplane.perf_models import build_run_perf
    from sim.run import run_scenario, scenario_catalog, scenario_topology
    from sim.scenario import load_scenario, with_overrides

    sc = with_overrides(load_scenario("small"), prefill_time_scale=1.5, gpu_inventory_scale=0.03)
    out = run_scenario(sc, requests=1500)
    perf = build_run_perf(sc.perf, scenario_topology(sc), 1.5, 1.0)
    got = _module("prefill_wait").split(out, perf, scenario_catalog(sc))
    assert set(got) == {"edge", "central"}
    waited = 0.0
    for block in got.values():
        for r in block["models"].values():
            assert r["wait_min_ms"] == 0.0 and r["own_prefill_p50_ms"] > 0
            assert r["replicas"] >= 1 and r["gpus"] >= 1
            waited += r["wait_mean_ms"] * r["requests"]
    assert waited > 0  # at 3% of the GPUs some prompt waited
