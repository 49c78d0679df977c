"""A batch poll: a job still running is counted without decoding its stored results, and a finished job's
responses (10,000 can be tens of MB of JSON) are built and encoded off the event loop's thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
from kit.gateway import GEN, headers, run_url

from dataplane.gateway.batch import BatchService


def test_a_running_jobs_poll_counts_its_items_without_decoding_their_results(tmp_path, monkeypatch):
    service = BatchService(None, tmp_path / "b.sqlite")
    job = service.store.create("alice", GEN, [{"prompt": str(i)} for i in range(3)], 1.0, 2.0)
    for item in service.store.claim(2):
        service.store.complete(item["job"], item["idx"], {"result": {"response": "stored-result"}}, True)
    decoded, real_loads = [], json.loads

    def loads(text, *args, **kw):
        if "stored-result" in text:
            decoded.append(text)
        return real_loads(text, *args, **kw)

    monkeypatch.setattr(json, "loads", loads)

    async def main():
        try:
            return await service.poll("alice", job)
        finally:
            await service.stop()

    assert asyncio.run(main()) == {"status": "running", "request_id": job, "model": GEN, "completed": 2, "total": 3}
    assert decoded == []


def test_a_finished_jobs_poll_is_encoded_off_the_event_loop(gateway, monkeypatch):
    url, app = gateway
    n = 40
    # (ignore_eos: an unseeded sample may end at its first token, and the usage below counts two a request)
    reqs = [{"prompt": f"p{i}", "max_tokens": 2, "ignore_eos": True, "external_reference": f"ref-{i}"}
            for i in range(n)]
    r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"requests": reqs}, headers=headers())
    rid = r.json()["result"]["request_id"]
    poll = {"request_id": rid}
    for _ in range(1200):  # a hang guard (at least 2 minutes of polls), not a timing goal: no clock is read
        r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json=poll, headers=headers())
        if r.json()["result"]["status"] == "done":
            break
        time.sleep(0.1)
    assert r.json()["result"]["status"] == "done", r.text
    encoded_on, real_dumps = [], json.dumps

    def dumps(value, *args, **kw):
        out = real_dumps(value, *args, **kw)
        if rid in out or "ref-" in out:  # the poll's envelope or one of its responses
            encoded_on.append(threading.current_thread().name)
        return out

    monkeypatch.setattr(json, "dumps", dumps)
    r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json=poll, headers=headers())
    monkeypatch.undo()
    result = r.json()["result"]
    assert result["status"] == "done" and [x["external_reference"] for x in result["responses"]] == [
        f"ref-{i}" for i in range(n)]
    assert all(x["success"] for x in result["responses"]) and result["usage"]["completion_tokens"] == 2 * n
    assert encoded_on and "edgepop-uvicorn" not in encoded_on, encoded_on  # (the server's event loop thread)


def test_the_piecewise_encoding_is_the_whole_encoding():
    from dataplane.gateway.batch import _dumps, _encode

    content = {"result": {"status": "done", "request_id": "r", "model": GEN, "usage": {"total_tokens": 3},
                          "responses": [{"id": i, "success": True, "result": {"response": f"é\"{i}"}}
                                        for i in range(3)]},
               "success": True, "errors": [], "messages": []}
    assert _encode(content) == _dumps(content)
    assert json.loads(_encode(content)) == content
    assert _encode({"result": {"status": "queued"}}) == _dumps({"result": {"status": "queued"}})


def test_a_poll_says_running_only_while_items_run_or_the_runner_here_will_take_them(tmp_path):
    """Every mix of done (failed ones included), running and queued items, for a served model and an unserved one."""
    service = BatchService(None, tmp_path / "b.sqlite")
    store = service.store
    job = store.create("alice", GEN, [{"prompt": str(i)} for i in range(3)], 1.0, 2.0)

    async def status(served: bool) -> str:
        return (await service.poll("alice", job, served=served))["status"]

    async def main():
        try:
            seen = [(await status(True), await status(False))]  # all queued
            first, second = store.claim(2)
            seen.append((await status(True), await status(False)))  # 2 running, 1 queued
            store.complete(first["job"], first["idx"], {"errors": ["boom"]}, False)  # a failed item is done too
            seen.append((await status(True), await status(False)))  # 1 done, 1 running, 1 queued
            store.requeue(second["job"], second["idx"], 0.0)
            seen.append((await status(True), await status(False)))  # 1 done, 2 queued: only a runner here runs them
            for item in store.claim(2):
                store.complete(item["job"], item["idx"], {"result": {}}, True)
            seen.append((await status(True), await status(False)))
            return seen
        finally:
            await service.stop()

    assert asyncio.run(main()) == [("queued", "queued"), ("running", "running"), ("running", "running"),
                                   ("running", "queued"), ("done", "done")]


def test_a_poll_through_an_unserved_models_url_of_a_half_done_job_says_queued(tmp_path, gateway_topo):
    """A restart with other models: the job's done items stay done, the rest wait, and nothing runs."""
    from kit.gateway import EMB, TOKENS, _serve

    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.batch_store import BatchStore

    db = tmp_path / "b.sqlite"
    store = BatchStore(db)  # what the first server left: 1 of 3 items done, 2 queued
    job = store.create("alice", GEN, [{"prompt": str(i)} for i in range(3)], 1.0, 2.0)
    item = store.claim(1)[0]
    store.complete(item["job"], item["idx"], {"result": {"response": "x"}}, True)
    store.close()
    server, _ = _serve(GatewayConfig(pops=["FRA"], models=[EMB], tokens=TOKENS, delay=False, db=str(db)),
                       gateway_topo)
    try:
        r = httpx.post(run_url(server.url, GEN) + "?queueRequest=true", json={"request_id": job}, headers=headers(),
                       timeout=30)
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert r.json()["result"] == {"status": "queued", "request_id": job, "model": GEN, "completed": 1, "total": 3}
