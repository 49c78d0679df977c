"""Clients that go away: a plain (non-streaming) request whose client disconnects is cancelled, which frees its slot
and stops its generation, and counts as 499; a queued one leaves the queue; a body that stops arriving is a 408."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import pytest
from kit.gateway import GEN, SLOW, headers, spent_recently
from kit.waiting import until

from dataplane.gateway.errors import GatewayError
from dataplane.gateway.http_util import read_body

MAX_TOKENS = 300


def _until(check, what: str) -> None:
    until(check, f"never: {what}", 120, 0.005)


def _send_and_keep_open(url: str, path: str, body: dict, **extra) -> socket.socket:
    """A raw HTTP/1.1 POST whose connection stays open until the caller closes it (without reading the answer)."""
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers(**{"content-type": "application/json", **extra}).items())
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n{head}content-length: {len(data)}\r\n\r\n"
                 .encode() + data)
    return sock


def _engine_tokens(gw, stand_in: str) -> int:
    return sum(eng.stats.tokens for name, _r, eng in gw.backend.dp.engines() if name == stand_in)


def _count(gw, endpoint: str, status: str, pop: str | None = None) -> float:
    return sum(s.value for metric in gw.metrics.requests.collect() for s in metric.samples
               if s.name.endswith("_total") and s.labels["endpoint"] == endpoint and s.labels["status"] == status
               and (pop is None or s.labels["pop"] == pop))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/run/"])
def test_a_plain_request_whose_client_disconnects_is_cancelled(small_gateway, path):
    """The slow stand-in's 300 tokens take seconds on any CPU; the client closes its connection once the generation
    has begun. The slot frees, the engine stops short of 300 tokens and the request counts as 499, not 200."""
    url, app = small_gateway
    gw = app.state.gateway
    plane = gw.backend.plane
    stand_in = gw.backend.stand_in[SLOW]
    endpoint = "chat" if "chat" in path else "run"
    before_tokens, before_499 = _engine_tokens(gw, stand_in), _count(gw, endpoint, "499")
    unlabelled = _count(gw, endpoint, "499", pop="")
    prefix = "/client/v4/accounts/alice/ai"
    if "chat" in path:
        route, body = prefix + path, {"model": SLOW, "messages": [{"role": "user", "content": "x"}]}
    else:
        route, body = prefix + path + SLOW, {"prompt": "x"}
    per_day = gw.budget.per_day
    gw.budget.per_day = 1e12  # a budget no request reaches: what the request used is charged to it
    charged = []
    charge = gw.charge
    gw.charge = lambda call, completion_tokens: (charged.append(completion_tokens), charge(call, completion_tokens))
    try:
        spent = spent_recently(gw.budget, "alice")
        sock = _send_and_keep_open(url, route, {**body, "max_tokens": MAX_TOKENS, "ignore_eos": True})
        try:
            _until(lambda: _engine_tokens(gw, stand_in) > before_tokens, "the generation began")
        finally:
            sock.close()
        _until(lambda: plane.snapshot()["running"] == 0 and gw.admission.leases_open == 0, "the slot was released")
        _until(lambda: _count(gw, endpoint, "499") == before_499 + 1, "the request counted as 499")
        assert spent_recently(gw.budget, "alice") > spent  # its work is charged, not given away
    finally:
        gw.budget.per_day = per_day
        del gw.charge
    generated = _engine_tokens(gw, stand_in) - before_tokens
    assert 0 < generated < MAX_TOKENS
    assert len(charged) == 1 and 1 <= charged[0] <= generated  # its prompt and the tokens sampled for it
    assert _count(gw, endpoint, "499", pop="") == unlabelled  # counted at a PoP, as answered requests are


@pytest.mark.parametrize("stream", [False, True])
def test_a_queued_request_whose_client_disconnects_leaves_the_queue(patient_gateway, stream):
    """One slot, held by a request of 500 tokens (hundreds of ms: the second meets it running); a second request,
    plain or streaming, waits in the queue (whose timeout is far away) and its client goes: it leaves the queue and
    never starts."""
    url, app = patient_gateway
    gw = app.state.gateway
    plane = gw.backend.plane
    route = f"/client/v4/accounts/alice/ai/run/{GEN}"
    started = plane.counts["started"]
    first = _send_and_keep_open(url, route, {"prompt": "busy", "max_tokens": 500, "ignore_eos": True})
    try:
        _until(lambda: plane.snapshot()["running"] == 1, "the first request runs")
        second = _send_and_keep_open(url, route, {"prompt": "queued", "max_tokens": 2, "stream": stream})
        _until(lambda: plane.snapshot()["waiting"] == 1, "the second request waits")
        second.close()
        _until(lambda: plane.snapshot()["waiting"] == 0, "the queue emptied")
    finally:
        first.close()
    _until(lambda: plane.snapshot()["running"] == 0 and gw.admission.leases_open == 0, "every slot was released")
    assert plane.counts["started"] == started + 1  # the second request never ran


class _StallingRequest:
    """A request whose body stops after its first piece (a client that hangs mid-upload)."""

    headers = {"content-length": "100"}

    async def stream(self):
        yield b'{"prompt":'
        await asyncio.sleep(3600)
        yield b""


def test_a_body_that_stops_arriving_is_a_408():
    with pytest.raises(GatewayError) as e:
        asyncio.run(read_body(_StallingRequest(), 1000, idle_timeout_s=0.05))
    assert (e.value.status, e.value.code) == (408, 3007) and "10 bytes received" in e.value.message


def test_a_plain_request_abandoned_where_it_spilled_counts_at_that_pop(tmp_path, gateway_topo):
    """Its 499 carries the PoP serving it (LHR, where it spilled from a full FRA), not its ingress."""
    from kit.gateway import TOKENS, _serve

    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR"], models=[SLOW], tokens=TOKENS, delay=False, slots=1,
                        db=str(tmp_path / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    try:
        gw = app.state.gateway
        plane = gw.backend.plane
        route = f"/client/v4/accounts/alice/ai/run/{SLOW}"
        body = {"prompt": "x", "max_tokens": MAX_TOKENS, "ignore_eos": True}
        near = {"x-edgepop-client-location": "50.1,8.7"}  # Frankfurt: FRA is the ingress
        first = _send_and_keep_open(server.url, route, body, **near)
        _until(lambda: plane.snapshot()["running"] == 1, "the first runs")
        second = _send_and_keep_open(server.url, route, body, **near)
        _until(lambda: plane.snapshot()["running"] == 2, "the second runs")
        running = {gw.backend.site_ids[r.site] for r in plane.state.replicas if r.active}
        assert running == {"FRA", "LHR"}
        second.close()
        _until(lambda: _count(gw, "run", "499") == 1, "the second counted as 499")
        assert _count(gw, "run", "499", pop="LHR") == 1
        first.close()
    finally:
        server.stop()


def test_streams_dropped_mid_generation_return_their_kv_reservation(tmp_path, gateway_topo):
    """A KV budget that holds three of these streams at once: four clients each read the first chunk and hang up.
    Each cancelled generation gives its reservation back, so the budget is whole again and a later request is
    admitted and answered (its reservation used to leak, and the third or fourth request was never admitted)."""
    import httpx
    from kit.gateway import TOKENS, _serve

    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA"], models=[SLOW], tokens=TOKENS, delay=False, lm_kv_budget_tokens=1000,
                        db=str(tmp_path / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    try:
        gw = app.state.gateway
        stand_in = gw.backend.stand_in[SLOW]
        url = f"{server.url}/client/v4/accounts/alice/ai/run/{SLOW}"

        def reserved() -> int:
            return sum(eng._reserved for name, _r, eng in gw.backend.dp.engines() if name == stand_in)

        body = {"prompt": "hello world", "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
        for _ in range(4):
            before = _engine_tokens(gw, stand_in)
            with httpx.stream("POST", url, json=body, headers=headers(), timeout=60) as r:
                assert r.status_code == 200
                next(r.iter_raw())
            # the connection is closed mid-stream: the generation stops short and its budget comes back
            _until(lambda: reserved() == 0, "the dropped stream's KV reservation was returned")
            assert _engine_tokens(gw, stand_in) - before < MAX_TOKENS
        r = httpx.post(url, json={"prompt": "hi", "max_tokens": 4}, headers=headers(), timeout=120)
        assert r.status_code == 200 and r.json()["result"]["response"]
        assert reserved() == 0
    finally:
        server.stop()


def test_a_body_the_client_cuts_short_counts_as_499_not_400(tmp_path, gateway_topo):
    """Content-Length 100, 17 bytes, then the client shuts its sending side: it gets no answer (the server sees it
    gone), so the request counts as 499 like any other client that left, not as a 400 nobody received."""
    from kit.gateway import TOKENS, _serve

    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], tokens=TOKENS, delay=False, db=str(tmp_path / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    try:
        gw = app.state.gateway
        parts = urlsplit(server.url)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers(**{"content-type": "application/json"}).items())
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:  # (a hang guard)
            sock.sendall(f"POST /client/v4/accounts/alice/ai/run/{GEN} HTTP/1.1\r\nhost: {parts.netloc}\r\n{head}"
                         "content-length: 100\r\n\r\n".encode() + b'{"prompt":"hello"')
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
        assert received == b""  # the client got nothing
        _until(lambda: _count(gw, "run", "499") == 1, "the cut-short request counted as 499")
        assert _count(gw, "run", "400") == 0
    finally:
        server.stop()
