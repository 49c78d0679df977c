"""Async batch on night-side GPUs, and the technique ablation run as a named grid by the sweep machinery."""

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from kit.sim import deployment, workload

from controlplane.catalog import Catalog, default_catalog
from edgepop.errors import UserError
from sim.grid import load_grid, parse_grid
from sim.simulator import Simulation
from sim.techniques import TechniqueRuntime, Techniques
from sim.techniques.ablation import ablation_table, run_ablation
from sim.techniques.batch_policy import apply_night_policy, hours_until_night, night_share, solar_hour
from sim.techniques.metrics import technique_figures

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def test_solar_night_window():
    assert solar_hour(0.0, 23.0) == pytest.approx(23.0)
    assert solar_hour(180.0, 12.0) == pytest.approx(0.0)
    assert list(hours_until_night([23.0, 3.0, 12.0, 21.5])) == [0.0, 0.0, 10.0, 0.5]


def test_night_policy_serves_batch_at_night_side_and_keeps_interactive_ttft():
    spec = replace(default_catalog()[LLAMA], max_batch=16)
    cat = Catalog([spec])
    rng = np.random.default_rng(3)
    n = 400
    arrivals = np.cumsum(rng.exponential(1 / 6.0, n))
    w = workload(arrivals, spec.id, "text-generation", rng.integers(200, 3000, n), output=rng.integers(20, 200, n))
    w["batch"] = rng.random(n) < 0.3
    rtt = [[0.0, 60.0], [60.0, 0.0]]  # two PoPs / sites; every user enters at S0 (noon), S1 is at midnight

    def run(policy: bool):
        dep = deployment(cat, spec.id, 2, rtt, sites=[0, 1])
        dep.fleet.sites["lon"] = [0.0, 180.0]
        frame, orig = w, w.arrival_s.to_numpy()
        if policy:
            topo = SimpleNamespace(pops=pd.DataFrame({"id": ["S0", "S1"]}))
            table = pd.DataFrame({"model": [spec.id, spec.id], "node": [0, 1]})
            frame, orig, info = apply_night_policy(w, topo, dep.fleet, table, "2024-03-20T12:00:00+00:00",
                                                   86_400.0, np.asarray(rtt))
            assert info["batch_requests"] == int(w.batch.sum()) and info["held"] == 0
        req = Simulation(dep, frame, _roofline()).run().requests
        done = req.e2e_ms.to_numpy() / 1e3 + (frame.arrival_s.to_numpy() - orig)
        return req, technique_figures(req, ~w.batch.to_numpy(), done), dep

    base, f0, _ = run(False)
    night, f1, dep = run(True)
    batch = w.batch.to_numpy()
    assert (night.serving_site[batch & (night.outcome == "ok")] == "S1").all()
    assert night_share(night, batch, dep.fleet, "2024-03-20T12:00:00+00:00", 86_400.0, w.arrival_s) == 1.0
    assert (base.serving_site[batch & (base.outcome == "ok")] == "S0").mean() > 0.5
    assert f1["ttft_p95_ms"] <= f0["ttft_p95_ms"]
    assert math.isfinite(f1["batch_completion_p95_s"])


def test_a_held_batch_row_is_released_at_night_as_the_night_share_counts_it():
    # One day-side site (07:00 local): every batch row is held to 22:00, and the share must count all as served at
    # night. Released at exactly 22:00 in real numbers, about half used to round to a hair before it.
    spec = default_catalog()[LLAMA]
    n = 200
    arrivals = np.sort(np.random.default_rng(7).uniform(0.0, 30.0, n))
    w = workload(arrivals, spec.id, "text-generation", 100, output=20)
    w["batch"] = True
    dep = deployment(Catalog([spec]), spec.id, 1, [[0.0]], sites=[0])
    dep.fleet.sites["lon"] = [8.68]
    topo = SimpleNamespace(pops=pd.DataFrame({"id": ["S0"]}))
    table = pd.DataFrame({"model": [spec.id], "node": [0]})
    start = "2024-03-20T07:00:00+00:00"
    out, _, info = apply_night_policy(w, topo, dep.fleet, table, start, 86_400.0, np.array([[0.0]]))
    assert info["held"] == n
    exact = (22.0 - 7.0 - 8.68 / 15.0) * 3600.0  # 22:00 local
    assert np.abs(out.arrival_s.to_numpy() - exact).max() < 1e-6  # no later than rounding needs
    served = pd.DataFrame({"outcome": ["ok"] * n, "serving_site": dep.fleet.sites.site_id.iloc[0]})
    assert night_share(served, w.batch.to_numpy(), dep.fleet, start, 86_400.0, out.arrival_s) == 1.0


def test_night_policy_counts_every_quiet_day_side_choice():
    """A quiet day-side site wins over a busy night-side one; the counter says so although a night host exists."""
    spec = default_catalog()[LLAMA]
    n = 600
    arrivals = np.linspace(0.0, 60.0, n, endpoint=False)
    w = workload(arrivals, spec.id, "text-generation", 500, output=50, ingress=np.where(np.arange(n) % 5, 1, 0))
    w["batch"] = np.arange(n) % 5 == 0  # batch rows enter at S0 (noon), interactive ones at S1 (midnight)
    dep = deployment(Catalog([spec]), spec.id, 2, [[0.0, 60.0], [60.0, 0.0]], sites=[0, 1])
    dep.fleet.sites["lon"] = [0.0, 180.0]
    topo = SimpleNamespace(pops=pd.DataFrame({"id": ["S0", "S1"]}))
    table = pd.DataFrame({"model": [spec.id, spec.id], "node": [0, 1]})
    out, _, info = apply_night_policy(w, topo, dep.fleet, table, "2024-03-20T12:00:00+00:00", 86_400.0,
                                      np.array([[0.0, 60.0], [60.0, 0.0]]))
    day_side = int((out.ingress.to_numpy()[w.batch.to_numpy()] == 0).sum())
    assert day_side > 0 and info["held"] == 0
    assert info["day_side_low_load"] == day_side


def _roofline():
    from pathlib import Path

    from controlplane.perf import Roofline, gpu_table

    return Roofline(gpu_table(pd.read_csv(Path(__file__).resolve().parents[2] / "topology" / "data" / "gpus.csv")))


def test_techniques_off_change_nothing():
    rt = TechniqueRuntime(Techniques())
    cat, perf = default_catalog(), object()
    assert not rt.parts and rt.catalog(cat) is cat and rt.perf(perf) is perf
    assert rt.plane_options("edge") == {} and rt.for_simulation("edge") is None


ROWS = ["baseline", "prefix_cache", "speculative", "disaggregation", "precision=fp8", "lora", "batch_policy=night",
        "chunked_prefill"]


def test_ablation_grid_is_validated():
    grid = load_grid("ablation")
    assert list(grid.names) == ROWS and grid.baseline == "baseline" and grid.deployments == ("edge",)
    bad = {"base": "ablation", "baseline": "nothing", "variants": [{"name": "baseline"}]}
    with pytest.raises(UserError, match="baseline 'nothing' is not one of the named variants"):
        parse_grid(bad, "g.toml")
    with pytest.raises(UserError, match="unknown axis 'techniques.warp_drive'"):
        parse_grid({"base": "ablation", "variants": [{"name": "x", "techniques.warp_drive": True}]}, "g.toml")
    with pytest.raises(UserError, match="unknown routing policy 'warp'"):
        parse_grid({"base": "ablation", "variants": [{"name": "x", "edge.router": "warp"}]}, "g.toml")
    axes = parse_grid({"base": "ablation", "baseline": "baseline", "variants": [{"name": "baseline"}],
                       "axes": {"workload.rps": [10.0, 80.0]}}, "g.toml")
    with pytest.raises(UserError, match=r"takes no \[axes\] \(workload.rps\)"):
        run_ablation(axes)  # its table would keep the first point only
    seeds = parse_grid({"base": "ablation", "baseline": "baseline", "variants": [{"name": "baseline"}],
                        "seeds": [1, 2]}, "g.toml")
    with pytest.raises(UserError, match=r"takes one seed, got \[1, 2\]"):
        run_ablation(seeds)  # the same: its table would keep the first seed only


def test_ablation_requests_are_checked_as_a_grids_size_before_any_variant_runs(tmp_path, monkeypatch, capsys):
    from edgepop.cli import main

    def no_run(*a, **k):
        raise AssertionError("a variant ran")

    monkeypatch.setattr("sim.techniques.ablation.run_sweep", no_run)
    path = tmp_path / "abl1.toml"
    path.write_text('base = "ablation"\ndeployments = ["edge"]\nbaseline = "base"\n[[variants]]\nname = "base"\n'
                    '[[variants]]\nname = "small"\n"workload.requests" = 500\n')
    # --requests would overwrite the variant's own size silently (every row the same run, every delta 0%)
    with pytest.raises(UserError, match=r"^abl1\.toml: 'workload\.requests' varies the size, which --requests 1000 "
                                        r"sets for every variant: drop one of them$"):
        run_ablation(load_grid(path), requests=1000)
    out = tmp_path / "o"
    assert main(["ablation", "--grid", str(path), "--requests", "1000", "--workers", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgepop: error: abl1.toml: 'workload.requests' varies the size") and "\n" not in err
    with pytest.raises(UserError, match=r"^ablation\.toml: --requests must be at most 100,000,000 a variant"):
        run_ablation("ablation", requests=999_999_999)
    with pytest.raises(UserError, match=r"^ablation\.toml: --requests must be a positive integer, got 0$"):
        run_ablation("ablation", requests=0)


def test_tiny_ablation_has_one_finite_row_per_technique(tmp_path):
    df, result = run_ablation("ablation", requests=300, workers=1, out=tmp_path / "abl")
    assert list(df.technique) == ROWS
    for r in df.to_dict("records"):
        for m in ("ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms",
                  "gpu_busy_hours"):
            assert math.isfinite(r[m]) and r[m] > 0, (r["technique"], m)
        assert r["gpus_placed"] > 0
    by = df.set_index("technique")
    assert by.loc["speculative", "tpot_p50_ms"] < by.loc["baseline", "tpot_p50_ms"]
    assert by.loc["precision=fp8", "tpot_p50_ms"] < by.loc["baseline", "tpot_p50_ms"]
    assert by.loc["baseline", "d_ttft_p95_ms_pct"] == 0.0
    assert "hit ratio" in by.loc["prefix_cache", "note"] and "adapter requests" in by.loc["lora", "note"]
    assert len(pd.read_csv(result.path / "ablation.csv")) == len(ROWS)
    assert (result.path / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(pd.read_parquet(result.path / "sweep_summary.parquet").variant_name) == set(ROWS)


def test_cli_runs_the_ablation_grid(tmp_path, capsys):
    from edgepop.cli import main

    out = tmp_path / "abl"
    assert main(["ablation", "--requests", "200", "--workers", "1", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["technique"] for r in doc["rows"]] == ROWS and doc["baseline"] == "baseline"
    assert (out / "ablation.csv").exists()
    assert main(["ablation", "--grid", "policies", "--out", str(out)]) == 2
    assert "named variants" in capsys.readouterr().err


def test_the_night_policy_is_listed_only_for_the_deployment_it_moves(topo):
    from sim.run import run_scenario
    from sim.scenario import load_scenario

    sc = load_scenario("small")
    sc = replace(sc, techniques=Techniques(batch_policy="night"))
    out = run_scenario(sc, topo=topo, requests=300)
    blocks = out.summary["deployments"]
    assert "batch_policy=night" in blocks["edge"]["techniques"]["enabled"]
    assert blocks["central"]["techniques"]["enabled"] == []  # its batch rows are served where they would be


def test_a_grid_without_deployments_ablates_the_edge_only_and_says_so(tmp_path, capsys):
    """The table has one row per technique: a grid naming no deployments simulated central too, for no row
    (the title said "edge, central only"); now it simulates what it reports, with the same edge rows."""
    from edgepop.cli import main

    variants = 'baseline = "b"\n[[variants]]\nname = "b"\n[[variants]]\nname = "fp8"\n"techniques.precision" = "fp8"\n'
    (tmp_path / "both.toml").write_text('base = "small"\nrequests = 300\n' + variants)
    (tmp_path / "edge.toml").write_text('base = "small"\nrequests = 300\ndeployments = ["edge"]\n' + variants)
    assert main(["ablation", "--grid", str(tmp_path / "both.toml"), "--workers", "1", "--out",
                 str(tmp_path / "both")]) == 0
    assert "(base small, seed 7, edge only, same arrivals)" in " ".join(capsys.readouterr().out.split())
    assert set(pd.read_parquet(tmp_path / "both" / "sweep_summary.parquet").deployment) == {"edge"}
    assert json.loads((tmp_path / "both" / "ablation.json").read_text())["deployment"] == "edge"
    run_ablation(tmp_path / "edge.toml", workers=1, out=tmp_path / "edge", progress=False)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "both" / "ablation.csv"),
                                  pd.read_csv(tmp_path / "edge" / "ablation.csv"))
    explicit = parse_grid({"base": "small", "deployments": ["edge", "central"], "baseline": "b",
                           "variants": [{"name": "b"}]}, "two.toml")
    with pytest.raises(UserError, match=r"^two\.toml: an ablation compares its named variants on one deployment, "
                                        r"got deployments = \['edge', 'central'\]: keep one of them"):
        run_ablation(explicit)
    central_key = parse_grid({"base": "small", "baseline": "b", "variants": [
        {"name": "b"}, {"name": "c", "central.router": "p2c"}]}, "ck.toml")
    with pytest.raises(UserError, match=r"'central\.router' sets the central deployment.*\(a grid without "
                                        r"`deployments` ablates the edge only\)$"):
        run_ablation(central_key)  # it would be a row identical to the baseline's
    central = parse_grid({"base": "small", "requests": 200, "deployments": ["central"], "baseline": "b",
                          "variants": [{"name": "b"}]}, "c.toml")
    table, result = run_ablation(central, workers=1, out=tmp_path / "central", progress=False)
    assert set(result.summary.deployment) == {"central"} and len(table) == 1


@pytest.mark.parametrize("key, value", [("workload.requests", 200), ("workload.rps", 400.0)])
def test_an_ablation_refuses_a_variant_that_changes_the_arrivals(tmp_path, monkeypatch, key, value):
    def no_run(*a, **k):
        raise AssertionError("a variant ran")

    monkeypatch.setattr("sim.techniques.ablation.run_sweep", no_run)
    path = tmp_path / "g6.toml"
    path.write_text(f'base = "ablation"\nbaseline = "a"\n[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n'
                    f'"{key}" = {value}\n')
    with pytest.raises(UserError, match=rf"^g6\.toml: variant 'b' sets '{key}', but an ablation compares its "
                                        r"variants on the same arrivals"):
        run_ablation(load_grid(path))
    # (a variant's seed is refused by every grid already: seeds are set with `seeds = [...]`)


def test_the_lora_note_says_no_adapter_requests_rather_than_a_nan_wait():
    rows = pd.DataFrame({"deployment": "edge", "variant_name": ["baseline", "lora"], "requests": 1,
                         "adapter_requests": [math.nan, 0], "adapter_load_ms": [math.nan, math.nan]})
    assert list(ablation_table(rows, "baseline").note) == ["", "no adapter requests"]


def test_an_interrupted_ablation_leaves_the_earlier_run_whole(tmp_path, monkeypatch):
    import sim.techniques.ablation as ablation

    out = tmp_path / "abl"
    run_ablation("ablation", requests=100, workers=1, out=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(*args, **kwargs):  # as a SIGTERM would, once the sweep is done and the table not yet written
        raise KeyboardInterrupt

    monkeypatch.setattr(ablation, "write_ablation", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_ablation("ablation", requests=60, workers=1, out=out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no new sweep files beside the old table
    assert [p.name for p in tmp_path.iterdir()] == ["abl"]  # and no staging folder left behind


HELD = """seed = 7
gpu_inventory_scale = 0.1
[workload]
kind = "poisson"
requests = 900
rps = 25.0
day_compression = 600
start_utc = "2024-03-20T12:00:00+00:00"
batch_fraction = 0.5
[edge]
placement = "greedy-demand"
router = "nearest-balanced"
pops = ["FRA", "LHR", "AMS", "CDG", "MAD", "MXP"]
[central]
baseline = "big3"
placement = "central"
router = "nearest-balanced"
[techniques]
batch_policy = "night"
"""


def test_requests_parquet_alone_gives_the_batch_completion_of_held_rows(tmp_path, topo):
    # European PoPs at noon UTC: no host is at night, so the night policy holds batch rows for minutes. The frame
    # keeps when each user sent the request (the same on both sides) and says how long it was held.
    from edgepop.stats import percentiles
    from sim.outputs import write_outputs
    from sim.run import run_scenario

    path = tmp_path / "held.toml"
    path.write_text(HELD)
    write_outputs(run_scenario(str(path), topo=topo), tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    edge = df[df.deployment == "edge"].set_index("request_id")
    central = df[df.deployment == "central"].set_index("request_id").loc[edge.index]
    assert summary["deployments"]["edge"]["techniques"]["batch_policy"]["held"] > 50
    assert (edge.held_s > 0).sum() == summary["deployments"]["edge"]["techniques"]["batch_policy"]["held"]
    assert (edge.held_s[~edge.batch] == 0).all() and (central.held_s == 0).all()
    np.testing.assert_array_equal(edge.arrival_s.to_numpy(), central.arrival_s.to_numpy())
    for name, g in (("edge", edge), ("central", central)):
        ok = (g.outcome == "ok") & g.batch
        got = percentiles((g.held_s + g.e2e_ms / 1e3)[ok])
        want = summary["deployments"][name]["batch_completion_s"]
        assert got["n"] == want["n"] > 0
        for k in ("p50", "p90", "p95", "p99", "mean"):
            assert got[k] == pytest.approx(want[k], abs=1.5e-3), (name, k)
