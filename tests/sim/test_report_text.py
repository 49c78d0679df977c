"""What ``edgepop simulate``'s report says about its figures: cells of a deployment not run, the spans of the GPU
busy rows, the gain caption, the wall time and ``--sensitivity``'s help."""

from __future__ import annotations

import json

import pytest

from edgepop.cli import main


def _row(text: str, label: str) -> str:
    """The line of a table (terminal or report.md) whose metric cell starts with ``label``."""
    return next(line for line in text.splitlines() if line.strip("|│ ").startswith(label))


@pytest.mark.parametrize(("only", "missing"), [("edge", "central"), ("central", "edge")])
def test_a_deployment_not_run_reads_dash_in_every_row(tmp_path, capsys, only, missing):
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--only", only, "--out", str(out)]) == 0
    terminal = capsys.readouterr().out
    report = (out / "report.md").read_text()
    row = _row(report, "TTFT p95 incl. failures (ms)").split("|")
    ran, other = (row[2], row[3]) if only == "edge" else (row[3], row[2])
    assert other.strip() == "-" and ran.strip() not in ("-", "failed")
    cells = _row(terminal, "TTFT p95 incl.").split("│")  # (the terminal may wrap the label: values on its first line)
    assert cells[3 if only == "edge" else 2].strip() == "-"
    summary = json.loads((out / "summary.json").read_text())
    assert missing not in summary["deployments"]


def test_gpu_busy_rows_name_their_span_and_a_short_runs_peak_hour(tmp_path, capsys):
    from sim.capacity import peak_hour_is_whole_run

    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    s = json.loads((out / "summary.json").read_text())
    hour_s = s["day"]["day_s"] / 24
    assert s["simulated_span_s"] < hour_s and peak_hour_is_whole_run(s["simulated_span_s"], hour_s)
    for cap in s["capacity"].values():  # no hour-long window: the peak hour's figure is the mean's
        assert cap["utilisation_peak_hour"] == cap["utilisation_mean"]
    report = (out / "report.md").read_text()
    assert "| GPU busy, mean over arrivals |" in report
    assert "| GPU busy, peak hour = all arrivals |" in report
    assert "| GPU wait p95, peak hour = all arrivals (ms) |" in report
    assert "busy share, whole run incl. drain |" in report
    assert "less than an hour of the workload's clock" in report and "less than an hour of" in terminal
    # the caption says what the SLO attainment row's gain is: a difference, not a relative reduction
    caption = next(line for line in report.splitlines() if line.startswith("- edge gain ="))
    assert "SLO attainment: edge - central" in caption and "SLO attainment: edge - central" in terminal
    # no extra runs: the wall time is the run's, said so
    assert f"wall time of the run {s['performance']['wall_s']} s" in report
    wall = terminal[terminal.index("in all (main run"):]
    assert "--sensitivity" not in wall[:wall.index(")")]  # (the network line names the option: it was not run)


def test_a_long_runs_peak_hour_is_a_window():
    from sim.capacity import peak_hour_is_whole_run

    assert not peak_hour_is_whole_run(600.0, 25.0)  # the default: a compressed day, an hour of 25 s
    assert peak_hour_is_whole_run(16.0, 25.0)


def test_sensitivity_help_names_every_variant_it_runs(capsys):
    from sim.scenario import load_scenario
    from sim.sensitivity import variants

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--sensitivity also")
    help_text = text[start:text.index("--seeds LIST", start)]
    kinds = {"edge GPU inventory x": lambda n: n.split()[-1], "edge utilisation_cap": lambda n: "utilisation_cap",
             "router window_ms": lambda n: "window", "router least-ttft": lambda n: "least-ttft",
             "central racked like the edge": lambda n: n,
             "anycast": lambda n: "anycast", "ideal anycast": lambda n: "ideal", "baseline ": lambda n: "baseline",
             "last mile by country": lambda n: "last mile by country", "last mile fixed": lambda n: "fixed where",
             "service times": lambda n: "decode step 20% slower",
             "demand by": lambda n: "weighted by the people online"}
    for scenario in ("default", "small"):
        for name, _ in variants(load_scenario(scenario)):
            kind = next((k for k in kinds if name.startswith(k)), None)
            assert kind is not None, f"a new kind of sensitivity variant: {name!r} (say it in the help)"
            assert kinds[kind](name) in help_text, name
            assert " and demand by " not in name or "both of those at once" in help_text, name


def test_with_seeds_the_within_run_loss_line_names_its_seed():
    """``--seeds`` prints two loss sentences: one run's within-run intervals and the seed-level one. The first
    named neither its seed nor that it was one run's (it could read as contradicting the second)."""
    from sim.report import notes

    summary = {"seed": 3, "deployments": {"edge": {}}, "simulated_span_s": 10.0,
               "gains": {"edge_loses": "edge loses: TTFT p99 overall -32.4% [-78.8, -10.9]"}}
    assert notes(summary)[-1] == "edge loses: TTFT p99 overall -32.4% [-78.8, -10.9]."
    summary["replicates"] = {"seeds": [3, 4]}
    assert notes(summary)[-1] == "Within the seed-3 run alone, edge loses: TTFT p99 overall -32.4% [-78.8, -10.9]."


def test_an_autoscalers_scale_outs_and_scale_to_zero_reach_summary_and_report(tmp_path, capsys):
    from sim.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "small.toml").read_text().replace(
        '[edge]\nplacement = "greedy-demand"\nrouter = "nearest-balanced"\n',
        '[edge]\nplacement = "greedy-demand"\nrouter = "nearest-balanced"\nautoscaler = "reactive"\n'
        'autoscaler_options = { interval_s = 2.0, idle_s = 5.0, queue_high = 1.0 }\n')
    assert 'autoscaler = "reactive"' in text
    (tmp_path / "scaled.toml").write_text(text)
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(tmp_path / "scaled.toml"), "--requests", "300", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    d = json.loads((out / "summary.json").read_text())["deployments"]
    a = d["edge"]["autoscaler"]
    assert set(a) == {"policy", "scale_outs", "scale_to_zero", "router_loads"} and a["policy"] == "reactive"
    assert a["scale_to_zero"] > 0  # most replicas see no request for 5 s of a 12-s run
    assert "autoscaler" not in d["central"]  # a static placement reports no autoscaler
    line = (f"Autoscaler (reactive) on edge: {a['scale_outs']:,} scale-outs (replicas loaded, a cold start each), "
            f"{a['scale_to_zero']:,} scale-to-zero (idle replicas unloaded); {a['router_loads']:,} cold replicas "
            "loaded by the router for a request routed to them.")
    assert f"- {line}" in (out / "report.md").read_text().splitlines() and line in terminal


def test_the_interval_note_names_what_another_seed_moves_most():
    """Over 16 seeds of the Quick start's run, one run's TPOT and generation-E2E intervals were 0.65x and 0.37x
    as wide as the seeds' spread (the placement moves them): the note says so, and points to --seeds."""
    from sim.report import notes

    ci = {"method": "paired block bootstrap", "ttft_ms_p50_reduction_pct": [1.0, 2.0]}
    one = " ".join(notes({"seed": 1, "deployments": {}, "gains": {"ci95": ci}}))
    assert "TPOT and the E2E of text generation" in one and "edgepop simulate --seeds" in one
    with_seeds = " ".join(notes({"seed": 1, "deployments": {}, "gains": {"ci95": ci}, "replicates": {"seeds": [1, 2]}}))
    assert "TPOT" not in with_seeds and "the intervals over seeds are below" in with_seeds


def test_the_report_names_each_sides_router_and_warns_when_they_differ(tmp_path, capsys):
    """A gain may be a router's: summary.json, the terminal and report.md name both sides' placement and routing
    rules, and say so when they differ."""
    from sim.scenario import SCENARIO_DIR

    out = tmp_path / "same"
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    d = json.loads((out / "summary.json").read_text())["deployments"]
    assert d["edge"]["routing"] == d["central"]["routing"] == {
        "router": "nearest-balanced", "options": {"window_ms": 0.0}, "queue_limit": 64, "queue_timeout_s": 30.0}
    line = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- Deployments: "))
    assert "edge: greedy-demand placement (" in line and "central: central placement (" in line
    assert line.count("routed by nearest-balanced (window_ms = 0), queue limit 64 (timeout 30 s)") == 2
    assert line[2:] in terminal
    assert "routed by different rules" not in terminal
    assert "placed by memory alone" not in terminal
    # ... and the load the figures hold at, against each side's capacity at the SLO
    s = json.loads((out / "summary.json").read_text())
    offered = s["requests"] / s["simulated_span_s"]
    load = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- Load: "))
    assert load.startswith(f"- Load: {offered:,.1f} requests/s offered on average")
    for name in ("edge", "central"):
        rps = s["capacity"][name]["capacity_rps"]
        assert f"{offered / rps:.0%} of {name}'s capacity at the SLO ({rps:,.0f} req/s)" in load
    assert load[2:] in terminal

    text = (SCENARIO_DIR / "small.toml").read_text()
    at = text.index("[central]")
    mixed = text[:at] + text[at:].replace('router = "nearest-balanced"', 'router = "p2c"\nrouter_options = { k = 3 }', 1)
    assert mixed != text
    (tmp_path / "mixed.toml").write_text(mixed)
    out = tmp_path / "mixed"
    assert main(["simulate", "--scenario", str(tmp_path / "mixed.toml"), "--requests", "300", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    d = json.loads((out / "summary.json").read_text())["deployments"]
    assert (d["edge"]["routing"]["router"], d["central"]["routing"]["router"]) == ("nearest-balanced", "p2c")
    report = (out / "report.md").read_text()
    assert "central placement (" in report and "routed by p2c (k = 3)," in report
    assert "routed by different rules: a gain may be the router's" in report and "routed by different rules" in terminal


def test_a_memory_only_placement_is_called_a_bound_in_the_report_and_the_sweep_table(tmp_path, capsys):
    from types import SimpleNamespace

    import pandas as pd

    from sim.cli import SWEEP_COLUMNS, print_sweep_table
    from sim.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "small.toml").read_text()
    edge = text.replace('placement = "greedy-demand"', 'placement = "everywhere-fits"', 1)
    assert edge != text
    (tmp_path / "fits.toml").write_text(edge)
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(tmp_path / "fits.toml"), "--requests", "300", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    caveat = ("everywhere-fits placed by memory alone: language models that share a GPU each compute as if they had "
              "it alone, so its latencies are an optimistic bound")
    report = " ".join((out / "report.md").read_text().split())
    assert caveat in report and caveat in terminal
    assert "greedy-demand placed by" not in report and "central placed by" not in report

    grid = SimpleNamespace(source="g.toml", base="small", variants=[{}, {}], names=None, axes=["edge.placement"])
    rows = pd.DataFrame({"variant": [0, 0, 1, 1], "seed": 7, "edge.placement": ["everywhere-fits"] * 2 + ["ilp"] * 2,
                         "deployment": ["edge", "central"] * 2,
                         "placement": ["everywhere-fits", "central", "ilp", "central"]})
    for _, column in SWEEP_COLUMNS:
        rows[column] = 1.0
    print_sweep_table(SimpleNamespace(grid=grid, summary=rows))
    assert caveat in " ".join(capsys.readouterr().out.split())
    rows["placement"] = ["greedy-demand", "central", "ilp", "central"]
    print_sweep_table(SimpleNamespace(grid=grid, summary=rows))
    assert "placed by memory alone" not in capsys.readouterr().out


def test_the_frontier_warns_when_its_lines_route_differently():
    from sim.frontier_report import routing_lines

    same = {"routing": {"edge": {"router": "least-ttft", "options": {"window_ms": 10.0}},
                        "central:global-6": {"router": "least-ttft", "options": {"window_ms": 10.0}}}}
    assert routing_lines(same) == ["Routing: edge by least-ttft (window_ms = 10); central:global-6 by least-ttft "
                                   "(window_ms = 10).", ""]
    same["routing"]["central:global-6"]["options"] = {"window_ms": 0.0}
    assert "routed by different rules: a ratio may be the routers'" in routing_lines(same)[0]
    assert routing_lines({}) == []


def test_a_budget_line_says_when_the_two_sides_hold_different_budgets():
    from sim.report_deployments import budget_line

    def summary(e, c):
        return {"capacity": {"edge": {"gpus": e[0], "usd_per_hour": e[1]}, "central": {"gpus": c[0], "usd_per_hour": c[1]}}}

    assert budget_line(summary((228, 666.8), (228, 666.8))) == []
    assert budget_line(summary((228, 666.8), (224, 672.0)))[0].startswith("Budgets: equal dollars, unequal GPUs")
    assert budget_line(summary((228, 666.8), (228, 900.0)))[0].startswith("Budgets: equal GPUs, unequal dollars")
    half = budget_line(summary((228, 666.8), (115, 335.4)))[0]
    assert half == ("Budgets differ (edge 228 GPUs at $666.8/hour, central 115 at $335.4/hour): a gain may be the "
                    "budget's rather than the deployment's.")
    assert budget_line({"capacity": {"edge": {"gpus": 1, "usd_per_hour": 1.0}}}) == []


def test_the_notes_say_which_last_mile_and_jitter_the_run_used():
    """The access leg is part of every TTFT on both sides (each country's measured median in place of 10 ms takes
    the default's median gain from +35% to +30%), so the printed results say which one was used."""
    from sim.report import notes

    summary = {"seed": 1, "deployments": {"edge": {}}, "simulated_span_s": 10.0, "gains": {},
               "network": {"last_mile": "fixed 10 ms for every user", "jitter": "off", "anycast_misroute": 0.0}}
    said = [line for line in notes(summary) if line.startswith("Network:")]
    assert said == ["Network: last mile fixed 10 ms for every user (edgepop simulate --sensitivity also runs each "
                    "country's measured median); per-request RTT jitter off."]
    summary["network"].update(last_mile="M-Lab NDT median minimum RTT by country, October 2025, by the user's "
                                        "country", jitter="on: IBM Cloud history")
    said = [line for line in notes(summary) if line.startswith("Network:")]
    assert said == ["Network: last mile M-Lab NDT median minimum RTT by country, October 2025, by the user's "
                    "country; per-request RTT jitter on: IBM Cloud history."]
