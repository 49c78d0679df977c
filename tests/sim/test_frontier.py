"""``edgepop frontier``: the least GPU count against the Erlang C closed form, engines agree, bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgepop.cli import main
from edgepop.errors import UserError
from sim.frontier import parse_slo, run_frontier

CATALOG = Path(__file__).resolve().parents[2] / "controlplane" / "data" / "catalog.toml"
MODEL = "@cf/meta/llama-3.2-1b-instruct"
WAIT_S = 2.0  # the SLO: 95% of requests wait at most this long for a GPU


def erlang_c_servers(lam: float, mean_service_s: float, wait_s: float, quantile: float = 0.95) -> int:
    """Least c with P(W > wait_s) <= 1 - quantile in M/M/c: P(W > t) = C(c, a) exp(-(c mu - lambda) t)."""
    mu, a = 1.0 / mean_service_s, lam * mean_service_s
    for c in range(1, 200):
        if a >= c:
            continue
        tail = a**c / math.factorial(c) / (1 - a / c)
        p_wait = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
        if p_wait * math.exp(-(c * mu - lam) * wait_s) <= 1 - quantile:
            return c
    raise AssertionError("no c found")


@pytest.fixture(scope="module")
def mmc(tmp_path_factory, topo):
    """One PoP holding one small GPU per unit of inventory scale, one model that runs one sequence per GPU, flat
    Poisson arrivals and exponential-like service times (output lengths with coefficient of variation 1)."""
    d = tmp_path_factory.mktemp("mmc")
    block = re.search(r'(\[models\."' + re.escape(MODEL) + r'"\].*?)\n\n', CATALOG.read_text(), re.S).group(1)
    (d / "catalog.toml").write_text(block.replace("max_batch = 64", "max_batch = 1") + "\n")
    pop = topo.pops[(topo.pops.tier == 4)].id.iloc[0]  # a city PoP: one single-GPU node at scale 1
    path = d / "mmc.toml"
    path.write_text(f'''description = "one site, one model, one sequence per GPU: an M/M/c queue"
seed = 3
catalog = "{d / 'catalog.toml'}"
[workload]
kind = "poisson"
requests = 5000
rps = 2.0
diurnal = false
mix = {{"{MODEL}" = 1.0}}
[workload.tokens.text-generation]
prompt = {{median = 32, sigma = 0.0}}
output = {{median = 150, sigma = 0.8326}}
[edge]
pops = ["{pop}"]
router = "nearest-balanced"
queue_limit = 100000
queue_timeout_s = 100000.0
[central]
enabled = false
''')
    return path


def test_least_gpus_agree_with_erlang_c(mmc, tmp_path):
    f = run_frontier(mmc, slo=f"queue_p95_ms={WAIT_S * 1e3:g}", budgets=[4, 6, 10, 14], absolute=True,
                     seeds=[1], workers=1, max_steps=4, tolerance=0.0, out=tmp_path / "f", progress=False)
    rows = pd.read_parquet(tmp_path / "f" / "frontier.parquet")
    assert set(rows.line) == {"edge"} and rows.gpus.is_unique  # one seed: one row per budget
    # The closed form, fed with the arrival rate and the mean service time the simulator produced.
    ok = rows[rows.gpus >= 10].iloc[0]
    lam = ok.requests / ok.simulated_span_s
    mean_service_s = _mean_service_s(mmc)
    expect = erlang_c_servers(lam, mean_service_s, WAIT_S)
    got = f.result["deployments"]["edge"]
    assert got["status"] == "bracketed" and got["fails_at_gpus"] == got["min_gpus_for_slo"] - 1
    assert abs(got["min_gpus_for_slo"] - expect) <= 1, (got, expect, lam, mean_service_s)
    written = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert written["deployments"]["edge"]["min_gpus_for_slo"] == got["min_gpus_for_slo"]
    assert (tmp_path / "f" / "frontier.png").stat().st_size > 10_000
    assert "Least budget meeting the SLO" in (tmp_path / "f" / "report.md").read_text()


def _mean_service_s(scenario: Path) -> float:
    """Mean time a request holds its GPU (prefill + decode), from a run with GPUs to spare."""
    from sim.run import run_scenario
    from sim.scenario import load_scenario, with_overrides

    out = run_scenario(with_overrides(load_scenario(scenario), gpu_inventory_scale=20.0), requests=2000)
    ok = out.requests[out.requests.outcome == "ok"]
    return float((ok.prefill_ms + ok.e2e_ms - ok.ttft_ms).mean() / 1e3)


def test_local_pool_and_ray_give_the_same_frontier(mmc, tmp_path):
    pytest.importorskip("ray")
    kw = dict(slo="queue_p95_ms=2000", budgets=[6, 12], absolute=True, seeds=[1, 2], requests=800, max_steps=1,
              progress=False)
    local = run_frontier(mmc, engine="local", workers=2, out=tmp_path / "local", **kw)
    ray = run_frontier(mmc, engine="ray", workers=2, out=tmp_path / "ray", **kw)
    a = pd.read_parquet(tmp_path / "local" / "frontier.parquet").drop(columns=["run_wall_s"])
    b = pd.read_parquet(tmp_path / "ray" / "frontier.parquet").drop(columns=["run_wall_s"])
    pd.testing.assert_frame_equal(a, b)
    assert local.result["points"] == ray.result["points"]  # wall times are not among the points' figures
    assert local.result["deployments"] == ray.result["deployments"]


@pytest.mark.parametrize("text, needle", [("ttft_p95_ms", "METRIC=VALUE"), ("nothing=3", "METRIC=VALUE"),
                                          ("ttft_p95_ms=-1", "non-negative"), ("ttft_p95_ms=abc", "METRIC=VALUE"),
                                          # targets no fleet can meet, or every fleet meets (a 0 ms TTFT once
                                          # ran every budget and then failed drawing its log axis)
                                          ("ttft_p95_ms=0", "no request takes 0 ms"),
                                          ("tpot_p50_ms=0", "no request takes 0 ms"),
                                          ("goodput_rps=0", "every fleet has at least 0"),
                                          ("slo_attainment=0", "every fleet has at least 0")])
def test_bad_slo_is_one_line(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_slo(text)


def test_a_zero_queue_target_is_a_target():
    """No queueing at all is something a fleet can reach: refused for latencies, accepted for the queue."""
    slo = parse_slo("queue_p95_ms=0")
    assert slo.met(0.0) and not slo.met(0.5)


def test_the_least_budget_says_whether_its_interval_clears_the_slo():
    """Decided on the mean over seeds; ``interval_at_least`` says whether the seeds' 95% interval is within the
    SLO too (ttft_p95_ms <= 500, decided on the column that counts unanswered requests)."""
    from sim.frontier import Line, Point
    from sim.frontier_report import least

    slo = parse_slo("ttft_p95_ms=500")

    def point(scale, values):
        return Point(Line("edge"), scale, gpus=int(10 * scale), usd_per_hour=scale, feasible=True,
                     rows=[{slo.column: v} for v in values])

    fail = point(1.0, [600.0, 640.0, 620.0])
    assert least([fail, point(2.0, [480.0, 490.0, 485.0])], slo)["interval_at_least"] == "clears the SLO"
    assert least([fail, point(2.0, [380.0, 590.0, 470.0])], slo)["interval_at_least"] == "straddles the SLO"
    assert least([fail, point(2.0, [480.0])], slo)["interval_at_least"] == "one seed: no interval"


def test_slo_direction():
    assert parse_slo("ttft_p95_ms=500").met(499.0) and not parse_slo("ttft_p95_ms=500").met(501.0)
    assert parse_slo("slo_attainment=0.99").met(0.995) and not parse_slo("slo_attainment=0.99").met(0.98)


@pytest.mark.parametrize("argv, needle", [
    (["--budgets", "1"], "at least two different positive numbers"), (["--budgets", "1,x"], "comma-separated"),
    (["--baselines", "mars-1"], "unknown baseline"), (["--seeds", "1,1"], "distinct"),
    (["--scenario", "nope"], "not found"), (["--slo", "ttft=3"], "METRIC=VALUE"),
    (["--budgets", "1,1"], "two different"), (["--slo", "slo_attainment=2"], "at most 1"),
    (["--baselines", ""], "no region set"), (["--seeds", "1,,2"], "comma-separated"),
    (["--only", "edge", "--baselines", "big3"], "only = 'edge' sweeps no central line"),
    (["--scenario", "ablation", "--baselines", "nosuch"], "has no central deployment")])
def test_cli_errors_are_one_line(argv, needle, capsys, tmp_path):
    assert main(["frontier", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("edgepop: error: ") and needle in err


def test_edge_rows_do_not_depend_on_sharing_a_run_with_central(tmp_path):
    """At equal budgets the edge and central share one run (one workload); the edge's figures are the same as
    when it runs alone."""
    kw = dict(slo="ttft_p95_ms=100000", budgets=[0.1, 0.2], absolute=True, seeds=[1], requests=300, max_steps=0,
              workers=1, progress=False)
    both = run_frontier("small", out=tmp_path / "both", **kw)
    alone = run_frontier("small", only="edge", out=tmp_path / "alone", **kw)
    cols = ["inventory_scale", "gpus", "ttft_p50_ms", "ttft_p95_ms", "slo_attainment", "replicas"]
    a = pd.read_parquet(tmp_path / "both" / "frontier.parquet").query("line == 'edge'")[cols]
    b = pd.read_parquet(tmp_path / "alone" / "frontier.parquet")[cols]
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    assert set(both.result["deployments"]) == {"edge", "central:big3"} and set(alone.result["deployments"]) == {"edge"}
    assert both.result["deployments"]["edge"]["status"] == "at_or_below_smallest_budget"
    # both meet a loose SLO at the smallest budget: bounded neither way, so no number (1.0 read as parity)
    assert both.result["iso_slo_cost_ratio"] is None and both.result["iso_slo_ratio_kind"] == "unknown"
    # each line's router is named, and no warning when they are the same rule
    rule = {"router": "nearest-balanced", "options": {"window_ms": 0.0}}  # (the scenario's, with the defaults)
    assert both.result["routing"] == {"edge": rule, "central:big3": rule}
    text = (tmp_path / "both" / "report.md").read_text()
    assert "Routing: edge by nearest-balanced (window_ms = 0); central:big3 by nearest-balanced (window_ms = 0)." \
        in text
    assert "routed by different rules" not in text
    # and the network every budget ran over: part of the latency the SLO bounds
    assert both.result["network"] == {"last_mile": "fixed 10 ms for every user", "jitter": "off",
                                      "anycast_misroute": 0.0}
    assert "Network: last mile fixed 10 ms for every user; per-request RTT jitter off." in text
    central = run_frontier("small", only="central", out=tmp_path / "central", **kw)
    assert set(central.result["deployments"]) == {"central:big3"} and central.result["iso_slo_cost_ratio"] is None
    for run in ("alone", "central"):  # one side only: no ratio, and no per-baseline line of Nones
        text = (tmp_path / run / "report.md").read_text()
        assert "No iso-SLO cost ratio: it needs the edge's line and a central line" in text
        assert "None" not in text and "- against" not in text


def test_the_frontier_keeps_the_users_files_and_leaves_no_scratch(tmp_path):
    """Its rounds run in a scratch folder of its own: a ``rounds`` folder of the user's in ``--out`` survives, and
    neither a finished nor a failed run leaves anything beside ``--out``."""
    out = tmp_path / "proj"
    (out / "rounds").mkdir(parents=True)
    (out / "rounds" / "notes.txt").write_text("mine")
    kw = dict(slo="ttft_p95_ms=100000", budgets=[0.1, 0.2], absolute=True, seeds=[1], requests=300, max_steps=0,
              workers=1, progress=False, only="edge")
    run_frontier("small", out=out, **kw)
    assert (out / "rounds" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == [".edgepop-runs", "frontier.json", "frontier.parquet",
                                                     "frontier.png", "report.md", "rounds"]
    bad = tmp_path / "bad.toml"
    small = Path(__file__).resolve().parents[2] / "sim" / "scenarios" / "small.toml"
    bad.write_text('faults = ["pop:XXX@0+10"]\n' + small.read_text())  # (top-level keys before the tables)
    with pytest.raises(UserError, match="pop:XXX"):
        run_frontier(bad, out=tmp_path / "failed", **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "proj"]


def test_a_latency_the_workload_never_has_is_refused_before_any_work(tmp_path):
    """Embeddings only: no request has a TTFT, so every budget "failed" a TTFT target after the whole sweep."""
    small = Path(__file__).resolve().parents[2] / "sim" / "scenarios" / "small.toml"
    emb = tmp_path / "emb.toml"
    emb.write_text(small.read_text().replace("[workload]\n", '[workload]\nmix = { "@cf/baai/bge-m3" = 1.0 }\n', 1)
                   .replace("session_fraction = 0.3", "session_fraction = 0.0"))
    kw = dict(seeds=[1], requests=200, max_steps=0, workers=1, progress=False, only="edge")
    for slo in ("ttft_p95_ms=500", "tpot_p50_ms=50"):
        with pytest.raises(UserError, match="emb.toml's workload has no text-generation model"):
            run_frontier(emb, slo=slo, out=tmp_path / "o", **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.toml"]


def test_bad_budgets_and_outputs_are_refused_before_any_work(tmp_path):
    """An inventory scale past 100 would build fleets of millions of GPUs (it hung); a file where the output
    folder should go would have lost the finished run's results at the end."""
    kw = dict(slo="ttft_p95_ms=1000", seeds=[1], requests=300, max_steps=0, workers=1, progress=False, only="edge")
    with pytest.raises(UserError, match=r"an inventory scale of 1e\+09 is over 100"):
        run_frontier("small", budgets=[0.1, 1e9], absolute=True, out=tmp_path / "o", **kw)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="exists and is not a folder"):
        run_frontier("small", budgets=[0.1, 0.2], absolute=True, out=tmp_path / "afile", **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_frontier_continents_with_too_few_requests_and_an_unbounded_ratio_are_said(tmp_path, capsys):
    from sim.frontier_report import MIN_CONTINENT_REQUESTS

    out = tmp_path / "f"
    assert main(["frontier", "--scenario", "small", "--requests", "1000", "--budgets", "0.25,0.5,1",
                 "--max-steps", "1", "--workers", "1", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    r = json.loads((out / "frontier.json").read_text())
    report = (out / "report.md").read_text()
    requests = {cont: max(row[f"continent_{cont}_requests"] for row in _rows(out)) for cont in r["per_continent"]}
    few = [c for c, n in requests.items() if n < MIN_CONTINENT_REQUESTS]
    assert "NA" in few and "EU" not in few  # (small at 1,000 requests: 53 from North America)
    for cont, d in r["per_continent"].items():
        for b in d["deployments"].values():
            assert (b["status"] == "too_few_requests") == (cont in few), (cont, b)
            if cont in few:
                assert b["requests_per_run"] == requests[cont] and b["min_gpus_for_slo"] is None
    assert f"| NA | too few requests ({requests['NA']:,.0f}) |" in report
    assert f"NA ({requests['NA']:,.0f} requests a run)" in report and "NA (" in terminal
    # both lines met the SLO at the smallest budget: the ratio is unknown, and the reader is told why
    assert r["iso_slo_ratio_kind"] == "unknown"
    assert "Unknown: both lines met the SLO at the smallest budget tried" in report
    assert "Unknown: both lines met the SLO at the smallest budget tried" in terminal


def _rows(out) -> list[dict]:
    frame = pd.read_parquet(out / "frontier.parquet")
    return frame[frame.seed >= 0].to_dict("records")


def test_a_continents_ratio_is_as_bounded_as_its_least_budgets(tmp_path):
    """A continent's least budget found at the smallest budget tried may be less, as a line's may: its iso-SLO
    ratio says so (it read as exact, 6.302 for North America where central met the SLO at the smallest budget),
    and a baseline line with no ratio prints "not available", not "(None)"."""
    out = tmp_path / "f"
    assert main(["frontier", "--scenario", "small", "--requests", "2000", "--seeds", "1-2", "--slo",
                 "ttft_p95_ms=300", "--budgets", "0.05,0.1,0.3,1", "--max-steps", "2", "--out", str(out)]) == 0
    r = json.loads((out / "frontier.json").read_text())
    report = (out / "report.md").read_text()
    frame = pd.read_parquet(out / "frontier.parquet")
    tried = {line: sorted(set(rows.inventory_scale)) for line, rows in frame.groupby("line")}  # infeasible too

    def at_smallest(line: str, d: dict) -> bool:
        return not any(s < d["inventory_scale"] for s in tried[line])

    kinds = {}
    for cont, c in r["per_continent"].items():
        (edge, e), (central, b) = c["deployments"].items()
        if c["iso_slo_ratio_kind"] is None:
            assert c["iso_slo_cost_ratio"] is None
            continue
        low = (at_smallest(edge, e), at_smallest(central, b))
        assert (e["at_or_below_smallest_budget"], b["at_or_below_smallest_budget"]) == low
        kinds[cont] = {(False, False): "exact", (False, True): "lower_bound", (True, False): "upper_bound",
                       (True, True): "unknown"}[low]
        assert c["iso_slo_ratio_kind"] == kinds[cont], cont
        if kinds[cont] == "unknown":  # (bounded neither way: no number)
            assert c["iso_slo_cost_ratio"] is None and f"| {cont} | " in report
            continue
        assert f"| {cont} | " in report and f"| {c['iso_slo_cost_ratio']:.3f} ({kinds[cont]}) |" in report
    assert kinds.get("NA") == "lower_bound"  # (this run: central met North America's SLO at its 11 GPUs)
    assert "A continent's lower_bound ratio: the baseline met the SLO at the smallest budget tried" in report
    assert r["deployments"]["central:big3"]["status"] == "not_met" and r["iso_slo_ratio_kind"] is None
    assert ("- against central:big3: cost ratio -, GPU ratio - (not available: central:big3 never met the SLO)"
            in report and "None" not in report)


SMALL = Path(__file__).resolve().parents[2] / "sim" / "scenarios" / "small.toml"


def test_shedding_load_does_not_pass_any_latency_slo(tmp_path):
    """Requests never answered count as over the limit for every latency metric, not only TTFT: at rps 300 the
    small scenario's 23 edge GPUs reject requests, and its queue p95 over the answered ones alone was 0 ms."""
    from sim.frontier import SLO_METRICS, Line, Point

    for metric in SLO_METRICS:
        slo = parse_slo(f"{metric}=1")
        assert slo.column == (metric if slo.higher_is_better else f"{metric}_all")
    from edgepop.stats import percentiles
    from sim.metrics import _counting

    wait = pd.Series(np.random.default_rng(1).lognormal(5, 1, 1001))
    answered, everyone = pd.Series(["ok"] * 1001), np.ones(1001, bool)
    assert _counting(wait, answered, everyone) == {k: v for k, v in percentiles(wait).items() if k[0] == "p"}
    assert _counting(wait, pd.Series(["rejected"] * 60 + ["ok"] * 941), everyone)["p95"] is None  # 6% unanswered
    shed = Point(Line("edge"), 1.0, 23, 1.0, True, rows=[{"queue_p95_ms": 0.0, "queue_p95_ms_all": None}])
    assert not shed.meets(parse_slo("queue_p95_ms=100"))
    hot = tmp_path / "hot.toml"
    hot.write_text(SMALL.read_text().replace("rps = 25.0", "rps = 300.0"))
    f = run_frontier(hot, slo="queue_p95_ms=100", budgets=[0.01, 0.03], absolute=True, seeds=[7], requests=3000,
                     max_steps=0, workers=1, only="edge", out=tmp_path / "f", progress=False)
    rows = pd.read_parquet(tmp_path / "f" / "frontier.parquet").set_index("gpus")
    assert rows.loc[23, "rejected"] > 0 and rows.loc[23, "queue_p95_ms"] == 0.0  # shed: nothing queued
    for metric in ("queue", "e2e", "tpot"):  # each latency's percentile counting the unanswered is in the rows
        assert f"{metric}_p95_ms_all" in rows
    assert f.result["deployments"]["edge"]["min_gpus_for_slo"] == 68
    assert f.result["deployments"]["edge"]["fails_at_gpus"] == 23


def _points(line, spec):
    """Points of ``line`` from (GPUs, meets) pairs: e2e p95 of 100 ms meets an SLO of 150, 200 fails it."""
    from sim.frontier import Point

    return [Point(line, g / 10, g, 4.0 * g, True, rows=[{"e2e_p95_ms_all": 100.0 if ok else 200.0}])
            for g, ok in spec]


def _frontier(tmp_path, edge, central, tolerance=0.05, demand_weight="population"):
    from types import SimpleNamespace

    from sim.frontier import Frontier, Line
    from sim.frontier_report import summarise

    slo = parse_slo("e2e_p95_ms=150")
    lines = [Line("edge"), Line("central", "big3")]
    points = _points(lines[0], edge) + _points(lines[1], central)
    rule = {"router": "nearest-balanced", "router_options": {}}
    sc = SimpleNamespace(name="toy", edge=SimpleNamespace(**rule), central=SimpleNamespace(budget="gpus", **rule),
                         last_mile="fixed", last_mile_ms=10.0, jitter=False, anycast_misroute=0.0,
                         demand_weight=demand_weight)
    scales = sorted({p.scale for p in points})
    result = summarise(sc, slo, lines, points, [1], None, "local", scales, tolerance)
    result["wall_s"] = 0.0
    return Frontier("toy", slo, lines, points, result, tmp_path, 0.0)


def test_a_ratio_is_exact_only_when_both_brackets_are_tight_and_monotone(tmp_path, capsys, monkeypatch):
    """A non-monotone line (46 GPUs met, 50 failed again) or a bracket wider than the tolerance (30..40 GPUs:
    --max-steps ran out) read "exact"; the ratio is then a range, from the brackets, in JSON, report.md and the
    terminal."""
    monkeypatch.setenv("COLUMNS", "250")  # the terminal table unwrapped
    from sim.cli_frontier import print_frontier
    from sim.frontier_report import report_lines

    tight = [(20, False), (21, True), (60, True)]
    f = _frontier(tmp_path, [(20, False), (21, True), (60, True)], tight)
    assert f.result["iso_slo_ratio_kind"] == "exact" and f.result["iso_slo_gpu_ratio_range"] == [0.952, 1.05]
    f = _frontier(tmp_path, [(40, False), (46, True), (50, False), (60, True)], tight)
    edge = f.result["deployments"]["edge"]
    assert edge["non_monotone"] and edge["range_gpus"] == [40, 60] and not edge["within_tolerance"]
    assert f.result["iso_slo_ratio_kind"] == "range"
    assert f.result["iso_slo_gpu_ratio_range"] == [round(40 / 21, 3), 3.0]
    f = _frontier(tmp_path, [(30, False), (40, True)], [(30, False), (40, True)])
    assert f.result["iso_slo_cost_ratio"] == 1.0 and f.result["iso_slo_ratio_kind"] == "range"
    assert f.result["iso_slo_cost_ratio_range"] == [0.75, round(40 / 30, 3)]
    report = "\n".join(report_lines(f))
    print_frontier(f)
    terminal = " ".join(capsys.readouterr().out.split())
    for text in (report, terminal):
        assert "1.000 (range: 0.750 to 1.333)" in " ".join(text.split()).replace("**", "")
        assert "30-40 GPUs: wider than --tolerance" in " ".join(text.split())
    assert _frontier(tmp_path, [(30, False), (40, True)], tight, tolerance=0.3).result["iso_slo_ratio_kind"] == "exact"


def test_a_frontier_says_how_its_demand_was_weighted(tmp_path, capsys, monkeypatch):
    """By population (the default) frontier.json has no ``demand_weight`` block and nothing is said; by the people
    online it says so in frontier.json, report.md and the terminal."""
    monkeypatch.setenv("COLUMNS", "250")
    from sim.cli_frontier import print_frontier
    from sim.frontier_report import report_lines

    spec = [(20, False), (21, True), (60, True)]
    plain = _frontier(tmp_path, spec, spec)
    assert "demand_weight" not in plain.result and "Demand:" not in "\n".join(report_lines(plain))
    online = _frontier(tmp_path, spec, spec, demand_weight="internet_users")
    assert online.result["demand_weight"]["mode"] == "internet_users"
    print_frontier(online)
    said = "Demand: each city weighted by the people online there"
    assert said in "\n".join(report_lines(online)) and said in " ".join(capsys.readouterr().out.split())


def test_lines_that_never_met_the_slo_say_what_they_tried(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the terminal table unwrapped
    from sim.cli_frontier import print_frontier
    from sim.frontier_report import report_lines

    f = _frontier(tmp_path, [(20, False), (21, True)], [(20, False), (21, False)])
    central = f.result["deployments"]["central:big3"]
    assert central["budgets_simulated"] == 2 and central["largest_budget_simulated_gpus"] == 21
    report = "\n".join(report_lines(f))
    print_frontier(f)
    terminal = " ".join(capsys.readouterr().out.split())
    assert "| not_met: failed at every budget simulated (2, up to 21 GPUs) | every budget simulated (up to 21) |" \
        in report
    assert "not_met: failed at every budget simulated (2, up to 21 GPUs)" in terminal
    for text in (report, terminal):
        assert "(not available: central:big3 never met the SLO)" in text


def test_a_frontier_that_simulated_nothing_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the terminal table unwrapped
    assert main(["frontier", "--scenario", "small", "--budgets", "0.001,0.004", "--max-steps", "0", "--workers",
                 "1", "--out", str(tmp_path / "o")]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    report = (tmp_path / "o" / "report.md").read_text()
    for text in (terminal, report):
        assert "nothing simulated: every budget infeasible" in text and "try larger --budgets" in text
        assert "edge and central:big3 never met the SLO" in text


def test_the_figure_plots_the_slos_metric_with_its_limit_and_unanswered_points(tmp_path):
    from sim.frontier import Point
    from sim.frontier_plot import frontier_figure
    from sim.plots import pyplot

    f = _frontier(tmp_path, [(20, False), (27, True), (45, True)], [(20, False), (27, True), (45, True)])
    f.points.append(Point(f.lines[0], 1.5, 15, 60.0, True, rows=[{"e2e_p95_ms_all": None}]))  # on unanswered
    plt = pyplot()
    fig = frontier_figure(f, plt)
    first = fig.axes[0]
    assert first.get_ylabel().startswith("E2E p95 (ms)")
    assert any(list(ln.get_ydata()) == [150, 150] for ln in first.lines)  # the SLO's limit
    assert any(ln.get_marker() == "^" for ln in first.lines)  # the point whose p95 fell on unanswered requests
    fig.canvas.draw()
    labels = [t.get_text() for t in first.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2 and all(re.search(r"\d", t) for t in labels)  # GPU numbers within one decade
    plt.close(fig)


def test_a_shares_interval_stays_within_0_and_1():
    from sim.frontier import Line, Point

    p = Point(Line("edge"), 1.0, 10, 1.0, True, rows=[{"slo_attainment": v} for v in (1.0, 0.99, 1.0)])
    lo, hi = p.ci95("slo_attainment")
    assert 0.0 <= lo < hi == 1.0


@pytest.mark.parametrize("budgets", ["1e-12,2e-12", "1,1.0000000001"])
def test_budgets_equal_or_zero_once_rounded_are_refused(budgets, capsys, tmp_path):
    argv = ["frontier", "--scenario", "small", "--requests", "300", "--only", "edge", "--max-steps", "0",
            "--workers", "1", "--out", str(tmp_path / "o"), "--budgets", budgets]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "budgets must be at least two different positive numbers" in err
    assert not (tmp_path / "o").exists()


def test_a_negative_budget_is_pointed_at(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["frontier", "--out", str(tmp_path / "o"), "--budgets", "-1,1"])
    assert "--budgets=VALUE" in capsys.readouterr().err


def test_a_ratio_range_unbounded_below_says_so(tmp_path):
    """Both lines fail again above the budget they met at (20 fail, 30 meet, 40 fail): nothing bounds the ratio
    from either side, and the note says so ("at least 0.000" before)."""
    from sim.frontier_report import headline_note

    f = _frontier(tmp_path, [(20, False), (30, True), (40, False)], [(20, False), (30, True), (40, False)])
    assert f.result["iso_slo_ratio_kind"] == "range"
    assert f.result["iso_slo_gpu_ratio_range"] == f.result["iso_slo_cost_ratio_range"] == [None, None]
    assert headline_note(f.result) == "range: unbounded"


def test_a_ratio_bounded_neither_way_has_no_number(tmp_path, capsys, monkeypatch):
    """Both lines met the SLO at their smallest budget: frontier.json's ratio is null (1.0 beside kind unknown
    read as parity to a script), report.md and the terminal say unknown with no number."""
    monkeypatch.setenv("COLUMNS", "250")
    from sim.cli_frontier import print_frontier
    from sim.frontier_report import report_lines

    f = _frontier(tmp_path, [(20, True), (40, True)], [(20, True), (40, True)])
    r = json.loads(json.dumps(f.result))
    assert r["iso_slo_ratio_kind"] == "unknown"
    assert r["iso_slo_cost_ratio"] is None and r["iso_slo_gpu_ratio"] is None
    assert r["iso_slo_ratio_by_baseline"]["central:big3"]["cost"] is None
    report = " ".join(" ".join(report_lines(f)).split())
    print_frontier(f)
    terminal = " ".join(capsys.readouterr().out.split())
    assert "**unknown** (bounded neither way); GPU ratio unknown" in report and "1.000" not in report
    assert "iso-SLO cost ratio (edge / central:big3): unknown (bounded neither way)" in terminal
    assert "1.000" not in terminal and "Unknown: both lines met the SLO" in terminal


def test_the_figure_labels_its_slo_and_shows_coinciding_least_budgets(tmp_path):
    from sim.frontier_plot import frontier_figure
    from sim.plots import pyplot

    f = _frontier(tmp_path, [(20, False), (27, True), (45, True)], [(20, False), (27, True), (45, True)])
    for p, v in zip(f.points, (262.0, 215.0, 230.0, 300.0, 280.0, 290.0), strict=True):
        p.rows = [{"e2e_p95_ms_all": v}]
    plt = pyplot()
    fig = frontier_figure(f, plt)
    first = fig.axes[0]
    fig.canvas.draw()
    labels = [t.get_text() for t in first.get_yticklabels() if t.get_text()]
    assert "150" in labels and len(labels) >= 3  # the SLO's limit and round numbers, not 3x10^2 alone
    assert all("times" not in t and "^" not in t for t in labels)
    assert any(t.get_text() == "SLO 150" for t in first.texts)
    verticals = [ln for ln in first.lines if list(ln.get_xdata()) == [27, 27]]
    assert len(verticals) == 2 and len({ln.get_color() for ln in verticals}) == 2
    assert len({ln._unscaled_dash_pattern for ln in verticals}) == 2  # interleaved dashes: both colours show
    legend = [t.get_text() for t in first.get_legend().get_texts()]
    assert "edge least budget (27)" in legend and "central:big3 least budget (27)" in legend
    plt.close(fig)


def test_each_seeds_ratio_is_read_off_its_own_runs(tmp_path, capsys):
    """Seed 1 meets the SLO from 21 edge GPUs and seed 2 only from 30; central from 21 on both: the edge's mean
    least budget is 30 (seed 2 fails at 21). Seed 1's brackets are both 20-21 (a ratio, 1.0); seed 2's edge bracket
    21-30 is wider than the tolerance, so its ratio is the range the brackets allow (21/21 to 30/20)."""
    from types import SimpleNamespace

    from sim.cli_frontier import print_frontier
    from sim.frontier import Frontier, Line, Point
    from sim.frontier_report import report_lines, summarise

    slo = parse_slo("e2e_p95_ms=150")
    lines = [Line("edge"), Line("central", "big3")]

    def pts(line, meets_from):
        return [Point(line, g / 10, g, 4.0 * g, True,
                      rows=[{"seed": s, "e2e_p95_ms_all": 100.0 if g >= meets_from[s] else 250.0} for s in (1, 2)])
                for g in (10, 20, 21, 30)]

    points = pts(lines[0], {1: 21, 2: 30}) + pts(lines[1], {1: 21, 2: 21})
    rule = {"router": "nearest-balanced", "router_options": {}}
    sc = SimpleNamespace(name="toy", edge=SimpleNamespace(**rule), central=SimpleNamespace(budget="gpus", **rule),
                         last_mile="fixed", last_mile_ms=10.0, jitter=False, anycast_misroute=0.0,
                         demand_weight="population")
    scales = sorted({p.scale for p in points})
    result = summarise(sc, slo, lines, points, [1, 2], None, "local", scales, 0.05)
    assert result["deployments"]["edge"]["min_gpus_for_slo"] == 30  # the mean of seed 1's 100 and seed 2's 250 fails
    seeds = result["iso_slo_by_seed"]
    assert seeds["1"] == {"brackets_gpus": {"edge": [20, 21], "central:big3": [20, 21]}, "kind": "exact",
                          "gpu_ratio": 1.0, "gpu_ratio_range": [0.952, 1.05]}
    assert seeds["2"]["brackets_gpus"]["edge"] == [21, 30] and seeds["2"]["kind"] == "range"
    assert seeds["2"]["gpu_ratio"] is None and seeds["2"]["gpu_ratio_range"] == [1.0, 1.5]
    result["wall_s"] = 0.0
    frontier = Frontier("toy", slo, lines, points, result, tmp_path, 0.0)
    said = ("seed 1: edge 20-21, central:big3 20-21, GPU ratio 1.000; "
            "seed 2: edge 21-30, central:big3 20-21, GPU ratio 1.000 to 1.500")
    assert said in "\n".join(report_lines(frontier))
    print_frontier(frontier)
    assert said in " ".join(capsys.readouterr().out.split())
    one = summarise(sc, slo, lines, points, [1], None, "local", scales, 0.05)
    assert one["iso_slo_by_seed"] is None  # one seed: nothing to compare
