"""Trace readers and replay: the shipped Azure trace replays with its exact arrival times and token counts,
Mooncake JSONL round-trips, prefix reuse ratio on hand-made cases, one-line errors for bad rows."""

import csv
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from edgepop.errors import UserError
from sim.traces import (
    AZURE_CONV_TRACE,
    MOONCAKE_EXAMPLE,
    TraceFileError,
    prefix_reuse_ratio,
    read_azure_trace,
    read_mooncake_trace,
    write_mooncake_trace,
)
from sim.workload import generate
from sim.workload_config import WorkloadConfig


def replay(topo, seed=0, **kw):
    return generate(WorkloadConfig.from_dict(kw, where="test [workload]"), topo, None, np.random.default_rng(seed))


def azure_rows_by_hand():
    """The shipped CSV parsed independently: exact decimal seconds since the first row, and token counts."""
    with open(AZURE_CONV_TRACE, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    times = []
    for ts, _, _ in rows[1:]:
        whole, frac = ts.split(".")
        t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        times.append(Decimal(int(t)) + Decimal("0." + frac))
    seconds = [float(t - times[0]) for t in times]
    return np.array(seconds), np.array([int(r[1]) for r in rows[1:]]), np.array([int(r[2]) for r in rows[1:]])


def test_azure_replay_reproduces_arrival_times_and_token_counts(topo):
    t, ctx, gen = azure_rows_by_hand()
    assert len(t) == 19_366
    w = replay(topo, kind="azure")
    r = w.requests
    w.check()
    assert w.source == "azure_llm_conv_2023.csv" and len(r) == len(t)
    assert np.abs(r.arrival_s.to_numpy() - t).max() < 1e-9  # sub-microsecond digits kept
    assert (r.prompt_tokens.to_numpy() == ctx).all() and (r.output_tokens.to_numpy() == gen).all()
    assert (r.model == "@cf/meta/llama-3.1-8b-instruct").all() and (r.task == "text-generation").all()
    assert (r.session_id == -1).all() and (r.hash_ids.map(len) == 0).all()
    # Users are drawn by population.
    share = r.user_continent.value_counts(normalize=True)
    pop = topo.demand.groupby("continent").weight.sum()
    for cont in ("AS", "EU", "NA"):
        assert abs(share[cont] - pop[cont]) < 4 * np.sqrt(pop[cont] * (1 - pop[cont]) / len(r)), cont
    # Same seed, same users; another seed, other users, same times and sizes.
    again, other = replay(topo, kind="azure").requests, replay(topo, seed=1, kind="azure").requests
    pd.testing.assert_frame_equal(r, again)
    assert not np.array_equal(other.city, r.city) and np.array_equal(other.arrival_s, r.arrival_s)


def test_trace_speed_limit_and_duration(topo):
    t, ctx, _ = azure_rows_by_hand()
    fast = replay(topo, kind="azure", trace_speed=4.0, trace_limit=1000, trace_model="@cf/meta/llama-3.2-1b-instruct")
    assert len(fast) == 1000 and (fast.requests.model == "@cf/meta/llama-3.2-1b-instruct").all()
    assert np.allclose(fast.requests.arrival_s, t[:1000] / 4.0, rtol=0, atol=1e-9)
    assert (fast.requests.prompt_tokens.to_numpy() == ctx[:1000]).all()
    short = replay(topo, kind="azure", duration_s=60.0)
    assert len(short) == int((t < 60.0).sum())
    assert len(replay(topo, kind="azure", requests=77)) == 77


def test_trace_model_must_be_an_llm(topo):
    with pytest.raises(UserError, match="text-generation"):
        replay(topo, kind="azure", trace_model="@cf/baai/bge-m3")
    with pytest.raises(UserError, match="no-such"):
        replay(topo, kind="azure", trace_model="@cf/acme/no-such")


def test_mooncake_round_trip_and_replay(tmp_path, topo):
    frame = pd.DataFrame({"arrival_s": [0.0, 0.25, 1.5, 7.001], "prompt_tokens": [1024, 1500, 10, 600],
                          "output_tokens": [5, 0, 7, 9],
                          "hash_ids": [(0, 1), (0, 1, 2), (3,), (4, 5)]})
    path = write_mooncake_trace(frame, tmp_path / "t.jsonl")
    assert path.read_text().splitlines()[1] == \
        '{"timestamp": 250, "input_length": 1500, "output_length": 0, "hash_ids": [0, 1, 2]}'
    back = read_mooncake_trace(path)
    pd.testing.assert_frame_equal(back, frame)
    w = replay(topo, kind="mooncake", trace=str(path), trace_speed=0.5)
    r = w.requests
    assert np.allclose(r.arrival_s, frame.arrival_s * 2) and [tuple(h) for h in r.hash_ids] == list(frame.hash_ids)
    assert list(r.prompt_tokens) == [1024, 1500, 10, 600] and list(r.output_tokens) == [5, 0, 7, 9]


def test_mooncake_reader_takes_real_format_extras_and_offsets(tmp_path):
    p = tmp_path / "real.jsonl"
    first = [*range(46, 58), 2353, 2354]  # (Mooncake's README line: 14 blocks of 512 tokens, the last partial)
    p.write_text(f'{{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": {first}}}\n\n'
                 f'{{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": {first[:13]}, '
                 '"x": 1}\n{"timestamp": 30000.5, "input_length": 10, "output_length": 1}\n'
                 '{"timestamp": 30001, "input_length": 40, "output_length": 1, "hash_ids": []}\n')
    t = read_mooncake_trace(p)
    assert np.allclose(t.arrival_s, [0.0, 3.053, 2.5185, 2.519])
    assert t.hash_ids.tolist() == [tuple(first), tuple(first[:13]), (), ()]  # (none or []: not tracked)


def test_shipped_mooncake_example_is_consistent():
    t = read_mooncake_trace(MOONCAKE_EXAMPLE)
    assert len(t) == 400 and (np.diff(t.arrival_s) >= 0).all()
    assert (t.hash_ids.map(len) == -(-t.prompt_tokens // 512)).all()
    assert 0.3 < prefix_reuse_ratio(t.hash_ids, 512, t.prompt_tokens.to_numpy()) < 0.8


def test_prefix_reuse_ratio_by_hand():
    seq = [(1, 2, 3), (1, 2, 4), (5,), (1, 2, 3, 6)]
    # Hits: request 1 reuses blocks 1, 2 (8 of 10 tokens); request 3 reuses 1, 2, 3 (12 of 15).
    assert prefix_reuse_ratio(seq, 4, [12, 10, 3, 15]) == pytest.approx(20 / 40)
    assert prefix_reuse_ratio(seq, 4) == pytest.approx(20 / 44)  # every block counted as full
    # A seen block after a miss is not reusable by a prefix cache.
    assert prefix_reuse_ratio([(1, 2), (9, 2)], 4) == 0.0
    # A whole repeated prompt hits entirely, including its partial last block.
    assert prefix_reuse_ratio([(1, 2), (1, 2)], 4, [6, 6]) == pytest.approx(0.5)
    assert prefix_reuse_ratio([], 4) == 0.0


@pytest.mark.parametrize("body, line, field", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\nnot-a-time,1,1\n",
     3, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47,-3,1\n",
     3, "ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,4.5\n", 2, "GeneratedTokens"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n", 1, "GeneratedTokens"),
    # out of range: nanosecond timestamps, and token counts past any context window
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n0001-01-01 00:00:00,1,1\n",
     3, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,99999999999,44\n", 2, "ContextTokens"),
    # the clock's time is no timestamp (pandas reads these two), and blank lines still count as lines
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\nnow,10,5\n", 3, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\ntoday,10,5\n", 2, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n\n\n2023-11-16 18:15:47,10,x\n",
     5, "GeneratedTokens"),
    # a quoted field holding line breaks: the next row starts three lines further down
    ('TIMESTAMP,ContextTokens,GeneratedTokens,Note\n2023-11-16 18:15:46,374,44,"a\nb\nc"\n'
     '2023-11-16 18:15:47,x,5,ok\n', 5, "ContextTokens"),
    # a row without a UTC offset among rows with one (or the other way round) would be read as UTC
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+01:00,1,1\n2023-11-16 18:15:47,1,1\n",
     3, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16T18:15:46,1,1\n\n2023-11-16T18:15:47Z,1,1\n",
     4, "TIMESTAMP"),
    # a needed column named twice (pandas would rename the second and drop it), digits of other scripts
    ("TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n2023-11-16 18:15:46,1,1,2020-01-01\n", 1, "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\u0660,1\n", 2, "ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,\uff15\n", 2, "GeneratedTokens"),
])
def test_bad_azure_rows_name_file_line_and_field(tmp_path, body, line, field):
    p = tmp_path / "bad.csv"
    p.write_text(body, encoding="utf-8")
    with pytest.raises(TraceFileError) as err:
        read_azure_trace(p)
    msg = str(err.value)
    assert "bad.csv" in msg and f"line {line}" in msg and f"'{field}'" in msg and "\n" not in msg


def test_an_azure_row_longer_than_the_header_is_named(tmp_path):
    """(pandas would shift such a row onto an index and blame its third field as the timestamp)"""
    p = tmp_path / "long.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,100,5,7,8\n"
                 "2023-11-16 18:15:48,374,44\n")  # (a later long row: pandas' own error names its line)
    with pytest.raises(TraceFileError, match=r"long\.csv, line 2: more fields than the header has"):
        read_azure_trace(p)


def test_a_long_row_after_a_multi_line_field_is_named_by_its_line(tmp_path):
    p = tmp_path / "long.csv"
    p.write_text('TIMESTAMP,ContextTokens,GeneratedTokens,Note\n2023-11-16 18:15:46,374,44,"a\nb\nc"\n'
                 "2023-11-16 18:15:47,100,5,ok,extra\n")
    with pytest.raises(TraceFileError, match=r"long\.csv, line 5: more fields than the header has$"):
        read_azure_trace(p)


@pytest.mark.parametrize("body, line, field", [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5,\n', 2, None),
    ('{"timestamp": 0, "output_length": 1}\n', 1, "input_length"),
    ('{"timestamp": -5, "input_length": 5, "output_length": 1}\n', 1, "timestamp"),
    ('{"timestamp": 0, "input_length": 5, "output_length": true}\n', 1, "output_length"),
    ('\n{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}\n', 2, "hash_ids"),
    ('[1, 2]\n', 1, None),
    ('{"timestamp": 0, "input_length": 99999999999999999999999, "output_length": 1}\n', 1, "input_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [18446744073709551616]}\n', 1,
     "hash_ids"),
    # one id per 512-token block of the prompt: more would be credited as cached tokens the prompt lacks
    ('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}\n'
     '{"timestamp": 1, "input_length": 100, "output_length": 1, "hash_ids": [0, 1, 2, 3]}\n', 2, "hash_ids"),
    ('{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]}\n', 1, "hash_ids"),
])
def test_bad_mooncake_rows_name_file_line_and_field(tmp_path, body, line, field):
    p = tmp_path / "bad.jsonl"
    p.write_text(body)
    with pytest.raises(TraceFileError) as err:
        read_mooncake_trace(p)
    msg = str(err.value)
    assert "bad.jsonl" in msg and f"line {line}" in msg and "\n" not in msg
    if field:
        assert f"'{field}'" in msg


def test_missing_or_empty_trace_files(tmp_path, topo):
    with pytest.raises(UserError, match="no such file"):
        replay(topo, kind="azure", trace=str(tmp_path / "nope.csv"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no requests"):
        read_mooncake_trace(tmp_path / "empty.jsonl")
    (tmp_path / "head.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(UserError, match="no data rows"):
        read_azure_trace(tmp_path / "head.csv")


def test_relative_trace_path_resolves_against_scenario_folder(tmp_path):
    cfg = WorkloadConfig.from_dict({"kind": "mooncake", "trace": "traces/a.jsonl"}, base_dir=tmp_path)
    assert cfg.trace == str(tmp_path / "traces" / "a.jsonl")


def test_azure_span_past_int64_nanoseconds_is_refused_and_basic_iso_times_read(tmp_path):
    p = tmp_path / "span.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1800-01-01 00:00:00,1,1\n2200-01-01 00:00:00,1,1\n")
    with pytest.raises(TraceFileError, match="span.csv, field 'TIMESTAMP': the requests span 1.26e\\+10 s"):
        read_azure_trace(p)  # (the nanosecond difference overflowed: one row was dropped, the other negative)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n20231116T181546,1,1\n\n20231116T181547,2,2\n")
    assert read_azure_trace(p).arrival_s.tolist() == [0.0, 1.0]


def test_a_replay_of_arrivals_at_one_instant_has_a_finite_goodput(topo):
    """One request: the arrivals' span is 0, so goodput is over the run's duration (it read 1e9 req/s)."""
    from sim.run import run_scenario

    out = run_scenario("small", topo=topo, trace=str(AZURE_CONV_TRACE), requests=1)
    for block in out.summary["deployments"].values():
        assert 0 <= block["goodput_rps"] < 1e3


@pytest.mark.parametrize("sizes, rejected", [((12000, 12000, 1000), 2), ((0, 0, 0), 0)])
def test_a_trace_of_any_mean_size_plans_and_runs(tmp_path, topo, sizes, rejected):
    """A trace's sizes are not clipped: a mean prompt past the model's window (8,150 tokens against 7,968: two in
    three requests too long) and a mean of 0 tokens plan and run, the too-long requests refused one by one (3006);
    both stopped the run before the placement was made (a capacity refused, a size of 0 refused)."""
    from sim.run import run_scenario

    path = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:15:{i // 5:02d}.{(i % 5) * 2}000000,{sizes[i % 3]},{(i % 2) * 5 + 1}" for i in range(60)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = run_scenario("small", topo=topo, trace=str(path))
    for block in out.summary["deployments"].values():
        assert block["outcomes"].get("rejected", 0) == rejected * 20 and block["outcomes"]["ok"] == 60 - rejected * 20, block
    r = out.requests  # (docs/simulate.md: a rejected row's output_tokens is 0, not the size it asked for)
    assert (r.output_tokens[r.outcome != "ok"] == 0).all() and (r.outcome == "rejected").sum() == 2 * rejected * 20
