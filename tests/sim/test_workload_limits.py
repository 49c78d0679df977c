"""Workloads at the edges of their options: sizes that would hang, traces that arrive at once or carry unusual
characters, a trace's own clock, and the command line's size over a trace scenario's."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from edgepop.errors import UserError
from sim.run import prepare, with_run_overrides
from sim.scenario import load_scenario
from sim.traces import read_trace
from sim.workload import generate
from sim.workload_config import WorkloadConfig

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_sessions_whose_warm_up_would_draw_billions_of_arrivals_are_refused(topo):
    cfg = WorkloadConfig.from_dict({"requests": 100, "rps": 100, "session_fraction": 0.5, "session_turns": 1000,
                                    "think_time_s": 86_400})
    with pytest.raises(UserError, match="session_turns / think_time_s: .* warm-up"):
        generate(cfg, topo, rng=0)


def test_arrivals_a_burst_pushes_past_a_year_are_refused(topo):
    cfg = WorkloadConfig.from_dict({"requests": 100, "rps": 100, "bursts": [
        {"start_s": 0, "duration_s": 31_622_400, "multiplier": 0.0}]})
    with pytest.raises(UserError, match="arrivals run to .* more than a year"):
        generate(cfg, topo, rng=0)


def _azure(path, rows):
    path.write_text(AZURE_HEADER + "".join(f"{t},{p},{o}\n" for t, p, o in rows))
    return path


def test_a_trace_arriving_all_at_once_runs(tmp_path):
    trace = _azure(tmp_path / "burst.csv", [("2023-11-16 18:15:46.0", 300 + i, 20) for i in range(50)])
    setup = prepare(with_run_overrides(load_scenario("small"), trace=str(trace)))
    assert len(setup.workload.requests) == 50 and setup.mean_rps == 50.0  # planned for 50 within a second


def test_a_replayed_trace_keeps_a_real_day_and_the_command_lines_size(tmp_path):
    rows = [(f"2023-11-16 18:{m:02d}:{s:02d}.0", 300, 20) for m in range(10) for s in range(0, 60, 3)]  # 200 rows
    trace = _azure(tmp_path / "az.csv", rows)
    sc = replace(load_scenario("small"), workload=WorkloadConfig.from_dict(
        {"kind": "azure", "trace": str(trace), "requests": 40, "day_compression": 600}))
    assert len(prepare(sc).workload.requests) == 40  # the file's own size
    setup = prepare(with_run_overrides(sc, requests=100))
    assert len(setup.workload.requests) == 100  # the command line's size replaces it
    assert setup.day_s == 86_400.0  # the trace's own clock: 10 minutes are 10 minutes, whatever day_compression says


def test_json_lines_strings_may_hold_line_separators(tmp_path, topo):
    path = tmp_path / "u2028.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 600, "output_length": 20, "hash_ids": [i, i + 1],
             "note": "a\u2028b\u0085c"} for i in range(2)]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    cfg = WorkloadConfig.from_dict({"kind": "mooncake", "trace": str(path)})
    assert len(generate(cfg, topo, rng=0).requests) == 2


def test_block_tokens_belongs_to_generated_workloads_only():
    with pytest.raises(UserError, match="field 'block_tokens' does not apply to kind = 'mooncake'"):
        WorkloadConfig.from_dict({"kind": "mooncake", "trace": "x.jsonl", "block_tokens": 64})


def test_a_short_generated_run_plans_for_its_own_rate_and_a_sped_up_trace_for_its_own_day(tmp_path):
    setup = prepare(with_run_overrides(load_scenario("default"), requests=100))
    span = float(setup.workload.requests.arrival_s.max())
    assert span < 1.0 and setup.mean_rps == pytest.approx(100 / span)  # (no floor of a second for these)
    rows = [(f"2023-11-16 18:{m:02d}:00.0", 300, 20) for m in range(10)]
    sc = replace(load_scenario("small"), workload=WorkloadConfig.from_dict(
        {"kind": "azure", "trace": str(_azure(tmp_path / "az.csv", rows)), "trace_speed": 60.0}))
    assert prepare(sc).day_s == pytest.approx(86_400.0 / 60.0)  # the trace's day, sped up as its arrivals are


def test_a_trace_workload_file_written_with_block_tokens_reads_back(tmp_path, topo):
    import pyarrow.parquet as pq

    from sim.workload import META_KEY, Workload

    cfg = WorkloadConfig.from_dict({"kind": "mooncake", "trace": "sim/data/mooncake_style_synthetic.jsonl"})
    path = tmp_path / "w.parquet"
    generate(cfg, topo, rng=0).to_parquet(path)
    table = pq.read_table(path)  # as an earlier edgepop wrote it: block_tokens among a trace's fields
    meta = json.loads(table.schema.metadata[META_KEY])
    meta["config"]["block_tokens"] = 512
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, META_KEY: json.dumps(meta)}), path)
    assert len(Workload.from_parquet(path).requests) == len(table)


def test_a_trace_run_names_its_trace_and_says_when_it_held_fewer_requests_than_asked(tmp_path, capsys):
    from edgepop.cli import main

    rows = [(f"2023-11-16 18:{m:02d}:{s:02d}.0", 300, 20) for m in range(2) for s in range(0, 60, 6)]  # 20 rows
    trace = _azure(tmp_path / "short.csv", rows)
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--trace", str(trace), "--requests", "50", "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"] == {"file": str(trace), "format": "azure", "speed": 1.0, "requests": 20, "asked": 50,
                                "held": 20, "duration_s": None, "limited_by": "trace",
                                "bytes": trace.stat().st_size, "sha256": hashlib.sha256(trace.read_bytes()).hexdigest(),
                                "first_utc": summary["trace"]["first_utc"]}
    report = (out / "report.md").read_text()
    assert "replaying short.csv" in report.splitlines()[0]
    note = "holds 20 requests, fewer than the 50 asked for"
    assert note in report and note in " ".join(printed.split())


def test_bursts_that_multiply_a_duration_past_the_request_limit_are_refused(tmp_path):
    """rps x duration_s was checked without the bursts' multipliers (up to 10^4 each): 1,000 req/s for 100 s
    under a x10,000 burst drew a billion arrivals (9 GiB) before failing with a traceback."""
    burst = {"start_s": 0, "duration_s": 100, "multiplier": 10_000}
    with pytest.raises(UserError, match=r"\[workload\]: rps x duration_s with its bursts' multipliers expects up "
                                        r"to 1e\+09 requests, more than 100,000,000"):
        WorkloadConfig.from_dict({"duration_s": 100, "rps": 1000, "bursts": [burst]}, where="x.toml [workload]")
    # Overlapping bursts multiply; a burst beyond the run's end adds nothing.
    two = [{"start_s": 0, "duration_s": 10, "multiplier": 1000}, {"start_s": 5, "duration_s": 10, "multiplier": 100}]
    with pytest.raises(UserError, match="expects up to 5.06e\\+08"):
        WorkloadConfig.from_dict({"duration_s": 100, "rps": 1000, "bursts": two})
    late = [{"start_s": 200, "duration_s": 10, "multiplier": 10_000}]
    assert WorkloadConfig.from_dict({"duration_s": 100, "rps": 1000, "bursts": late}).bursts
    # The command line's duration over a file's bursts is checked the same way.
    sc = replace(load_scenario("small"), workload=WorkloadConfig.from_dict(
        {"requests": 100, "rps": 1000, "bursts": [burst]}))
    with pytest.raises(UserError, match="--requests / --duration: rps x duration_s with its bursts"):
        with_run_overrides(sc, duration_s=100)


def test_a_trace_in_the_other_format_is_named_as_such(tmp_path):
    jsonl = tmp_path / "mooncake.csv"
    jsonl.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n')
    with pytest.raises(UserError, match='mooncake.csv, line 1: is JSON lines .* read it as kind = "mooncake"'):
        read_trace(jsonl, "azure")
    csv = _azure(tmp_path / "azure.jsonl", [("2023-11-16 18:15:46.0", 300, 20)])
    with pytest.raises(UserError, match='azure.jsonl, line 1: is not JSON lines but looks like a CSV .* kind = "azure"'):
        read_trace(csv, "mooncake")


def test_a_mooncake_trace_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"timestamp": 0, "input_length": 10, "output_length": 2}\n', encoding="utf-8")
    frame, _ = read_trace(path)
    assert frame.prompt_tokens.tolist() == [10]


def test_a_workload_is_written_into_a_folder_it_makes(tmp_path, topo):
    wl = generate(WorkloadConfig.from_dict({"requests": 60, "rps": 10}), topo, rng=0)
    assert wl.to_parquet(tmp_path / "out" / "w.parquet").is_file()


def _shipped_azure_scenario(tmp_path, extra: str = "") -> str:
    """The small scenario replaying the shipped Azure trace (no trace line), sped up, at most 300 requests."""
    path = tmp_path / "az.toml"
    path.write_text('seed = 7\ngpu_inventory_scale = 0.1\n[workload]\nkind = "azure"\ntrace_speed = 4.0\n'
                    f'trace_limit = 300\n{extra}[edge]\nplacement = "greedy-demand"\nrouter = "nearest-balanced"\n')
    return str(path)


def test_a_replay_of_the_shipped_trace_names_it_and_says_the_duration_cut_it(tmp_path):
    from edgepop.cli import main

    out = tmp_path / "out"
    assert main(["simulate", "--scenario", _shipped_azure_scenario(tmp_path, "duration_s = 10\n"), "--out",
                 str(out)]) == 0
    trace = json.loads((out / "summary.json").read_text())["trace"]
    assert trace == {"file": "azure_llm_conv_2023.csv", "format": "azure", "speed": 4.0, "requests": 89,
                     "asked": 300, "held": 19_366, "duration_s": 10.0, "limited_by": "duration_s", "bytes": 719_188,
                     "sha256": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
                     "first_utc": "2023-11-16T18:15:46.680590+00:00"}
    report = (out / "report.md").read_text()
    assert "replaying azure_llm_conv_2023.csv" in report.splitlines()[0] and "None" not in report
    assert ("duration_s = 10 s cut the replay of azure_llm_conv_2023.csv to 89 requests of the 300 asked for (the "
            "trace holds 19,366).") in report and "fewer than the" not in report


def test_the_command_lines_duration_cuts_a_trace_as_the_files_duration_s_does(tmp_path):
    sc = load_scenario(_shipped_azure_scenario(tmp_path))
    over = with_run_overrides(sc, duration_s=10)
    assert over.workload.duration_s == 10 and over.workload.trace_limit is None  # (it replaces the file's size)
    t = prepare(over).workload.requests.arrival_s
    assert len(t) == 89 and t.max() < 10
    with pytest.raises(UserError, match=r"--requests / --duration: duration_s must be at most a year"):
        with_run_overrides(sc, duration_s=4e7)


def test_a_traces_duration_is_bounded_by_a_year_not_by_a_rate_it_cannot_have():
    assert WorkloadConfig.from_dict({"kind": "azure", "duration_s": 2e6}).duration_s == 2e6
    with pytest.raises(UserError, match=r"x.toml \[workload\]: duration_s must be at most a year .* got 4e\+07"):
        WorkloadConfig.from_dict({"kind": "mooncake", "duration_s": 4e7}, where="x.toml [workload]")
    with pytest.raises(UserError, match=r"rps x duration_s expects 2e\+08 requests"):  # (Poisson: as before)
        WorkloadConfig.from_dict({"duration_s": 2e6})


@pytest.mark.parametrize("value", [2**70, 10**7 + 1])
def test_block_tokens_past_the_longest_prompt_is_refused_in_one_line(value):
    with pytest.raises(UserError, match=rf"x.toml \[workload\]: block_tokens must be an integer in \[1, "
                                        rf"10,000,000\], got {value}$"):
        WorkloadConfig.from_dict({"requests": 50, "block_tokens": value, "session_fraction": 0.5},
                                 where="x.toml [workload]")
    assert WorkloadConfig.from_dict({"requests": 50, "block_tokens": 10**7}).block_tokens == 10**7
