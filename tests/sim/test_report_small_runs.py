"""How simulate's outputs read for runs too small for intervals or with one deployment: headline gains with no
interval under MIN_BIN requests, the report's opening sentence and unit of the day covered, the CDF's empty
panel and the utilisation plot's axis."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from edgepop.cli import main
from sim.gains import MIN_BIN, Paired, headline_gains
from sim.report import _day_text, notes


def _frame(n: int, ttft: float) -> pd.DataFrame:
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.linspace(0, 10, n), "task": "text-generation",
                         "outcome": "ok", "batch": False, "ttft_ms": ttft, "tpot_ms": 10.0, "e2e_ms": ttft + 100,
                         "network_rtt_ms": ttft / 2, "prompt_tokens": 100, "user_continent": "EU"})


def test_a_headline_gain_over_fewer_than_min_bin_requests_has_no_interval_and_says_why():
    n = MIN_BIN - 1
    p = Paired(_frame(n, 50.0), _frame(n, 200.0), seed=1)
    ci, _ = headline_gains(p, np.ones(n, bool), np.ones(n, bool))
    assert ci["ttft_ms_p50_reduction_pct"] is None and ci["slo_attainment_delta"] is None
    assert f"fewer than {MIN_BIN} requests" in ci["no_interval"]["ttft_ms_p50_reduction_pct"]
    line = " ".join(notes({"gains": {"ci95": ci}, "deployments": {}, "seed": 1}))
    assert "No 95% interval for TTFT p50" in line and f"edge {n}, central {n}" in line
    p = Paired(_frame(MIN_BIN, 50.0), _frame(MIN_BIN, 200.0), seed=1)  # enough: an interval, no reason
    ci, _ = headline_gains(p, np.ones(MIN_BIN, bool), np.ones(MIN_BIN, bool))
    assert ci["ttft_ms_p50_reduction_pct"] is not None and "ttft_ms_p50_reduction_pct" not in ci["no_interval"]
    assert "e2e_ms_one_shot_p50_reduction_pct" in ci["no_interval"]  # (no one-shot requests at all)


def test_one_request_run_reads_singular_with_no_zero_width_interval(tmp_path, capsys):
    out = tmp_path / "r1"
    assert main(["simulate", "--scenario", "small", "--requests", "1", "--out", str(out)]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    report = (out / "report.md").read_text()
    s = json.loads((out / "summary.json").read_text())
    assert s["gains"]["ci95"]["ttft_ms_p50_reduction_pct"] is None
    assert "ttft_ms_p50_reduction_pct" in s["gains"]["ci95"]["no_interval"]
    row = next(line for line in report.splitlines() if line.startswith("| TTFT p50 (ms)"))
    assert "%" in row and "[" not in row
    assert "No 95% interval for TTFT p50" in report and "No 95% interval for TTFT p50" in terminal
    assert "(1 request," in report and "1 request over" in report and "1 requests" not in report


def test_single_deployment_report_reads_as_sentences_and_names_its_plot(tmp_path):
    out = tmp_path / "oc"
    assert main(["simulate", "--scenario", "small", "--requests", "60", "--only", "central", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "; Latency" not in report and ". Latency figures" in report
    assert "## TTFT distribution, central only" in report and "edge vs central" not in report


def test_day_covered_reads_in_minutes_under_an_hour():
    s = {"day": {"day_s": 3600.0, "hours_covered": round(24 * 14 / 3600, 4), "start_utc": None}}
    assert _day_text(s) == " (5.6 min of a day compressed to 3,600 s)"
    s["day"] = {"day_s": 86_400.0, "hours_covered": round(24 * 0.06 / 86_400, 6), "start_utc": None}
    assert _day_text(s) == " (0.061 s of a day)"  # (a real-time day: not "0 min")
    s["day"]["hours_covered"] = 3.6
    assert _day_text(s).startswith(" (3.6 h of")


def test_an_empty_cdf_panel_says_so_and_the_utilisation_axis_says_of_what():
    from sim.plots import pyplot, ttft_cdf_figure, utilisation_figure

    req = pd.DataFrame({"deployment": ["edge", "central"], "outcome": "ok", "task": "text-generation",
                        "ttft_ms": [50.0, 200.0], "batch": False})
    fig = ttft_cdf_figure(req)
    gen, one_shot = fig.axes
    assert gen.lines and not one_shot.lines
    assert any("no ok interactive requests of this kind" in t.get_text() for t in one_shot.texts)
    pyplot().close(fig)
    util = pd.DataFrame({"t_s": [0.0, 1.0], "running": [1, 2], "waiting": 0, "ready_slots": 4,
                         "busy_replicas": 1, "replicas": 2, "slot_utilisation": [0.25, 0.5], "deployment": "edge"})
    fig = utilisation_figure(util)
    ylabel = fig.axes[0].get_ylabel()
    assert ylabel != "%" and "slots" in ylabel and "replicas" in ylabel
    assert any("% of ready slots" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    pyplot().close(fig)


def test_the_headline_table_is_formatted_as_the_cli_prints_it():
    from sim.report import headline_table

    s = {"deployments": {"edge": {"gpu_hours": 0.600491, "gpu_usd": 1.756174, "ttft_ms": {"p50": 64.996}},
                         "central": {"gpu_hours": 12.5}}, "gains": {"ttft_ms_p50_reduction_pct": 41.52,
                                                                     "ci95": {"ttft_ms_p50_reduction_pct": [41.0, 42.1]}}}
    rows = {m: (a, b, g) for m, a, b, g in headline_table(s)}
    assert rows["GPU-hours"] == ("0.600", "12.5", "") and rows["GPU cost ($)"][:2] == ("1.756", "-")
    assert rows["TTFT p50 (ms)"] == ("65.0", "-", "+41.5% [+41.0, +42.1]")
