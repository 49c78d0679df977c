"""Workload inputs that crashed, ran out of memory or were taken silently: each is a one-line error naming where,
the field and the value, or (a huge rate for a few requests) drawn at a cost that follows the requests."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import sim.arrivals as arrivals
import sim.workload as workload
from edgepop.errors import UserError
from sim.run import prepare
from sim.scenario import load_scenario, with_overrides
from sim.workload import generate
from sim.workload_config import WorkloadConfig


def _drawn(monkeypatch) -> list[int]:
    """Arrivals each generate() call draws (a list that the patched process appends to)."""
    sizes, orig = [], workload.poisson_chunks

    def spy(*args, **kwargs):
        for t, city, stop in orig(*args, **kwargs):
            sizes.append(len(t))
            yield t, city, stop

    monkeypatch.setattr(workload, "poisson_chunks", spy)
    return sizes


def test_a_few_requests_at_a_high_rate_draw_about_as_many_arrivals(topo, monkeypatch):
    # A bin of one minute at 2,000 req/s expects ~150,000 arrivals; past the (lowered) threshold the draw stops
    # inside it, so the few requests asked for cost a few arrivals, not the bin's.
    monkeypatch.setattr(arrivals, "CUT_BIN_ARRIVALS", 1000, raising=False)
    sizes = _drawn(monkeypatch)
    wl = generate(WorkloadConfig.from_dict({"requests": 5, "rps": 2000}), topo, rng=0)
    assert len(wl) == 5 and sum(sizes) < 100
    sizes.clear()
    wl = generate(WorkloadConfig.from_dict({"requests": 3000, "rps": 2000, "diurnal": False}), topo, rng=0)
    wl.check()
    assert len(wl) == 3000 and sum(sizes) < 4000
    # the rate is still the one asked for: 3,000 arrivals at 2,000 req/s span about 1.5 s
    assert wl.duration_s == pytest.approx(1.5, rel=0.1)
    sizes.clear()  # sessions: the warm-up before 0 is drawn in rounds of about the requests asked for too
    wl = generate(WorkloadConfig.from_dict({"requests": 50, "rps": 2000, "session_fraction": 0.5,
                                            "think_time_s": 0.5}), topo, rng=0)
    assert len(wl) == 50 and max(sizes) < 1200


def test_a_bin_under_the_threshold_is_drawn_whole_as_before(topo, monkeypatch):
    sizes = _drawn(monkeypatch)
    generate(WorkloadConfig.from_dict({"requests": 5, "rps": 20}), topo, rng=0)
    assert sum(sizes) > 100  # (the first minute at 20 req/s: the draws of every shipped scenario are unchanged)


@pytest.mark.parametrize(("key", "value"), [("continent", ["EU"]), ("continent", {"a": 1}), ("continent", 5),
                                            ("country", ["DE"]), ("country", {"DE": 1})])
def test_a_burst_filter_that_is_not_a_string_is_refused(key, value):
    burst = {"start_s": 0, "duration_s": 1, "multiplier": 2, key: value}
    with pytest.raises(UserError, match=rf"^x\.toml \[workload\] bursts\[0\]: {key} must be .*got "
                                        rf"{re.escape(repr(value))}$"):
        WorkloadConfig.from_dict({"requests": 10, "bursts": [burst]}, where="x.toml [workload]")


@pytest.mark.parametrize(("task", "field", "bound", "value"), [
    ("automatic-speech-recognition", "prompt", "max", 9_000_000_000_000_000_000),
    ("automatic-speech-recognition", "prompt", "min", 2**63 - 1),
    ("text-embeddings", "prompt", "max", 2**63 - 1),
    ("text-reranking", "passage", "min", 10_000_001),
    ("text-generation", "output", "max", 10_000_001)])
def test_token_bounds_past_ten_million_are_refused(task, field, bound, value):
    dist = {"median": 10, bound: value} if bound == "max" else {"median": 10, "min": value, "max": 2**63 - 1}
    with pytest.raises(UserError, match=rf"^x\.toml \[workload\] tokens\.{task}\.{field}: {bound} must be .*"
                                        rf"10,000,000.*got {value}$"):
        WorkloadConfig.from_dict({"requests": 10, "tokens": {task: {field: dist}}}, where="x.toml [workload]")
    # the bound itself is a valid size
    ok = {"median": 10, "min": 1, "max": 10_000_000}
    assert WorkloadConfig.from_dict({"tokens": {task: {field: ok}}}).tokens[task]


@pytest.fixture(scope="module")
def small_wl(topo):
    return generate(WorkloadConfig.from_dict({"requests": 200, "rps": 50}), topo, rng=0)


@pytest.mark.parametrize("bin_s", [-1.0, 0, float("nan"), float("inf"), 1e-12, "5", True, None])
def test_summary_bins_that_are_not_a_sane_number_of_seconds_are_refused(small_wl, bin_s):
    if bin_s is None:  # (the default: 60 bins over the run)
        assert len(small_wl.summary()["rate"]["rps"]) == 60
        return
    with pytest.raises(UserError, match=r"^Workload\.summary: bin_s must be .*got "):
        small_wl.summary(bin_s)


def test_summary_takes_whole_and_numpy_seconds(small_wl):
    assert small_wl.summary(1)["rate"]["bin_s"] == 1
    assert small_wl.summary(np.float64(0.5))["rate"]["bin_s"] == 0.5


@pytest.mark.parametrize(("change", "message"), [
    ({"session_fraction": 1.5}, "session_fraction must be in [0, 1], got 1.5"),
    ({"think_time_s": -1.0}, "think_time_s must be in (0, 86400], got -1.0"),
    ({"rps": -5.0}, "rps must be in (0, 1e+07], got -5.0"),
    ({"requests": "500"}, "requests must be an integer >= 1, got '500'"),
    ({"bursts": ({"start_s": 0, "duration_s": 1, "multiplier": -2},)}, "bursts[0]: multiplier must be"),
    ({"mix": {"nope": 1.0}}, "mix: no model 'nope' in the catalog")])
def test_a_config_built_in_python_is_checked_by_generate(topo, change, message):
    cfg = replace(WorkloadConfig.from_dict({"requests": 50, "rps": 50}), **change)
    with pytest.raises(UserError, match=r"^workload") as err:
        generate(cfg, topo, rng=0)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_checked_config_generates_as_before(topo):
    cfg = WorkloadConfig(requests=100, rps=50.0)  # the constructor's defaults pass the file's checks
    assert generate(cfg, topo, rng=3).requests.equals(
        generate(WorkloadConfig.from_dict({"requests": 100, "rps": 50}), topo, rng=3).requests)


def test_a_path_trace_and_numpy_numbers_built_in_python_generate_as_their_plain_forms(topo):
    # generate's check reads the config as a file would hold it: a Path is a file path, numpy numbers are numbers
    trace = Path(__file__).resolve().parents[2] / "sim" / "data" / "mooncake_style_synthetic.jsonl"
    as_path = WorkloadConfig(kind="mooncake", trace=trace, requests=None, trace_limit=50)
    assert generate(as_path, topo, rng=0).requests.equals(
        generate(replace(as_path, trace=str(trace)), topo, rng=0).requests)
    numpy_made = replace(WorkloadConfig(requests=50, rps=10.0), requests=np.int64(50), rps=np.float64(10.0))
    assert generate(numpy_made, topo, rng=3).requests.equals(
        generate(WorkloadConfig(requests=50, rps=10.0), topo, rng=3).requests)


def _scenario(tmp_path, workload: str):
    path = tmp_path / "x.toml"
    path.write_text(f'seed = 1\n[workload]\n{workload}\n[edge]\nplacement = "greedy-demand"\n')
    return load_scenario(str(path))


def test_every_generation_error_names_the_scenario_file(tmp_path):
    # an error of generation's with no field of its own
    sc = _scenario(tmp_path, "requests = 100\nrps = 100.0\nbursts = [{ start_s = 0, duration_s = 31622400, "
                             "multiplier = 0.0 }]")
    with pytest.raises(UserError, match=r"^x\.toml \[workload\]: the arrivals run to .* more than a year"):
        prepare(sc)
    # a field's (the file's burst matches no city)
    sc = _scenario(tmp_path, 'requests = 100\nbursts = [{ start_s = 0, duration_s = 1, multiplier = 2, '
                             'country = "ZZ" }]')
    with pytest.raises(UserError, match=r"^x\.toml \[workload\]: field bursts\[0\]: no demand city"):
        prepare(sc)
    # a value set in Python on a scenario read from its file
    sc = with_overrides(_scenario(tmp_path, "requests = 100"), workload={"session_fraction": 1.5})
    with pytest.raises(UserError, match=r"^x\.toml \[workload\]: session_fraction must be in \[0, 1\], got 1\.5$"):
        prepare(sc)
