"""What outputs say about a replayed trace: why its requests were rejected (by error code, with the meaning),
which file a sweep or frontier replayed (path, size, sha256), and a warning when the timestamps' implied rate says
they are in another unit than the format's."""

import hashlib
import json

import pytest

from sim.traces import AZURE_CONV_TRACE, MOONCAKE_EXAMPLE, read_azure_trace, read_mooncake_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _csv(path, n, prompt=100, step_ms=200):
    rows = [f"2023-11-16 18:{15 + i * step_ms // 60_000:02d}:{i * step_ms // 1000 % 60:02d}.{i * step_ms % 1000:03d},"
            f"{prompt},10" for i in range(n)]
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_requests_rejected_as_too_large_say_why_in_report_and_terminal(tmp_path, topo, capsys):
    from sim.cli import print_headline
    from sim.outputs import write_outputs
    from sim.run import run_scenario

    out = run_scenario("small", topo=topo, trace=str(_csv(tmp_path / "big.csv", 30, prompt=9000)))
    block = out.summary["deployments"]["edge"]
    assert block["outcomes"] == {"ok": 0, "rejected": 30, "failed": 0}
    assert block["not_ok"] == [{"outcome": "rejected", "code": 3006, "requests": 30, "message": "Request is too large",
                                "meaning": "prompt + output over @cf/meta/llama-3.1-8b-instruct's 7,968-token "
                                           "context window"}]
    line = ("edge: 30 rejected: 30 x 3006 prompt + output over @cf/meta/llama-3.1-8b-instruct's 7,968-token "
            "context window.")
    write_outputs(out, tmp_path / "o")
    assert f"- {line}" in (tmp_path / "o" / "report.md").read_text()
    print_headline(out.summary, tmp_path / "o")
    assert line in " ".join(capsys.readouterr().out.split())


def _trace_grid(tmp_path):
    _csv(tmp_path / "a.csv", 20)
    _csv(tmp_path / "b.csv", 30)
    (tmp_path / "s.toml").write_text('name = "s"\n[workload]\nkind = "azure"\ntrace = "a.csv"\n'
                                     "[central]\nenabled = false\n")
    (tmp_path / "g.toml").write_text('base = "s.toml"\ndeployments = ["edge"]\n[axes]\n'
                                     '"workload.trace" = ["a.csv", "b.csv"]\n"workload.trace_speed" = [1.0, 2.0]\n')
    return tmp_path / "g.toml"


def _identity(path):
    return {"file": str(path), "format": "azure", "bytes": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_a_sweep_manifest_names_each_trace_file_once_with_its_hash(tmp_path):
    from sim.sweep import run_sweep

    run_sweep(_trace_grid(tmp_path), workers=1, out=tmp_path / "sw", progress=False)
    manifest = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert manifest["traces"] == [_identity(tmp_path / "a.csv"), _identity(tmp_path / "b.csv")]


def test_a_frontier_manifest_names_the_trace_file(tmp_path):
    from sim.frontier import run_frontier

    _trace_grid(tmp_path)
    f = run_frontier(tmp_path / "s.toml", slo="ttft_p95_ms=100000", budgets=[0.5, 1.0], seeds=[1], workers=1,
                     max_steps=1, only="edge", out=tmp_path / "f", progress=False)
    written = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert written["trace"] == f.result["trace"] == _identity(tmp_path / "a.csv")


def test_simulate_summary_names_the_trace_file_with_its_hash(tmp_path, topo):
    from sim.run import run_scenario

    path = _csv(tmp_path / "a.csv", 20)
    trace = run_scenario("small", topo=topo, trace=str(path), deployments="edge").summary["trace"]
    assert {k: trace[k] for k in ("file", "format", "bytes", "sha256")} == _identity(path)


def test_timestamps_in_another_unit_warn_once_naming_file_span_and_unit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGEPOP_WARNED_TRACES", "")
    p = tmp_path / "s.jsonl"  # Mooncake timestamps written in seconds: 800 requests read as 0.8 s
    p.write_text("".join(json.dumps({"timestamp": i * 0.2, "input_length": 10, "output_length": 1}) + "\n"
                         for i in range(800)))
    read_mooncake_trace(p)
    read_mooncake_trace(p)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {p}: 800 requests in 0.16 s (5,006 requests/s): the format reads its timestamps as "
                   "milliseconds; check their unit"]
    read_azure_trace(_csv(tmp_path / "fast.csv", 150, step_ms=1))  # 150 requests in 0.149 s
    assert "fast.csv: 150 requests in 0.149 s" in capsys.readouterr().err


@pytest.mark.parametrize("path, reader", [(AZURE_CONV_TRACE, read_azure_trace),
                                          (MOONCAKE_EXAMPLE, read_mooncake_trace)])
def test_the_shipped_traces_do_not_warn(path, reader, capsys):
    reader(path)
    assert capsys.readouterr().err == ""


def test_a_replay_states_the_traces_own_first_timestamp_beside_the_start_utc_used(tmp_path, topo):
    from sim.report import notes
    from sim.run import run_scenario

    path = _csv(tmp_path / "a.csv", 20)
    s = run_scenario("small", topo=topo, trace=str(path), deployments="edge").summary
    assert s["trace"]["first_utc"] == "2023-11-16T18:15:00+00:00"
    assert s["day"]["start_utc"] == "2024-03-20T12:00:00+00:00"  # the default: the scenario's, not the trace's
    assert ("The trace's own first timestamp is 2023-11-16 18:15:00 UTC; the run's day starts at the scenario's "
            "start_utc, 2024-03-20 12:00:00 UTC") in " ".join(notes(s))
    (tmp_path / "t.toml").write_text('name = "t"\n[workload]\nkind = "azure"\ntrace = "a.csv"\nstart_utc = "trace"\n')
    s = run_scenario(tmp_path / "t.toml", topo=topo, deployments="edge").summary
    assert s["day"]["start_utc"] == s["trace"]["first_utc"] == "2023-11-16T18:15:00+00:00"
    assert "the run's day starts there (start_utc = \"trace\")" in " ".join(notes(s))


def test_start_utc_trace_needs_a_trace_with_absolute_times(tmp_path, topo):
    from edgepop.errors import UserError
    from sim.run import run_scenario

    (tmp_path / "t.toml").write_text('name = "t"\n[workload]\nkind = "azure"\nstart_utc = "trace"\n')
    with pytest.raises(UserError, match=r'^t.toml \[workload\]: field start_utc: "trace" needs a trace with absolute '
                                        r"times \(an Azure CSV's\); the mooncake trace mooncake_style_synthetic.jsonl "
                                        r"holds times relative to its first request: give an ISO time$"):
        run_scenario(tmp_path / "t.toml", topo=topo, trace=str(MOONCAKE_EXAMPLE))
    (tmp_path / "p.toml").write_text('name = "p"\n[workload]\nrequests = 10\nstart_utc = "trace"\n')
    with pytest.raises(UserError, match=r'start_utc = "trace" starts the day at a replayed trace\'s first timestamp: '
                                        r"it needs a trace"):
        run_scenario(tmp_path / "p.toml", topo=topo)


def test_a_few_requests_at_one_instant_do_not_warn_and_workers_are_not_warned_again(tmp_path, capsys, monkeypatch):
    """A burst of three requests at one millisecond is plausible, not a unit error; a sweep's workers (processes
    started after the parent read the file) do not repeat the parent's warning."""
    import subprocess
    import sys

    monkeypatch.setenv("EDGEPOP_WARNED_TRACES", "")
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text("".join(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1}) + "\n"
                            for _ in range(3)))
    read_mooncake_trace(tiny)
    assert capsys.readouterr().err == ""
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps({"timestamp": i * 0.2, "input_length": 10, "output_length": 1}) + "\n"
                         for i in range(800)))
    read_mooncake_trace(p)
    assert "800 requests in 0.16 s" in capsys.readouterr().err
    worker = [sys.executable, "-c", f"from sim.traces import read_mooncake_trace; read_mooncake_trace({str(p)!r})"]
    assert subprocess.run(worker, capture_output=True, text=True, check=True).stderr == ""


def test_requests_open_when_the_run_ends_are_not_called_queue_timeouts():
    """3007 ends both a queue's timeout (rejected) and a request still streaming at the run's horizon (failed):
    the failed ones are said to have been streaming when the run ended."""
    import pandas as pd

    from controlplane.outcomes import MEANINGS, Code
    from sim.rejections import STILL_STREAMING, not_ok_codes

    frame = pd.DataFrame({"outcome": ["failed", "rejected", "rejected"], "error_code": [3007, 3007, 3007],
                          "model": "m", "prompt_tokens": 10, "output_tokens": 5})
    got = {(c["outcome"], c["code"]): c["meaning"] for c in not_ok_codes(frame, None)}
    assert got == {("rejected", 3007): MEANINGS[Code.TIMEOUT], ("failed", 3007): STILL_STREAMING}
    assert "queue" not in STILL_STREAMING and "when the run ended" in MEANINGS[Code.TIMEOUT]
