"""A real ``edgepop serve`` subprocess killed with SIGKILL mid-batch and restarted finishes the batch: no item lost,
none completed twice. Also the serve command's one-line errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import httpx
from kit.gateway import ALICE, GEN, headers, run_url

from dataplane.gateway.server import spawn_serve

CONFIG = f"""
pops = ["FRA", "LHR"]
models = ["{GEN}"]
batch_concurrency = 1
delay = false
"""


def _status(url: str, rid: str) -> dict:
    r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"request_id": rid}, headers=headers(), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_sigkill_restart_finishes_batch_exactly_once(tmp_path):
    cfg, tokens, db, log = tmp_path / "gw.toml", tmp_path / "tokens.toml", tmp_path / "batch.sqlite", tmp_path / "log"
    cfg.write_text(CONFIG)
    tokens.write_text(f'[tokens]\n"{ALICE}" = "alice"\n')
    args = ["--config", str(cfg), "--tokens", str(tokens), "--db", str(db), "--no-warm"]
    n = 6
    proc, url = spawn_serve(args, log=log)
    try:
        reqs = [{"prompt": f"job {i}", "max_tokens": 100, "ignore_eos": True, "seed": i} for i in range(n)]
        r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"requests": reqs}, headers=headers())
        rid = r.json()["result"]["request_id"]
        deadline = time.monotonic() + 60
        while _status(url, rid).get("completed", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with sqlite3.connect(db) as con:
        before = dict(con.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())
    assert 2 <= before.get("done", 0) < n  # killed mid-job
    running = before.get("running", 0)  # the item on the engine when the process died (0 in a rare gap)
    assert running <= 1

    proc, url = spawn_serve(args, log=log)
    try:
        deadline = time.monotonic() + 60
        while (res := _status(url, rid))["status"] != "done" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert res["status"] == "done"
    assert [x["id"] for x in res["responses"]] == list(range(n))
    assert all(x["success"] and x["result"]["usage"]["completion_tokens"] == 100 for x in res["responses"])
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT idx, completions, attempts FROM items ORDER BY idx").fetchall()
    assert all(c == 1 for _, c, _ in rows)  # every item completed exactly once
    assert sum(a for _, _, a in rows) == n + running  # only the item killed on the engine ran twice
    if running:
        assert "recovered 1 batch items" in log.read_text()


def test_serve_bad_options_are_one_line_errors(tmp_path, capsys, monkeypatch):
    from edgepop.cli import main

    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    from dataplane.gateway.server import free_port

    port = str(free_port())  # (a port this user may bind: the port is checked before the deployment is built)
    for args, needle in ((["--pops", "XXX", "--no-auth"], "--pops (field 'pops'): unknown PoP id(s) 'XXX'"),
                         (["--models", "@cf/none/x", "--no-auth"], "--models (field 'models'): '@cf/none/x' is not in the catalog"),
                         (["--default-location", "100,0", "--no-auth"], "--default-location"),
                         ([], "no API tokens"),
                         (["--config", str(tmp_path / "missing.toml")], "not found")):
        assert main(["serve", *args, "--port", port]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("edgepop: error:") and needle in lines[0], lines


def test_serve_config_errors_name_the_file_field_and_overrides_as_given(tmp_path, capsys, monkeypatch):
    from dataplane.gateway.server import free_port
    from edgepop.cli import main

    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    port = str(free_port())
    bad = tmp_path / "bad.toml"
    bad.write_text('pops = ["FRA", "XXX"]\nmodels = ["@edgepop/gpt2-tiny"]\nno_auth = true\n')
    policy = tmp_path / "policy.toml"
    policy.write_text('placement_policy = "bogus"\nno_auth = true\n')
    for args, needle in (([], f"{bad}: field 'pops': unknown PoP id(s) 'XXX'"),  # no flag: the file alone
                         (["--threads", "1"], f"{bad} with its command-line overrides: field 'pops'"),
                         (["--pops", "FRA,YYY"], f"{bad} with its command-line overrides: --pops (field 'pops')"),
                         (["--config", str(policy)], f"{policy}: field 'placement_policy': unknown")):
        config = [] if "--config" in args else ["--config", str(bad)]
        assert main(["serve", *config, *args, "--port", port]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, lines)
        assert lines[0].count("command-line overrides") <= 1


def test_a_db_path_with_a_nul_byte_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    from dataplane.gateway.server import free_port
    from edgepop.cli import main

    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    monkeypatch.chdir(tmp_path)  # (a run that got past the check would write its store here)
    port = str(free_port())
    cfg = tmp_path / "nul.toml"
    cfg.write_text('db = "x\\u0000y.sqlite"\nno_auth = true\n')
    for args, needle in ((["--config", str(cfg)], f"{cfg}: field 'db': 'x\\x00y.sqlite' holds a NUL byte"),
                         (["--no-auth", "--db", "a\0b.sqlite"], "--db (field 'db'): 'a\\x00b.sqlite' holds a NUL byte")):
        assert main(["serve", *args, "--port", port]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, lines)
