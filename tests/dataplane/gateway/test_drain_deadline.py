"""The drain deadline: what is still in flight when it comes is answered by the gateway (503/3043, in-band for a
stream, then [DONE]) and counted once, not cancelled by uvicorn into a plain-text 500 with a logged traceback."""

from __future__ import annotations

import json
import logging
import signal
import threading

import httpx
from kit.gateway import SLOW, run_url
from kit.waiting import until
from prometheus_client.parser import text_string_to_metric_families

from dataplane.gateway.sse import parse_events


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _until(cond, timeout_s: float = 60.0) -> None:
    until(cond, "condition not reached", timeout_s, 0.02)


def test_requests_in_flight_at_the_drain_deadline_get_the_shutdown_error(tmp_path, gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    # One slot: a long stream holds it, a plain request waits in the queue; both outlast a short drain.
    cfg = GatewayConfig(pops=["FRA"], models=[SLOW], no_auth=True, delay=False, slots=1, max_wait_s=0,
                        queue_timeout_s=120, drain_timeout_s=0.5, db=str(tmp_path / "b.sqlite"))
    app = create_app(cfg, topo=gateway_topo)
    gw = app.state.gateway
    server = ServerThread(app)
    url = run_url(server.start(), SLOW, "local")
    records = _Records()
    logging.getLogger("uvicorn.error").addHandler(records)
    out: dict = {}
    body = {"prompt": "Hello", "max_tokens": 900, "ignore_eos": True}

    def stream():
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
            out["stream_status"] = r.status_code
            out["stream"] = "".join(r.iter_text())

    def plain():
        r = httpx.post(url, json=body, timeout=60)
        out["plain"] = (r.status_code, r.headers.get("content-type"), r.text)

    threads = [threading.Thread(target=stream)]
    try:
        threads[0].start()
        _until(lambda: gw.backend.plane.snapshot()["running"] == 1)
        threads.append(threading.Thread(target=plain))
        threads[1].start()
        _until(lambda: gw.backend.plane.snapshot()["waiting"] == 1)
        server.server.handle_exit(signal.SIGTERM, None)  # as the signal would
        for t in threads:
            t.join(timeout=60)
        server.thread.join(timeout=30)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(records)
        server.stop()
    status, ctype, text = out["plain"]
    assert status == 503 and ctype == "application/json", text
    assert json.loads(text)["errors"][0]["code"] == 3043
    assert out["stream_status"] == 200
    events = parse_events(out["stream"])
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 3043, events[-3:]
    assert not any("Exception in ASGI application" in m for m in records.messages), records.messages
    counted = {}
    for fam in text_string_to_metric_families(gw.metrics.render().decode()):
        for s in fam.samples:
            if s.name == "edgepop_requests_total" and s.value:
                counted[(s.labels["endpoint"], s.labels["status"])] = s.value
    assert counted == {("run", "503"): 1, ("run-stream", "503"): 1}


def test_an_app_driven_without_its_lifespan_still_answers(tmp_path, gateway_topo):
    # httpx's ASGI transport (the Python entry point gateway.md shows) runs no lifespan: no drain deadline to wait on
    import asyncio

    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app

    app = create_app(GatewayConfig(pops=["FRA"], models=["@edgepop/gpt2-tiny"], delay=False, no_auth=True,
                                   db=str(tmp_path / "b.sqlite")), topo=gateway_topo, warm=False)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            plain = await c.post(run_url("http://t", "@edgepop/gpt2-tiny"), json={"prompt": "hi", "max_tokens": 2})
            stream = await c.post(run_url("http://t", "@edgepop/gpt2-tiny"), json={"prompt": "hi", "max_tokens": 2,
                                                                       "stream": True})
            return plain, stream

    plain, stream = asyncio.run(main())
    assert plain.status_code == 200 and plain.json()["success"] is True
    assert stream.status_code == 200 and "[DONE]" in stream.text
