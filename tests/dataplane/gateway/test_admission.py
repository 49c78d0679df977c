"""Control-plane behaviour through HTTP: capacity (429/3040), rejectIfBusy, queue timeout (408/3007), slot release,
session affinity (per model of a session), injected WAN delay, auth and batch isolation between accounts."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from kit.gateway import BOB, EMB, GEN, SLOW, headers, run_url

LONG = {"prompt": "busy", "max_tokens": 500, "ignore_eos": True, "temperature": 0}


async def _post(client, url, body, hdrs, delay=0.0):
    await asyncio.sleep(delay)
    r = await client.post(url, json=body, headers=hdrs)
    return r.status_code, r.json()


async def _until(plane, what: str, n: int, counts: bool = False) -> None:
    """Wait until the control plane's snapshot (or, with ``counts``, its running totals) has ``n`` ``what``."""
    for _ in range(24_000):  # a hang guard (at least 2 minutes of checks), not a timing goal: no clock is read
        if (plane.counts if counts else plane.snapshot())[what] >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"control plane never had {n} {what}")


def test_capacity_reject_if_busy_queue_full_and_queue_timeout(small_gateway):
    """The slow stand-in's 300 tokens (seconds on any CPU) hold the only slot past the queued request's 0.4 s
    timeout; each step waits for the state it needs (running, then waiting) instead of sleeping."""
    url, app = small_gateway
    u = run_url(url, SLOW)
    plane = app.state.gateway.backend.plane
    long_body = {**LONG, "max_tokens": 300}

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as c:
            long_ = asyncio.create_task(_post(c, u, long_body, headers()))  # takes the only slot
            await _until(plane, "running", 1)
            busy = await _post(c, u, {"prompt": "x", "max_tokens": 2, "options": {"rejectIfBusy": True}}, headers())
            queued = asyncio.create_task(_post(c, u, {"prompt": "y", "max_tokens": 2}, headers()))  # waits
            await _until(plane, "waiting", 1)
            full = await _post(c, u, {"prompt": "z", "max_tokens": 2}, headers())  # queue of one is full
            return busy, await queued, full, await long_

    busy, queued, full, long_ = asyncio.run(scenario())
    assert busy[0] == 429 and busy[1]["errors"][0]["code"] == 3040
    assert full[0] == 429 and full[1]["errors"][0]["code"] == 3040
    assert queued[0] == 408 and queued[1]["errors"][0]["code"] == 3007
    assert long_[0] == 200 and long_[1]["result"]["usage"]["completion_tokens"] == 300
    gw = app.state.gateway
    snap = gw.backend.plane.snapshot()
    assert snap["running"] == 0 and snap["waiting"] == 0 and gw.admission.leases_open == 0  # every slot released
    assert snap["expired"] >= 1


def test_queued_request_starts_when_the_slot_frees(patient_gateway):
    """The second request is sent while the first holds the only slot, waits in the queue and runs once the slot
    frees (the queue timeout is far away: nothing here races a clock)."""
    url, app = patient_gateway
    u = run_url(url, GEN)
    plane = app.state.gateway.backend.plane

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as c:
            first = asyncio.create_task(_post(c, u, LONG, headers()))  # hundreds of ms: the second meets it running
            await _until(plane, "running", 1)
            second = asyncio.create_task(_post(c, u, {"prompt": "b", "max_tokens": 3}, headers()))
            await _until(plane, "queued", 1, counts=True)
            return await first, await second

    first, second = asyncio.run(scenario())
    assert first[0] == 200 and first[1]["result"]["usage"]["completion_tokens"] == 500
    assert second[0] == 200  # the second waited in the queue and then ran
    assert app.state.gateway.backend.plane.counts["queued"] >= 1


def _cut_streams(gw) -> float:
    return sum(s.value for metric in gw.metrics.requests.collect() for s in metric.samples
               if s.name.endswith("_total") and s.labels["endpoint"] == "run-stream" and s.labels["status"] == "499")


def test_client_disconnect_mid_stream_frees_the_slot(small_gateway):
    url, app = small_gateway
    gw = app.state.gateway
    cut = _cut_streams(gw)
    with httpx.stream("POST", run_url(url, GEN), json={**LONG, "stream": True}, headers=headers()) as r:
        for _ in r.iter_lines():
            break  # go away after the first event
    for _ in range(6000):  # a hang guard (at least 2 minutes of checks), not a timing goal: ends once the slot is free
        if not (gw.admission.leases_open or _cut_streams(gw) == cut):
            break
        time.sleep(0.02)
    assert gw.admission.leases_open == 0 and gw.backend.plane.snapshot()["running"] == 0
    assert _cut_streams(gw) == cut + 1  # counted as a request the client left (499), not lost from the counts
    assert httpx.post(run_url(url, GEN), json={"prompt": "next", "max_tokens": 2}, headers=headers(),
                      timeout=30).status_code == 200


def test_a_city_header_in_utf8_is_read_as_sent(delayed_gateway):
    """HTTP servers hand header bytes over as Latin-1: "Zürich" sent as UTF-8 must not become "ZÃ¼rich"."""
    url, _ = delayed_gateway
    u = f"{url}/client/v4/accounts/local/ai/run/{GEN}"
    body = {"prompt": "hi", "max_tokens": 1}
    plain = httpx.post(u, json=body, headers={"x-edgepop-client-city": "Zurich"}, timeout=30)
    accented = httpx.post(u, json=body, headers={"x-edgepop-client-city": "Zürich".encode()}, timeout=30)
    assert plain.status_code == accented.status_code == 200, accented.text
    assert accented.headers["x-edgepop-rtt-ms"] == plain.headers["x-edgepop-rtt-ms"]


def test_injected_rtt_and_session_affinity(delayed_gateway, monkeypatch):
    url, app = delayed_gateway
    u = f"{url}/client/v4/accounts/local/ai/run/{GEN}"
    body = {"prompt": "hi", "max_tokens": 1}
    # Every injected wait goes through Delays.seconds: record the waits it hands out (ms), not how long they took,
    # so that no assertion reads a clock.
    delays, waits = app.state.gateway.delays, []
    seconds = delays.seconds
    monkeypatch.setattr(delays, "seconds", lambda ms: waits.append(seconds(ms) * 1e3) or seconds(ms))
    sydney = httpx.post(u, json=body, headers={"x-edgepop-client-city": "Sydney"}, timeout=30)
    monkeypatch.undo()
    assert sydney.headers["x-edgepop-pop"] == "SIN"
    rtt = float(sydney.headers["x-edgepop-rtt-ms"])
    assert rtt > 80  # Sydney -> Singapore is far
    # The whole RTT is injected: in, the access half then the backbone half (together half the RTT); out, half the
    # RTT from the serving PoP back to the client.
    half = rtt / 2
    assert any(abs(w - half) < 0.01 for w in waits), (waits, rtt)
    assert any(abs(a + b - half) < 0.01 for i, a in enumerate(waits) for b in waits[i + 1:] if a and b), (waits, rtt)
    timing = dict(p.split(";dur=") for p in sydney.headers["server-timing"].split(", "))
    assert {"wan-in", "wan-out"} <= set(timing)
    london = httpx.post(u, json=body, headers={"x-edgepop-client-location": "51.5,-0.12"}, timeout=30)
    assert london.headers["x-edgepop-pop"] == "LHR" and float(london.headers["x-edgepop-rtt-ms"]) < 30
    # A session pinned in Singapore stays there when its client shows up in London.
    s = {"x-session-affinity": "sess-42"}
    first = httpx.post(u, json=body, headers={**s, "x-edgepop-client-city": "Singapore"}, timeout=30)
    again = httpx.post(u, json=body, headers={**s, "x-edgepop-client-location": "51.5,-0.12"}, timeout=30)
    assert first.headers["x-edgepop-pop"] == again.headers["x-edgepop-pop"] == "SIN"


@pytest.fixture(scope="module")
def affinity_gateway(tmp_path_factory, gateway_topo):
    """Session affinity over two PoPs, each serving a text-generation and an embedding model."""
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA", "LHR"], models=[GEN, EMB], no_auth=True, delay=False, router="session-affinity",
                        db=str(tmp_path_factory.mktemp("gw-affinity") / "b.sqlite"))
    app = create_app(cfg, topo=gateway_topo)
    server = ServerThread(app)
    server.start()
    yield server.url, app
    server.stop()


def test_one_session_calling_two_models_gets_a_replica_of_each(affinity_gateway):
    """The x-session-affinity header pins a session per model: its embedding call does not follow the pin of its
    chat call onto the chat model's replica, and each model's later calls keep their own replica."""
    url, app = affinity_gateway
    replicas = {str(r.id): r for r in app.state.gateway.backend.plane.state.replicas}
    s = {"x-session-affinity": "sess-two-models", "x-edgepop-client-location": "51.5,-0.12"}  # London

    def call(model, body):
        r = httpx.post(f"{url}/client/v4/accounts/local/ai/run/{model}", json=body, headers=s, timeout=60)
        assert r.status_code == 200, r.text
        return replicas[r.headers["x-edgepop-replica"]], r.json()["result"]

    chat, _ = call(GEN, {"prompt": "hi", "max_tokens": 1})
    emb, result = call(EMB, {"text": ["a cat"]})
    assert chat.model == GEN and emb.model == EMB and result["shape"] == [1, 768]
    assert call(GEN, {"prompt": "again", "max_tokens": 1})[0] is chat
    assert call(EMB, {"text": ["a dog"]})[0] is emb


def test_auth_401_403(gateway):
    url, _ = gateway
    u = run_url(url, GEN)
    body = {"prompt": "x", "max_tokens": 1}
    assert httpx.post(u, json=body).status_code == 401
    assert httpx.post(u, json=body, headers={"authorization": "Bearer nope-nope-nope"}).status_code == 401
    assert httpx.post(u, json=body, headers={"authorization": "Basic abc"}).status_code == 401
    r = httpx.post(u, json=body, headers=headers(BOB))  # bob's token on alice's account
    assert r.status_code == 403 and r.json()["errors"][0]["code"] == 10000
    assert httpx.get(f"{url}/client/v4/accounts/alice/ai/models/search", headers=headers(BOB)).status_code == 403


def _poll(url, model, rid, token, account, tries=1200):
    """The batch's answer once done (or refused); after ``tries`` polls 0.1 s apart (a hang guard of at least 2
    minutes, no clock read), the last answer, which the caller's assertions then reject."""
    for _ in range(tries):
        r = httpx.post(run_url(url, model, account) + "?queueRequest=true", json={"request_id": rid},
                       headers=headers(token))
        if r.status_code != 200 or r.json()["result"]["status"] == "done":
            return r
        time.sleep(0.1)
    return r


def test_async_batch_and_account_isolation(gateway):
    url, _ = gateway
    reqs = [{"prompt": f"item {i}", "max_tokens": 3, "external_reference": f"ref-{i}"} for i in range(5)]
    reqs[0]["options"] = {"rejectIfBusy": True}  # the /run route's option: a batch item waits its turn anyway
    reqs.append({"prompt": 17})  # a bad item fails alone
    r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"requests": reqs}, headers=headers())
    assert r.status_code == 200
    queued = r.json()["result"]
    assert queued["status"] == "queued" and queued["model"] == GEN
    rid = queued["request_id"]
    # Bob cannot see Alice's job, not even through his own account.
    r = httpx.post(run_url(url, GEN, "bob") + "?queueRequest=true", json={"request_id": rid}, headers=headers(BOB))
    assert r.status_code == 404
    r = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"request_id": rid}, headers=headers(BOB))
    assert r.status_code == 403
    done = _poll(url, GEN, rid, headers()["authorization"][7:], "alice").json()["result"]
    assert done["status"] == "done" and [x["id"] for x in done["responses"]] == list(range(6))
    assert all(x["success"] for x in done["responses"][:5]) and done["responses"][5]["success"] is False
    assert done["responses"][5]["errors"][0]["code"] == 5006
    assert [x["external_reference"] for x in done["responses"][:2]] == ["ref-0", "ref-1"]
    assert done["usage"]["completion_tokens"] == sum(x["result"]["usage"]["completion_tokens"]
                                                     for x in done["responses"][:5])
    bad = httpx.post(run_url(url, GEN) + "?queueRequest=true", json={"requests": []}, headers=headers())
    assert bad.status_code == 400
    unknown = httpx.post(run_url(url, "@cf/x/y") + "?queueRequest=true", json={"requests": [{}]},
                         headers=headers())
    assert (unknown.status_code, unknown.json()["errors"][0]["code"]) == (400, 5007)
