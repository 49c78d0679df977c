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
    deadline = time.monotonic() + 120  # a hang guard, not a timing goal
    while (r := httpx.post(run_url(url, GEN) + "?queueRequest=true", json=poll, headers=headers())
           ).json()["result"]["status"] != "done":
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
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
