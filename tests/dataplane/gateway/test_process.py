"""Real ``edgepop serve`` processes: a SIGTERM drains (in-flight stream finished, new connections refused, queued batch
items kept, exit status 0) and a restart resumes the batch; per-minute rate limits and the failed-auth brake answer
429 with ``Retry-After`` on both APIs."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
from kit.gateway import ALICE, BOB, EMB, GEN, SLOW, headers, run_url

from dataplane.gateway.server import spawn_serve
from dataplane.gateway.sse import DONE, parse_events


def _post(*args, **kw) -> httpx.Response:
    """httpx.post with a 60 s read timeout unless given: a hang guard (httpx's 5 s default failed a first request
    to a server just started on a loaded 2-core machine)."""
    kw.setdefault("timeout", 60)
    return httpx.post(*args, **kw)


def _get(*args, **kw) -> httpx.Response:
    """httpx.get with the same hang guard."""
    kw.setdefault("timeout", 60)
    return httpx.get(*args, **kw)


@contextmanager
def _serving(args: list[str], env: dict, log):
    """``edgepop serve`` started with ``args`` (its process and URL), killed on the way out if still running."""
    proc, url = spawn_serve(args, env=env, log=log)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _status(url: str, rid: str) -> dict:
    r = _post(run_url(url, GEN) + "?queueRequest=true", json={"request_id": rid}, headers=headers(), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["result"]


def _done(url: str, rid: str) -> dict:
    """The job's status once it is done, or as it stands after 120 s (a hang guard, not a timing goal)."""
    deadline = time.monotonic() + 120
    while (res := _status(url, rid))["status"] != "done" and time.monotonic() < deadline:
        time.sleep(0.1)
    return res


def _items(db) -> dict:
    with sqlite3.connect(db) as con:
        return dict(con.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall())


def test_sigterm_drains_in_flight_work_keeps_the_queue_and_exits_0(tmp_path):
    cfg, db, log = tmp_path / "gw.toml", tmp_path / "batch.sqlite", tmp_path / "log"
    cfg.write_text(f'pops = ["FRA"]\nmodels = ["{GEN}"]\nbatch_concurrency = 1\ndelay = false\ndrain_timeout_s = 120\n')
    args = ["--config", str(cfg), "--db", str(db)]
    env = {"EDGEPOP_TOKENS": f"{ALICE}:alice"}
    n = 10
    with _serving(args, env, log) as (proc, url):
        reqs = [{"prompt": f"job {i}", "max_tokens": 200, "ignore_eos": True, "seed": i} for i in range(n)]
        rid = _post(run_url(url, GEN) + "?queueRequest=true", json={"requests": reqs},
                         headers=headers()).json()["result"]["request_id"]
        body, first = [], threading.Event()

        def stream():
            with httpx.stream("POST", run_url(url, GEN), headers=headers(), timeout=120,
                              json={"prompt": "in flight", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
                for chunk in r.iter_text():
                    body.append(chunk)
                    first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        # The listener closes: a new connection is refused while the stream is still being served.
        deadline = time.monotonic() + 120  # a hang guard, not a timing goal: the loop ends at the first refusal
        while True:
            try:
                _get(f"{url}/healthz", timeout=5)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                break  # refused, or reset: a connection still in the listen backlog when the listener closed
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        t.join(120)
        assert proc.wait(120) == 0
    events = parse_events("".join(body))
    assert events[-1] == DONE and '"completion_tokens":200' in events[-2]  # the stream ran to its end
    left = _items(db)
    assert left.get("running", 0) == 0 and left.get("queued", 0) >= 1  # nothing half-run; the queue is kept
    assert "SIGTERM: draining" in log.read_text()

    with _serving(args, env, log) as (proc, url):  # the restart resumes the batch
        res = _done(url, rid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
    assert res["status"] == "done" and all(x["success"] for x in res["responses"])
    with sqlite3.connect(db) as con:
        assert [c for (c,) in con.execute("SELECT completions FROM items ORDER BY idx")] == [1] * n


def test_a_second_sigint_stops_running_batch_items_at_once_and_the_restart_runs_them(tmp_path):
    """The drain would wait drain_timeout_s (here 600 s) for the running items; a second SIGINT puts them back
    in the queue now, and the next start runs them."""
    slow, fast = tmp_path / "slow.toml", tmp_path / "fast.toml"
    db, log = tmp_path / "batch.sqlite", tmp_path / "log"
    common = f'pops = ["FRA"]\nmodels = ["{GEN}"]\nbatch_concurrency = 2\ndrain_timeout_s = 600\n'
    slow.write_text(common + "delay = true\ndelay_scale = 1000\n")  # Sydney -> Frankfurt 1000 times over: minutes
    fast.write_text(common + "delay = false\n")
    env = {"EDGEPOP_TOKENS": f"{ALICE}:alice"}
    n = 3
    with _serving(["--config", str(slow), "--db", str(db), "--no-warm"], env, log) as (proc, url):
        reqs = [{"prompt": f"job {i}", "max_tokens": 5, "seed": i} for i in range(n)]
        rid = _post(run_url(url, GEN) + "?queueRequest=true", json={"requests": reqs},
                         headers=headers(**{"x-edgepop-client-city": "Sydney"})).json()["result"]["request_id"]
        deadline = time.monotonic() + 120  # hang guards below, not timing goals
        while _items(db).get("running", 0) < 2:
            assert time.monotonic() < deadline, _items(db)
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        while "waiting up to" not in log.read_text():  # the drain now waits on the running items
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
    assert _items(db) == {"queued": n}  # the running ones went back, none was completed or failed
    assert "2 running batch items put back in the queue" in log.read_text()

    proc, url = spawn_serve(["--config", str(fast), "--db", str(db), "--no-warm"], env=env, log=log)
    try:
        res = _done(url, rid)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    assert res["status"] == "done" and all(x["success"] for x in res["responses"])


def test_a_second_sigint_ends_open_streams_and_requests_with_the_shutdown_error_and_no_traceback(tmp_path):
    """A second SIGINT during a drain skipped the app's shutdown: the open stream was cancelled mid-body (no closing
    frame) and its task and the lifespan's were logged as tracebacks. It brings the drain deadline forward: the
    stream ends with its in-band 3043 frame and [DONE], a plain request in flight gets its 503, the exit status
    is 0."""
    cfg, log = tmp_path / "gw.toml", tmp_path / "log"
    cfg.write_text(f'pops = ["FRA"]\nmodels = ["{SLOW}"]\ndelay = false\ndrain_timeout_s = 600\nmax_wait_s = 0\n')
    with _serving(["--config", str(cfg), "--db", str(tmp_path / "b.sqlite")], {"EDGEPOP_TOKENS": f"{ALICE}:alice"},
                  log) as (proc, url):
        body, out, first = {"prompt": "x", "max_tokens": 900, "ignore_eos": True}, {}, threading.Event()

        def stream():
            with httpx.stream("POST", run_url(url, SLOW), headers=headers(), timeout=120,
                              json={**body, "stream": True}) as r:
                for chunk in r.iter_text():
                    out["stream"] = out.get("stream", "") + chunk
                    first.set()

        def plain():
            out["plain"] = _post(run_url(url, SLOW), json=body, headers=headers(), timeout=120)

        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        assert first.wait(60)
        deadline = time.monotonic() + 60  # hang guards below, not timing goals
        while 'edgepop_cp_requests{state="running"} 2.0' not in _get(f"{url}/metrics", headers=headers()).text:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        while "draining" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(120)
        assert proc.wait(120) == 0
    events = parse_events(out["stream"])
    assert events[-1] == DONE and json.loads(events[-2])["error"]["code"] == 3043, events[-3:]
    assert out["plain"].status_code == 503 and out["plain"].json()["errors"][0]["code"] == 3043, out["plain"].text
    text = log.read_text()
    assert "SIGINT again: stopping now" in text and "Traceback" not in text and "ERROR" not in text, text


def test_queued_items_of_a_model_a_restart_no_longer_serves_wait_for_one_that_does(tmp_path):
    """Restarted with other --models, the items queued for a dropped model are not run (they would all fail as an
    unknown model): they stay queued, the start says so, their job answers polls, and a server with the model
    again runs them."""
    db, log = tmp_path / "batch.sqlite", tmp_path / "log"
    env = {"EDGEPOP_TOKENS": f"{ALICE}:alice"}

    def config(name: str, models: list[str], extra: str = "delay = false\n"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f"pops = [\"FRA\"]\nmodels = {models!r}\nbatch_concurrency = 1\n".replace("'", '"') + extra)
        return ["--config", str(path), "--db", str(db), "--no-warm"]

    def poll(url: str, model: str, rid: str) -> httpx.Response:
        return _post(run_url(url, model) + "?queueRequest=true", json={"request_id": rid}, headers=headers(),
                          timeout=10)

    # Both served, the one slot held by a far client's item delayed for minutes: the EMB job stays queued.
    with _serving(config("both", [GEN, EMB], "delay = true\ndelay_scale = 1000\ndrain_timeout_s = 0.5\n"),
                  env, log) as (proc, url):
        gen = _post(run_url(url, GEN) + "?queueRequest=true", json={"requests": [{"prompt": "a", "max_tokens": 3}]},
                         headers=headers(**{"x-edgepop-client-city": "Sydney"})).json()["result"]["request_id"]
        emb = _post(run_url(url, EMB) + "?queueRequest=true", json={"requests": [{"text": "x"}, {"text": "y"}]},
                         headers=headers()).json()["result"]["request_id"]
        deadline = time.monotonic() + 120  # hang guards, not timing goals
        while _items(db).get("running", 0) < 1:
            assert time.monotonic() < deadline, _items(db)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    assert _items(db) == {"queued": 3}

    proc, url = spawn_serve(config("gen", [GEN]), env=env, log=log)
    try:
        deadline = time.monotonic() + 120
        while (res := _status(url, gen))["status"] != "done":  # the runner works through what it serves
            assert time.monotonic() < deadline, res
            time.sleep(0.1)
        held = poll(url, EMB, emb)
        other = poll(url, EMB, gen)  # (another model's job, through this URL: still an unknown model)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    assert res["responses"][0]["success"]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT status, attempts FROM items WHERE job = ?", (emb,)).fetchall() == [("queued", 0)] * 2
    assert held.status_code == 200 and held.json()["result"] == {
        "status": "queued", "request_id": emb, "model": EMB, "completed": 0, "total": 2}, held.text
    assert other.status_code == 400 and other.json()["errors"][0]["code"] == 5007, other.text
    warnings = [line for line in log.read_text().splitlines() if "this server does not serve" in line]
    assert len(warnings) == 1 and f"{EMB}: 1 job(s) {emb}" in warnings[0], warnings

    proc, url = spawn_serve(config("again", [GEN, EMB]), env=env, log=log)
    try:
        deadline = time.monotonic() + 120
        while (res := poll(url, EMB, emb).json()["result"])["status"] != "done":
            assert time.monotonic() < deadline, res
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    assert [x["success"] for x in res["responses"]] == [True, True]


@pytest.fixture
def limited_server(tmp_path_factory):
    """A server of its own per test (the auth brake locks this machine's address out of it)."""
    tmp = tmp_path_factory.mktemp("limits")
    cfg = tmp / "gw.toml"
    cfg.write_text(f'pops = ["FRA"]\nmodels = ["{GEN}"]\ndelay = false\nauth_failures_per_minute = 4\n'
                   f'[rate_limits]\n"text-generation" = 5\n')
    proc, url = spawn_serve(["--config", str(cfg), "--db", str(tmp / "b.sqlite"), "--no-warm"],
                            env={"EDGEPOP_TOKENS": f"{ALICE}:alice,{BOB}:bob"}, log=tmp / "log")
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0


def _retry_after(r: httpx.Response) -> float:
    assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) >= 1
    return int(r.headers["retry-after-ms"]) / 1e3


# The sliding-window counter's wait for a limit of 5: at most the rest of this minute plus the part of the next one
# until this minute's 5 requests weigh 4 (a fifth of it), so up to 72 s when they all fell in this minute.
MAX_RETRY_S = 60 * (1 + 1 / 5)


def test_per_minute_rate_limit_per_account_on_both_apis(limited_server):
    url = limited_server
    body = {"prompt": "x", "max_tokens": 1}
    codes = [_post(run_url(url, GEN), json=body, headers=headers()).status_code for _ in range(5)]
    assert codes == [200] * 5
    r = _post(run_url(url, GEN), json=body, headers=headers())
    assert r.status_code == 429 and r.json()["errors"][0]["code"] == 3021 and _retry_after(r) <= MAX_RETRY_S
    assert r.headers["x-ratelimit-limit-requests"] == "5"
    # The OpenAI route counts against the same task limit and answers in OpenAI's 429 shape.
    oai = f"{url}/client/v4/accounts/alice/ai/v1/chat/completions"
    r = _post(oai, json={"model": GEN, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
                   headers=headers())
    assert r.status_code == 429 and _retry_after(r) <= MAX_RETRY_S
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and r.json()["error"]["type"] == "requests"
    client = openai.OpenAI(base_url=f"{url}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}], max_tokens=1)
    # Another account has its own budget.
    assert _post(run_url(url, GEN, "bob"), json=body, headers=headers(BOB)).status_code == 200


def test_repeated_failed_auth_is_refused_unchecked(limited_server):
    url = limited_server
    u = run_url(url, GEN, "bob")
    body = {"prompt": "x", "max_tokens": 1}
    wrong = [_post(u, json=body, headers=headers("tok-guess-000000")) for _ in range(30)]
    assert [r.status_code for r in wrong[:4]] == [401] * 4
    assert all(r.status_code == 429 and r.json()["errors"][0]["code"] == 10000 for r in wrong[4:])
    assert all(_retry_after(r) > 0 for r in wrong[4:])
    # While the brake is on, this client's requests are not checked at all, right token or not.
    assert _post(u, json=body, headers=headers(BOB)).status_code == 429
