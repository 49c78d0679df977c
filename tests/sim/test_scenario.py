"""End-to-end runs of the small embedded scenario: determinism, faults, edge vs central, CLI and outputs."""

import json

import numpy as np
import pandas as pd
import pytest

from edgepop.cli import main
from sim.run import run_scenario


@pytest.fixture(scope="module")
def small(topo):
    return run_scenario("small", topo=topo)


def test_same_seed_same_parquet(topo, small, tmp_path):
    again = run_scenario("small", topo=topo)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    small.requests.to_parquet(a, index=False)
    again.requests.to_parquet(b, index=False)
    assert a.read_bytes() == b.read_bytes()
    # summary.json too, but for its performance block (the only wall-clock times)
    assert json.dumps({k: v for k, v in small.summary.items() if k != "performance"}, sort_keys=True) == \
        json.dumps({k: v for k, v in again.summary.items() if k != "performance"}, sort_keys=True)
    other = run_scenario("small", topo=topo, seed=99)
    assert not other.requests[["arrival_s", "model"]].equals(small.requests[["arrival_s", "model"]])


def test_a_deployment_gives_the_same_rows_alone_or_after_another(topo):
    """The central run alone and the central rows of a run after the edge are the same bytes: nothing one
    deployment leaves behind in the process (the shared service-time memo) may change another's results."""
    both = run_scenario("small", requests=3000, seed=7, topo=topo).requests
    alone = run_scenario("small", requests=3000, seed=7, topo=topo, deployments=("central",)).requests
    pd.testing.assert_frame_equal(both[both.deployment == "central"].reset_index(drop=True),
                                  alone.reset_index(drop=True))


def test_both_deployments_see_identical_arrivals(small):
    f = small.requests
    e, c = f[f.deployment == "edge"], f[f.deployment == "central"]
    assert len(e) == len(c) == small.summary["requests"]
    for col in ("request_id", "arrival_s", "model", "prompt_tokens", "user_lat", "user_lon"):
        np.testing.assert_array_equal(e[col].to_numpy(), c[col].to_numpy())


def test_every_request_ends_once_with_a_known_outcome(small):
    f = small.requests
    assert f.groupby("deployment").request_id.apply(lambda s: s.is_unique).all()
    assert set(f.outcome) <= {"ok", "rejected", "failed"}
    ok = f[f.outcome == "ok"]
    assert ok.ttft_ms.notna().all() and ok.e2e_ms.notna().all()
    assert (f[f.outcome != "ok"].error_code > 0).all()


def test_edge_beats_central_on_network_rtt_far_from_the_baseline(small):
    f = small.requests[small.requests.outcome == "ok"]
    far = f.user_continent.isin(["OC", "AF", "SA"]) | f.user_country.isin(["IN", "JP", "ID"])
    e = f[(f.deployment == "edge") & far].network_rtt_ms.median()
    c = f[(f.deployment == "central") & far].network_rtt_ms.median()
    assert e < 0.5 * c  # big3 is Virginia, Oregon and Ireland: far users gain most of their RTT
    gains = small.summary["gains"]
    assert gains["network_rtt_ms_p50_reduction_pct"] > 0


def test_summary_blocks(small):
    s = small.summary
    for dep in ("edge", "central"):
        b = s["deployments"][dep]
        assert sum(b["outcomes"].values()) == s["requests"]
        assert b["ttft_ms"]["p50"] <= b["ttft_ms"]["p95"] <= b["ttft_ms"]["p99"]
        assert 0 <= b["slo_attainment"] <= 1 and b["gpu_hours"] > 0 and b["neurons"] > 0
        assert set(b["per_continent"]) <= {"AF", "AS", "EU", "NA", "OC", "SA"}
    assert s["performance"]["simulated_requests_per_wall_s"] > 0


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_conservation_under_real_faults(topo, policy):
    from sim.scenario import load_scenario, with_overrides

    sc = with_overrides(load_scenario("small"), fault_policy=policy)
    busiest = "FRA"
    out = run_scenario(sc, topo=topo, requests=2000, deployments=("edge",),
                       faults=[f"pop:{busiest}@10+40", "node:LHR-0@5+60", "link:NewYork-Bude@0+100"])
    f = out.requests
    assert len(f) == 2000 and set(f.outcome) <= {"ok", "rejected", "failed"}
    down = f[(f.arrival_s > 11) & (f.arrival_s < 49)]
    assert not (down.serving_site == busiest).any() and not (down.ingress_pop == busiest).any()
    assert not (down.node.str.startswith(busiest + "-")).any()
    if policy == "fail":
        assert (f[f.outcome == "failed"].error_code.isin([3043, 3007])).all()


def test_bad_fault_spec_is_one_line(capsys):
    assert main(["simulate", "--scenario", "small", "--fail", "pop:FRA@oops"]) == 2
    err = capsys.readouterr().err
    assert "bad fault spec" in err and err.count("\n") == 1


def test_unknown_scenario_and_bad_sizes(capsys, tmp_path):
    assert main(["simulate", "--scenario", "nope"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "small", "--requests", "0", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()  # nothing written on a user error


def test_bad_scenario_file_names_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nkind = "poisson"\nrequests = 10\n\n[edge]\nrouter = 5\n')
    assert main(["simulate", "--scenario", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml [edge]" in err and "'router'" in err


def test_central_placement_other_than_central_is_named(tmp_path, capsys):
    bad = tmp_path / "mine.toml"
    bad.write_text('[workload]\nrequests = 100\n\n[central]\nplacement = "everywhere-fits"\n')
    assert main(["simulate", "--scenario", str(bad), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "mine.toml [central]" in err and "'placement'" in err and "'everywhere-fits'" in err
    assert err.count("\n") == 1 and not (tmp_path / "a").exists()


def test_a_placement_error_names_the_file_and_deployment(tmp_path, capsys):
    bad = tmp_path / "pp.toml"
    bad.write_text('gpu_inventory_scale = 0.1\n[workload]\nrequests = 100\n[edge]\nplacement = "per-pop"\n'
                   'pops = ["FRA", "LHR"]\n[edge.placement_options]\n'
                   'pops = {"@cf/meta/llama-3.2-1b-instruct" = ["FRA", "XXX"]}\n')
    assert main(["simulate", "--scenario", str(bad), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgepop: error: pp.toml [edge]: per-pop placement: ") and "XXX" in err
    assert err.count("\n") == 1 and not (tmp_path / "a").exists()


def test_a_scenario_file_may_leave_its_size_to_the_command_line(tmp_path, capsys):
    f = tmp_path / "mine.toml"
    f.write_text('[edge]\nplacement = "greedy-demand"\n')  # no [workload] size
    assert main(["simulate", "--scenario", str(f), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "mine.toml [workload]: no size" in err and "--requests" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()
    assert main(["simulate", "--scenario", str(f), "--requests", "300", "--only", "edge", "--json",
                 "--out", str(tmp_path / "b")]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 300


def test_cli_writes_parquet_summary_and_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--scenario", "small", "--requests", "600", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 600
    frame = pd.read_parquet(out / "requests.parquet")
    expected = {"deployment", "request_id", "model", "task", "user_lat", "user_lon", "user_country", "ingress_pop",
                "serving_site", "node", "arrival_s", "network_rtt_ms", "queue_ms", "cold_start_ms", "prefill_ms",
                "ttft_ms", "tpot_ms", "e2e_ms", "prompt_tokens", "output_tokens", "cached_tokens", "outcome",
                "error_code"}
    assert expected <= set(frame.columns) and len(frame) == 1200
    assert json.loads((out / "summary.json").read_text())["requests"] == 600
    report = (out / "report.md").read_text()
    for png in ("ttft_cdf.png", "utilisation.png", "ttft_gain_map.png"):
        assert (out / png).stat().st_size > 10_000 and png in report
    assert not (out / "sensitivity.png").exists() and not (out / "seeds.png").exists()  # (with those options only)
    # a gain with its whole interval (intervals of percentile differences need not be symmetric), the scope of
    # the intervals and of the percentiles, and the tail counting failures
    row = next(line for line in report.splitlines() if line.startswith("| TTFT p50 (ms) |"))
    lo, hi = summary["gains"]["ci95"]["ttft_ms_p50_reduction_pct"]
    assert row.endswith(f"% [{lo:+.1f}, {hi:+.1f}] |")
    assert "The interval is within this run" in report and "requests that ended ok on each side" in report
    assert "| TTFT p95 incl. failures (ms) |" in report
    day = summary["day"]  # which part of the compressed day the run saw, in the summary and the report
    # (simulated_span_s is rounded to 2 digits, hours_covered to 6)
    assert day["hours_covered"] == pytest.approx(24 * summary["simulated_span_s"] / day["day_s"], rel=1e-3)
    assert f"({3600 * day['hours_covered']:.2g} s of a day" in report  # (under a minute: in seconds, not "0.01 h")
    n = summary["deployments"]["edge"]["ttft_ms"]["n"]
    assert f"TTFT: {n:,} text generation requests at the edge" in report


def test_per_continent_gains_name_their_requests_and_skip_small_groups():
    from sim.gains import MIN_BIN
    from sim.metrics import gains

    def side(n, ttft):
        block = {m: {p: 10.0 for p in ("p50", "p95", "p99")} for m in ("ttft_ms", "tpot_ms", "e2e_ms",
                                                                      "network_rtt_ms")}
        return block | {"slo_attainment": 1.0, "per_continent": {
            "EU": {"ttft_requests": n, "ttft_p50_ms": ttft, "network_rtt_p50_ms": 5.0},
            "OC": {"ttft_requests": MIN_BIN - 1, "ttft_p50_ms": ttft, "network_rtt_p50_ms": 5.0}}}

    per = gains(side(MIN_BIN, 50.0), side(MIN_BIN, 100.0))["per_continent"]
    assert per["EU"] == {"ttft_requests": {"edge": MIN_BIN, "central": MIN_BIN}, "ttft_p50_reduction_pct": 50.0,
                         "network_rtt_p50_reduction_pct": 0.0}
    assert per["OC"] == {"ttft_requests": {"edge": MIN_BIN - 1, "central": MIN_BIN - 1}}


def test_trace_replay_keeps_the_trace(topo):
    from sim.traces import read_azure_trace

    out = run_scenario("small", topo=topo, trace="sim/data/azure_llm_conv_2023.csv", requests=500,
                       deployments=("edge",))
    trace = read_azure_trace("sim/data/azure_llm_conv_2023.csv").iloc[:500]
    f = out.requests.sort_values("request_id")
    np.testing.assert_allclose(np.sort(f.arrival_s.to_numpy()), np.sort(trace.arrival_s.to_numpy()), atol=1e-9)
    assert sorted(f.prompt_tokens) == sorted(trace.prompt_tokens)


def test_a_second_run_into_the_same_folder_leaves_none_of_the_firsts_outputs(tmp_path, capsys):
    """The edge alone draws no gain map: the first run's must not stay beside the second's report as if it were
    its own. Files the user put there stay."""
    out = tmp_path / "run"
    assert main(["simulate", "--scenario", "small", "--requests", "400", "--out", str(out)]) == 0
    assert (out / "ttft_gain_map.png").exists()
    (out / "notes.txt").write_text("mine")
    assert main(["simulate", "--scenario", "small", "--requests", "400", "--only", "edge", "--out", str(out)]) == 0
    assert not (out / "ttft_gain_map.png").exists() and (out / "notes.txt").read_text() == "mine"
    assert "ttft_gain_map.png" not in (out / "report.md").read_text()


def test_write_outputs_names_a_file_in_the_way(small, tmp_path):
    from edgepop.errors import UserError
    from sim.outputs import write_outputs

    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="output folder .*afile: exists and is not a folder"):
        write_outputs(small, tmp_path / "afile")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_with_overrides_names_an_unknown_field_or_a_bad_seed():
    """(``dataclasses.replace`` gave a raw TypeError; a seed of None ran unseeded, then failed in the bootstrap)"""
    import numpy as np

    from edgepop.errors import UserError
    from sim.scenario import load_scenario, with_overrides

    sc = load_scenario("small")
    with pytest.raises(UserError, match="with_overrides: no Scenario field 'sede'"):
        with_overrides(sc, sede=3)
    with pytest.raises(UserError, match="with_overrides: no WorkloadConfig field 'rsp'"):
        with_overrides(sc, workload={"rsp": 3.0})
    for seed in (None, "3", 3.5, -1):
        with pytest.raises(UserError, match="with_overrides: seed must be an integer"):
            with_overrides(sc, seed=seed)
    assert with_overrides(sc, seed=np.int64(4)).seed == 4


@pytest.mark.parametrize("argv, before", [
    (["simulate", "--only", "central"], "only central asked for: "),
    (["simulate", "--seeds", "1,2"], "--seeds compares edge and central: "),
    (["simulate", "--sensitivity"], "--sensitivity compares edge and central: "),
    (["frontier", "--baselines", "big3"], "baselines 'big3' name central region sets: "),
    (["frontier", "--only", "central"], "only = 'central' asked for: ")])
def test_a_missing_central_deployment_is_said_one_way(tmp_path, capsys, argv, before):
    """Every option that needs the central deployment refuses a scenario without one in the same words."""
    off = tmp_path / "off.toml"
    off.write_text("[workload]\nrequests = 100\n\n[central]\nenabled = false\n")
    assert main([*argv, "--scenario", str(off), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgepop: error: " + before + "scenario 'off' has no central deployment ([central] "
                          "enabled = false)") and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["off.toml"]
