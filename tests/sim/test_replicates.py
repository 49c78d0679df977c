"""``edgepop simulate --seeds``: every headline gain over seeds, each seed a run of its own."""

import json
import math

import pytest

from edgepop.cli import main
from edgepop.errors import UserError
from sim.replicates import interval, parse_seeds


def test_replicates_are_the_runs_of_those_seeds(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "1500", "--seeds", "7-9", "--out", str(out)]) == 0
    assert "edge gain over 3 seeds" in capsys.readouterr().out
    perf = json.loads((out / "summary.json").read_text())["performance"]
    assert "replicates_s" in perf and f"--seeds {perf['replicates_s']} s)" in (out / "report.md").read_text()
    rep = json.loads((out / "summary.json").read_text())["replicates"]
    assert rep["seeds"] == [7, 8, 9]  # small's own seed (7) is the main run, reused
    rows = {r["key"]: r for r in rep["rows"]}
    assert set(rows) >= {"ttft_ms_p50_reduction_pct", "ttft_ms_p95_reduction_pct", "tpot_ms_p50_reduction_pct",
                         "e2e_ms_generation_p50_reduction_pct", "slo_attainment_delta"}
    # each seed's figure is that seed's own run: the same as simulating it directly
    alone = tmp_path / "seed8"
    assert main(["simulate", "--scenario", "small", "--requests", "1500", "--seed", "8", "--out", str(alone)]) == 0
    capsys.readouterr()
    gains = json.loads((alone / "summary.json").read_text())["gains"]
    for key, r in rows.items():
        assert r["per_seed"][1] == pytest.approx(gains[key], abs=1e-9), key
        assert r["n"] == 3 and r["mean"] == pytest.approx(sum(r["per_seed"]) / 3, abs=1e-4)
        assert r["ci95"][0] <= r["mean"] <= r["ci95"][1]
    direct = json.loads((alone / "summary.json").read_text())["deployments"]
    conts = {b["continent"]: b for b in rep["by_continent"]}
    assert {"AS", "EU", "NA"} <= set(conts)
    for cont in ("AS", "EU"):  # per continent too: seed 8's gain is that of its own run's percentiles
        e, c = (direct[side]["per_continent"][cont]["ttft_p50_ms"] for side in ("edge", "central"))
        assert conts[cont]["ttft_p50"]["per_seed"][1] == pytest.approx(100 * (c - e) / c, abs=0.01)
    assert conts["OC"]["ttft_p50"]["mean"] is None  # under 30 text generation requests a seed: no figure
    p50 = rows["ttft_ms_p50_reduction_pct"]["per_seed"]
    assert len(set(p50)) == 3  # new arrivals each: the seeds do differ
    report = (out / "report.md").read_text()
    assert "## Between seeds" in report
    assert "![Gains over seeds](seeds.png)" in report  # and drawn: each seed's gain, the mean and its interval
    assert (out / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the note on the within-run interval says how it was made, and points to the intervals over seeds
    note = next(line for line in report.splitlines() if "the intervals over seeds are below" in line)
    assert note.startswith("- edge gain = (central - edge) / central") and "paired block bootstrap" in note
    assert (out / "replicates" / "sweep_summary.parquet").is_file()
    # a later run into the same folder without --seeds leaves no earlier intervals beside its own outputs
    (out / "notes.txt").write_text("the user's")
    assert main(["simulate", "--scenario", "small", "--requests", "500", "--out", str(out)]) == 0
    capsys.readouterr()
    assert not (out / "replicates").exists() and "replicates" not in json.loads((out / "summary.json").read_text())
    assert not (out / "seeds.png").exists()
    assert (out / "notes.txt").read_text() == "the user's"


def test_interval_is_student_t_over_seeds():
    r = interval([1.0, 2.0, 3.0, None, math.nan])  # no figure from a seed: left out of the interval
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) x sd 1 / sqrt 3
    assert r["n"] == 3 and r["mean"] == 2.0 and r["sd"] == 1.0
    assert r["ci95"] == [round(2.0 - half, 4), round(2.0 + half, 4)]
    assert interval([5.0])["ci95"] is None


@pytest.mark.parametrize("text, want", [("1-3", [1, 2, 3]), ("4, 9,2", [4, 9, 2]), ("0-1,5", [0, 1, 5])])
def test_seed_lists(text, want):
    assert parse_seeds(text) == want


@pytest.mark.parametrize("text", ["", "a", "1,1", "3-1", "-1", "1-2-3", "0-100000", "1.5"])
def test_bad_seed_lists_are_one_line_errors(text):
    with pytest.raises(UserError, match="bad --seeds"):
        parse_seeds(text)


@pytest.mark.parametrize("extra, message", [
    (["--seeds", "7"], "needs a seed other than the main run's"),
    (["--seeds", "1,2", "--only", "edge"], "--seeds compares edge and central"),
    (["--seeds", "1,2", "--fail", "pop:FRA@10+10"], "cannot be combined with --fail"),
    (["--sensitivity", "--fail", "pop:FRA@10+10"], "--sensitivity re-runs the scenario as its file has it"),
    (["--seeds", "x"], "bad --seeds 'x'"),
])
def test_seeds_refused_before_the_run(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before anything ran or was written


def test_seeds_refused_before_the_run_without_central_or_with_a_file_in_the_way(tmp_path, capsys):
    from sim.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "small.toml").read_text().replace("[central]", "[central]\nenabled = false", 1)
    (tmp_path / "solo.toml").write_text(text)
    out = tmp_path / "out"
    for flag in (["--seeds", "1,2"], ["--sensitivity"]):
        assert main(["simulate", "--scenario", str(tmp_path / "solo.toml"), "--requests", "300", "--out", str(out),
                     *flag]) == 2
        assert f"{flag[0]} compares edge and central: scenario" in capsys.readouterr().err
    out.mkdir()
    (out / "replicates").write_text("mine")
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out), "--seeds", "1,2"]) == 2
    assert "replicates is a file, where the command writes a folder" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["replicates"]  # nothing ran, nothing written
    (out / "replicates").unlink()
    (out / "replicates").mkdir()  # a folder of the user's (no marker: not an earlier run's) is kept
    (out / "replicates" / "notes.txt").write_text("mine")
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out), "--seeds", "1,2"]) == 2
    assert "replicates is a folder that is not an earlier run's (no .edgepop-output)" in capsys.readouterr().err
    assert (out / "replicates" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "solo.toml"]


def test_edge_loses_names_only_intervals_wholly_below_zero():
    from sim.replicates import edge_loses

    rows = [{"metric": "TTFT p50", "mean": 36.0, "ci95": [35.0, 37.0], "difference": False},
            {"metric": "TTFT p95", "mean": -4.5, "ci95": [-5.8, -3.2], "difference": False},
            {"metric": "TTFT p99", "mean": -1.0, "ci95": [-3.0, 1.0], "difference": False},  # straddles zero
            {"metric": "SLO attainment", "mean": -0.0012, "ci95": [-0.0015, -0.001], "difference": True},
            {"metric": "E2E p50 one-shot", "mean": None, "ci95": None, "difference": False}]
    conts = [{"continent": "EU", "ttft_p50": {"mean": 10.6, "ci95": [9.4, 11.8]},
              "ttft_p95": {"mean": -25.1, "ci95": [-29.5, -20.7]}},
             {"continent": "OC", "ttft_p50": {"mean": None, "ci95": None}, "ttft_p95": {"mean": None, "ci95": None}}]
    assert edge_loses(rows, conts, 8) == ("edge loses over 8 seeds (mean, 95% interval over seeds): TTFT p95 -4.5% "
                                          "[-5.8, -3.2]; SLO attainment -0.0012 [-0.0015, -0.0010]; TTFT p95 for "
                                          "users in EU -25.1% [-29.5, -20.7]")
    assert edge_loses(rows[:1], conts[1:], 3) is None


def test_an_interrupted_seeds_run_leaves_the_folder_as_it_was(tmp_path, capsys, monkeypatch):
    """Interrupted while its seeds ran (after the sensitivity sweep had finished), a run into a folder holding an
    earlier run leaves that run whole: no new sensitivity folder beside the old summary, no staging left."""
    import tempfile

    import sim.replicates

    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--seed", "5", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.replicates, "run_replicates", interrupted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--seeds", "2", "--sensitivity",
                 "--out", str(out)]) == 130
    capsys.readouterr()
    assert {p.name for p in out.iterdir()} == set(before)  # no sensitivity/ (it was written into place)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not any((tmp_path / "tmp").iterdir())  # the staged extra runs are removed


def test_out_under_the_home_folder_takes_the_replicates_too(tmp_path, monkeypatch, capsys):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["simulate", "--scenario", "small", "--requests", "1500", "--seeds", "7,8", "--out", "~/s"]) == 0
    assert (home / "s" / "summary.json").is_file() and (home / "s" / "replicates" / "sweep.json").is_file()
    assert not (cwd / "~").exists()  # (the replicates' folder went to a literal ./~/s)
