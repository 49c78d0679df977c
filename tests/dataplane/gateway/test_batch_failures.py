"""Async batch items when things go wrong: an engine past --request-timeout, a store that fails for a while, a
--db that is another application's database or a symlink to a served one, a shutdown in the middle of a claim."""

from __future__ import annotations

import os
import sqlite3
import time

import httpx
import pytest
from kit.gateway import GEN, SLOW, TOKENS, headers, run_url

from dataplane.gateway.batch_store import BatchStore
from edgepop.errors import UserError


@pytest.fixture(scope="module")
def hasty_gateway(tmp_path_factory, gateway_topo):
    """One PoP whose engines get 0.5 s a request: the slow stand-in's 300 tokens take seconds on any CPU."""
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA"], models=[GEN, SLOW], tokens=TOKENS, delay=False, request_timeout_s=0.5,
                        db=str(tmp_path_factory.mktemp("gw-hasty") / "b.sqlite"), batch_concurrency=2)
    app = create_app(cfg, topo=gateway_topo)
    server = ServerThread(app)
    server.start()
    yield server.url, app
    server.stop()


def _done(url: str, model: str, rid: str) -> dict:
    for _ in range(1200):  # a hang guard (at least 2 minutes of polls), not a timing goal: no clock is read
        r = httpx.post(run_url(url, model) + "?queueRequest=true", json={"request_id": rid}, headers=headers())
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        if result["status"] == "done":
            return result
        time.sleep(0.1)
    raise AssertionError(f"batch {rid} never finished: {result}")


def _submit(url: str, model: str, requests: list[dict]) -> str:
    r = httpx.post(run_url(url, model) + "?queueRequest=true", json={"requests": requests}, headers=headers())
    assert r.status_code == 200, r.text
    return r.json()["result"]["request_id"]


def test_an_item_past_the_request_timeout_fails_once_instead_of_running_again_and_again(hasty_gateway):
    url, app = hasty_gateway
    rid = _submit(url, SLOW, [{"prompt": "long", "max_tokens": 300, "ignore_eos": True}])
    result = _done(url, SLOW, rid)
    (item,) = result["responses"]
    assert item["success"] is False and item["errors"][0]["code"] == 3007
    job = app.state.gateway.batch.store.job("alice", rid)
    assert job["items"][0]["attempts"] == 1  # run once: an engine timeout is the item's outcome, not a retry


def test_the_batch_runner_outlives_a_store_that_fails_for_a_while(gateway, monkeypatch):
    """A claim and a completion that fail (a write lock another connection holds past SQLite's busy timeout) are
    tried again: the items run and keep their real outcome."""
    url, app = gateway
    service = app.state.gateway.batch
    real_claim, real_complete, failures = service.store.claim, service.store.complete, []

    def claim(limit, now=None, models=None):
        if len(failures) < 2:
            failures.append("claim")
            raise sqlite3.OperationalError("database is locked")
        return real_claim(limit, now, models)

    def complete(job, idx, result, success):
        if failures.count("complete") < 1:
            failures.append("complete")
            raise sqlite3.OperationalError("database is locked")
        return real_complete(job, idx, result, success)

    before = service.store_errors
    monkeypatch.setattr(service.store, "claim", claim)
    monkeypatch.setattr(service.store, "complete", complete)
    rid = _submit(url, GEN, [{"prompt": "a", "max_tokens": 2}, {"prompt": "b", "max_tokens": 2}])
    result = _done(url, GEN, rid)
    assert [r["success"] for r in result["responses"]] == [True, True]  # not failed by the store's hiccup
    assert failures == ["claim", "claim", "complete"] and service.store_errors - before == 3


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path):
    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE jobs (name TEXT, price REAL)")
    con.commit()
    con.close()
    with pytest.raises(UserError, match="other.sqlite: its table 'jobs' has columns"):
        BatchStore(db)
    con = sqlite3.connect(db)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    mode = con.execute("PRAGMA journal_mode").fetchone()[0]
    con.close()
    assert tables == ["jobs"] and mode != "wal"  # no table added, no journal mode changed
    con = sqlite3.connect(tmp_path / "notes.sqlite")
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    with pytest.raises(UserError, match="holds tables that are not edgepop's batch tables"):
        BatchStore(tmp_path / "notes.sqlite")
    BatchStore(tmp_path / "mine.sqlite").close()  # its own file, new or
    con = sqlite3.connect(tmp_path / "mine.sqlite")
    con.execute("ANALYZE")  # SQLite's own statistics table beside edgepop's
    con.close()
    BatchStore(tmp_path / "mine.sqlite").close()  # already its own, is fine


def test_a_symlink_to_a_served_database_is_the_same_database(tmp_path):
    db = tmp_path / "b.sqlite"
    first = BatchStore(db)
    (tmp_path / "link.sqlite").symlink_to(db)
    with pytest.raises(UserError, match="in use by another edgepop serve"):
        BatchStore(tmp_path / "link.sqlite")
    first.close()


def test_a_hard_link_to_a_database_another_process_serves_is_refused(tmp_path):
    """A hard link is the served file under another name (and with a WAL of its own name): a second process opening
    it would re-queue the first one's running items and write through a second WAL, so it is refused."""
    import subprocess
    import sys

    db, link = tmp_path / "b.sqlite", tmp_path / "hard.sqlite"
    first = BatchStore(db)
    first.create("alice", GEN, [{"prompt": "a"}], 1.0, 2.0)
    assert len(first.claim(10)) == 1
    os.link(db, link)
    code = ("import sys\nfrom dataplane.gateway.batch_store import BatchStore\nfrom edgepop.errors import UserError\n"
            "try:\n    BatchStore(sys.argv[1]).close()\nexcept UserError as exc:\n    sys.exit(str(exc))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name in (link, db):
        second = subprocess.run([sys.executable, "-c", code, str(name)], capture_output=True, text=True, env=env,
                                timeout=120)
        assert second.returncode == 1 and "in use by another edgepop serve" in second.stderr, second.stderr
    first.close()
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT status FROM items").fetchall() == [("running",)]  # not re-queued by the second
    second = subprocess.run([sys.executable, "-c", code, str(link)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert second.returncode == 0, second.stderr  # once the first has closed, the file is free by any name


def test_items_a_shutdown_claimed_but_never_ran_go_back_to_the_queue(tmp_path):
    """A drain that cancels the runner while its claim commits leaves those items marked running with no task
    for them: stop puts them back in the queue, as it does the items it cancels."""
    import asyncio

    from dataplane.gateway.batch import BatchService

    service = BatchService(None, tmp_path / "b.sqlite")
    service.store.create("alice", GEN, [{"prompt": "a"}, {"prompt": "b"}], 1.0, 2.0)
    assert len(service.store.claim(10)) == 2  # the claim committed; the runner that made it was cancelled
    asyncio.run(service.stop(timeout_s=1.0))
    assert service.requeued_at_stop == 2
    again = BatchStore(tmp_path / "b.sqlite")
    assert again.recovered == 0 and again.counts() == {"queued": 2, "running": 0, "done": 0}
    again.close()


def test_a_drain_during_a_claim_lets_the_claimed_items_run(tmp_path):
    """A drain used to cancel the runner; one that came while a claim committed left the claimed items with no
    task (put back in the queue at stop, never waited for). The runner is now told to stop: the claim under way
    finishes, its items run in the drain as the others do, and nothing goes back to the queue."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from dataplane.gateway.batch import BatchService

    ran = []

    async def infer(model, inputs, place, **kw):
        ran.append(inputs["prompt"])
        return None, SimpleNamespace(result={"response": "ok"}, usage={"prompt_tokens": 1, "completion_tokens": 1})

    gw = SimpleNamespace(backend=SimpleNamespace(catalog=SimpleNamespace(ids=[GEN])), infer=infer,
                         locator=SimpleNamespace(at=lambda lat, lon, why: (lat, lon)))
    service = BatchService(gw, tmp_path / "b.sqlite", concurrency=2)
    job = service.store.create("alice", GEN, [{"prompt": "a"}, {"prompt": "b"}], 1.0, 2.0)
    in_claim, go_on, real_claim = threading.Event(), threading.Event(), service.store.claim

    def claim(limit, now=None, models=None):
        got = real_claim(limit, now, models)  # committed: the items are 'running' in the store
        in_claim.set()
        assert go_on.wait(60), "the test never let the claim return"  # a hang guard
        return got

    service.store.claim = claim

    async def main():
        service.start()
        assert await asyncio.to_thread(in_claim.wait, 60)
        service.drain()  # (the gateway's first SIGINT) while the claim is under way
        go_on.set()
        await service.stop(timeout_s=60)

    asyncio.run(main())
    assert sorted(ran) == ["a", "b"] and service.requeued_at_stop == 0
    again = BatchStore(tmp_path / "b.sqlite")
    assert again.counts() == {"queued": 0, "running": 0, "done": 2}
    assert [it["status"] for it in again.job("alice", job)["items"]] == ["done", "done"]
    again.close()
