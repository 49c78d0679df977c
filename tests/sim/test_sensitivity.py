"""``edgepop simulate --sensitivity``: the headline again under other assumptions, on the same arrivals."""

import json

from edgepop.cli import main


def test_sensitivity_rows_vary_one_assumption_each(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "1500", "--sensitivity", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    summary = json.loads((out / "summary.json").read_text())
    # the wall time printed covers the sensitivity runs too, each phase named (summary.json: its own phase)
    perf = summary["performance"]
    assert "sensitivity_s" in perf and "replicates_s" not in perf
    said = (f"wall time {perf['wall_s'] + perf['sensitivity_s']:.2f} s before writing these files (main run "
            f"{perf['wall_s']} s, --sensitivity {perf['sensitivity_s']} s)")
    assert said in (out / "report.md").read_text()
    assert f"--sensitivity {perf['sensitivity_s']} s)" in terminal and "s in all (main run" in terminal
    rows = {r["variant"]: r for r in summary["sensitivity"]["rows"]}
    assert list(rows) == ["as run", "edge GPU inventory x0.5", "edge GPU inventory x2", "edge utilisation_cap 0.35",
                          "router window_ms 10 (both)",  # small's routers have no window
                          "router least-ttft (both)", "central racked like the edge", "anycast: 20% of user cities one PoP off",
                          "last mile by country (M-Lab medians)", "demand by people online",
                          "last mile by country and demand by people online", "service times 20% slower",
                          "baseline us-east", "baseline global-6", "baseline global-12"]  # small runs big3
    headline = rows["as run"]
    assert headline["gpus"] == 228 and rows["edge GPU inventory x0.5"]["gpus"] == 114
    assert rows["edge GPU inventory x2"]["gpus"] == 456 and rows["edge utilisation_cap 0.35"]["gpus"] == 228
    assert rows["router window_ms 10 (both)"]["gpus"] == 228  # the same fleets, routed differently
    windowed = rows["router window_ms 10 (both)"]  # (at this light load the median request stays where it was)
    assert (windowed["edge_ttft_p95_ms"], windowed["edge_busy"]) != (headline["edge_ttft_p95_ms"], headline["edge_busy"])
    routed = rows["router least-ttft (both)"]  # the same fleets; prompts sent where they start prefilling soonest
    assert routed["gpus"] == 228 and routed["edge_ttft_p95_ms"] != headline["edge_ttft_p95_ms"]
    racked = rows["central racked like the edge"]  # the same edge; central's GPUs in smaller servers
    assert racked["gpus"] == 228 and racked["edge_ttft_p95_ms"] == headline["edge_ttft_p95_ms"]
    assert racked["central_busy"] != headline["central_busy"]  # (at this light load the latencies hardly move)
    anycast = rows["anycast: 20% of user cities one PoP off"]  # the same fleets; a fifth of the cities enter farther
    assert anycast["gpus"] == 228 and anycast["central_ttft_p50_ms"] == headline["central_ttft_p50_ms"]
    # (a misrouted city enters one PoP farther, but that PoP may hold the model its nearest lacks: at this light
    # load the median moves either way by hundredths of a ms; the entry RTTs themselves are test_ingress's)
    assert anycast["edge_ttft_p50_ms"] != headline["edge_ttft_p50_ms"]
    measured = rows["last mile by country (M-Lab medians)"]  # the same fleets; each user's access leg its country's
    assert measured["gpus"] == 228  # median (23.6 ms on average against 10), paid on both sides: both medians rise
    assert measured["edge_ttft_p50_ms"] > headline["edge_ttft_p50_ms"]
    assert measured["central_ttft_p50_ms"] > headline["central_ttft_p50_ms"]
    online = rows["demand by people online"]  # the same GPUs; requests from fewer African and more European cities,
    assert online["gpus"] == 228  # central's regions sized by that demand, so both sides' medians move
    assert online["edge_ttft_p50_ms"] != headline["edge_ttft_p50_ms"]
    assert online["central_ttft_p50_ms"] != headline["central_ttft_p50_ms"]
    both = rows["last mile by country and demand by people online"]  # the two at once: the longer access legs
    assert both["gpus"] == 228  # of the measured last mile on top of the other demand's medians
    assert both["edge_ttft_p50_ms"] > online["edge_ttft_p50_ms"] and both["central_ttft_p50_ms"] > online["central_ttft_p50_ms"]
    assert both["central_ttft_p50_ms"] != measured["central_ttft_p50_ms"]
    slower = rows["service times 20% slower"]  # the same fleets, every prefill and decode step x1.2: both slower
    assert slower["gpus"] == 228 and slower["edge_ttft_p50_ms"] > headline["edge_ttft_p50_ms"]
    assert slower["central_ttft_p50_ms"] > headline["central_ttft_p50_ms"]
    for name in ("baseline us-east", "baseline global-6", "baseline global-12"):
        # the same edge on the same arrivals: only central moves
        assert rows[name]["edge_ttft_p95_ms"] == headline["edge_ttft_p95_ms"]
        assert rows[name]["central_ttft_p50_ms"] != headline["central_ttft_p50_ms"]
    # more regions, each sized by its users' demand: central's median gets closer to the users
    assert (rows["baseline global-12"]["central_ttft_p50_ms"] < rows["baseline global-6"]["central_ttft_p50_ms"]
            < headline["central_ttft_p50_ms"] < rows["baseline us-east"]["central_ttft_p50_ms"])
    report = (out / "report.md").read_text()
    assert "## Sensitivity of the headline" in report
    # and the same rows drawn: each gain with its interval, a row per variant
    assert "![Sensitivity of the headline](sensitivity.png)" in report
    assert (out / "sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sensitivity_over_seeds_gives_means_and_intervals_over_seeds(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "1500", "--sensitivity", "--seeds", "7,8",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    sens, rep = summary["sensitivity"], summary["replicates"]
    assert sens["seeds"] == [7, 8] and "mean over seeds 7, 8" in sens["note"]
    rows = {r["variant"]: r for r in sens["rows"]}
    headline = {r["key"]: r for r in rep["rows"]}
    # the headline row over seeds is the replicates' mean (the same runs: --seeds reads them, runs none again)
    p50 = headline["ttft_ms_p50_reduction_pct"]
    assert rows["as run"]["seeds"] == 2 and abs(rows["as run"]["ttft_p50_reduction_pct"] - p50["mean"]) < 1e-3
    assert rows["as run"]["ttft_p50_ci95"] == p50["ci95"]
    assert not (out / "replicates").exists()
    for name, r in rows.items():
        if "infeasible" not in r:
            lo, hi = r["ttft_p95_ci95"]
            assert r["seeds"] == 2 and lo <= r["ttft_p95_reduction_pct"] <= hi, name
    assert rows["edge GPU inventory x2"]["gpus"] == 456


def test_the_last_mile_row_takes_the_mode_the_scenario_does_not_use(tmp_path, monkeypatch):
    """A fixed last mile is compared with each country's measured median, a measured one with the fixed figure; a
    scenario file that sets ``last_mile_ms`` itself cannot take a measured last mile (the file may not name both):
    its row says so instead of failing the whole command."""
    from sim import sensitivity
    from sim.frontier import scenario_path
    from sim.run import run_scenario
    from sim.scenario import load_scenario, with_overrides

    small = load_scenario("small")
    assert ("last mile by country (M-Lab medians)", {"last_mile": "country"}) in sensitivity.variants(small)
    measured = with_overrides(small, last_mile="country")
    assert ("last mile fixed 10 ms", {"last_mile": "fixed"}) in sensitivity.variants(measured)
    path = tmp_path / "fixed20.toml"
    path.write_text("last_mile_ms = 20.0\n" + scenario_path("small").read_text())
    only = [v for v in sensitivity.variants(small) if v[0].startswith("last mile")]
    monkeypatch.setattr(sensitivity, "variants", lambda sc: only)
    main_run = run_scenario(load_scenario(path), requests=300)
    block = sensitivity.run_sensitivity(path, main_run.summary, requests=300, out=tmp_path / "sens")
    rows = {r["variant"]: r for r in block["rows"]}
    assert list(rows) == ["as run", "last mile by country (M-Lab medians)",
                          "last mile by country and demand by people online"]
    for name in list(rows)[1:]:  # the row of both assumptions measures the last mile too
        assert rows[name]["infeasible"] == (
            "fixed20.toml sets last_mile_ms (one figure for every user), which a measured last mile replaces: a "
            "scenario file may not name both")


def test_the_sensitivity_figure_draws_a_row_that_did_not_run_empty(tmp_path):
    """A variant skipped as infeasible has no figures: the plot names it "(not run)" and leaves its bars out."""
    from matplotlib.image import imread

    from sim.sensitivity_plot import plot_sensitivity

    def ran(name, p50, p95):
        return {"variant": name, "ttft_p50_reduction_pct": p50, "ttft_p50_ci95": [p50 - 1, p50 + 1],
                "ttft_p95_reduction_pct": p95, "ttft_p95_ci95": None, "tpot_p50_reduction_pct": None}

    sens = {"seeds": [1], "rows": [ran("as run", 35.0, -3.0), {"variant": "x", "infeasible": "no node fits"},
                                   ran("baseline us-east", 73.0, 30.0)]}
    path = plot_sensitivity(sens, tmp_path / "s.png")
    height, width = imread(path).shape[:2]
    assert width == 1300 and height == int(100 * (1.6 + 0.38 * 3))


def test_the_demand_row_takes_the_weighting_the_scenario_does_not_use():
    from sim import sensitivity
    from sim.scenario import load_scenario, with_overrides

    small = load_scenario("small")
    assert ("demand by people online", {"demand_weight": "internet_users"}) in sensitivity.variants(small)
    online = with_overrides(small, demand_weight="internet_users")
    assert ("demand by population", {"demand_weight": "population"}) in sensitivity.variants(online)
    # and both assumptions flipped at once, each the way its own row flips it
    assert ("last mile by country and demand by people online",
            {"last_mile": "country", "demand_weight": "internet_users"}) in sensitivity.variants(small)
    both = with_overrides(online, last_mile="country")
    assert ("last mile fixed 10 ms and demand by population",
            {"last_mile": "fixed", "demand_weight": "population"}) in sensitivity.variants(both)
