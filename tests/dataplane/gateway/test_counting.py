"""edgepop_requests_total counts every request once, with its final status; bad input does not use up the
per-minute rate limit on any route (async batch submissions included)."""

from __future__ import annotations

import time

import httpx
import pytest
from kit.gateway import GEN, run_url
from prometheus_client.parser import text_string_to_metric_families


def _serve(tmp_path, topo, **kw):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], no_auth=True, delay=False, db=str(tmp_path / "b.sqlite"), **kw)
    app = create_app(cfg, topo=topo)
    server = ServerThread(app)
    server.start()
    return server, app.state.gateway


def _requests(url: str) -> dict[tuple, float]:
    """edgepop_requests_total by (model, endpoint, status), summed over PoPs."""
    out: dict[tuple, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in fam.samples:
            if s.name == "edgepop_requests_total":
                key = (s.labels["model"], s.labels["endpoint"], s.labels["status"])
                out[key] = out.get(key, 0) + s.value
    return out


@pytest.fixture
def limited(tmp_path, gateway_topo):
    server, gw = _serve(tmp_path, gateway_topo, rate_limits={GEN: 3})
    yield server.url
    server.stop()


def test_refused_batch_submissions_do_not_use_up_the_rate_limit(limited):
    url = run_url(limited, GEN, "local")
    for _ in range(3):
        r = httpx.post(url, params={"queueRequest": "true"}, json={"requests": 5})
        assert r.status_code == 400 and r.json()["errors"][0]["code"] == 5006
    r = httpx.post(url, json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_requests_refused_before_admission_are_counted_once(limited):
    url = run_url(limited, GEN, "local")
    cases = [  # (endpoint, kwargs): bad JSON, a bad location header, an unknown city, a bad batch body
        ("run", {"content": b"{not json", "headers": {"content-type": "application/json"}}),
        ("run", {"json": {"prompt": "hi"}, "headers": {"x-edgepop-client-location": "91,0"}}),
        ("run", {"json": {"prompt": "hi"}, "headers": {"x-edgepop-client-city": "Nowhere At All"}}),
        ("batch-submit", {"json": {"requests": []}, "params": {"queueRequest": "true"}}),
    ]
    for endpoint, kw in cases:
        before = _requests(limited)
        r = httpx.post(url, **kw)
        assert r.status_code == 400, r.text
        after = _requests(limited)
        changed = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        assert changed == {(GEN, endpoint, "400"): 1}, (endpoint, kw, changed)
    # A valid submission is counted too (200), and so is a bad chat body on the OpenAI route (no model known).
    before = _requests(limited)
    assert httpx.post(url, params={"queueRequest": "true"}, json={"requests": [{"prompt": "a"}]}).status_code == 200
    assert httpx.post(f"{limited}/client/v4/accounts/local/ai/v1/chat/completions", content=b"[").status_code == 400
    after = _requests(limited)
    # (the submitted item itself runs in the background and is counted as "batch" when it ends: maybe by now)
    assert {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0) and k[1] != "batch"} == {
        (GEN, "batch-submit", "200"): 1, ("_unknown", "chat", "400"): 1}


def test_batch_items_are_counted_once_with_their_outcome(tmp_path, gateway_topo):
    # One slot and a queue of one under four concurrent items: items are refused for capacity and retried.
    server, gw = _serve(tmp_path, gateway_topo, slots=1, queue_limit=1, batch_concurrency=4)
    try:
        url = run_url(server.url, GEN, "local")
        n = 12
        r = httpx.post(url, params={"queueRequest": "true"},
                       json={"requests": [{"prompt": f"item {i}", "max_tokens": 16, "ignore_eos": True}
                                          for i in range(n)]})
        job = r.json()["result"]["request_id"]
        for _ in range(600):  # a hang guard (at least 2 minutes of polls), not a timing goal: no clock is read
            if httpx.post(url, json={"request_id": job}).json()["result"]["status"] == "done":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"batch {job} never finished")
        assert gw.backend.plane.counts["rejected"] + gw.shedder.shed_count > 0  # some were refused and retried
        counted = {k: v for k, v in _requests(server.url).items() if k[1] == "batch"}
        assert counted == {(GEN, "batch", "200"): n}
    finally:
        server.stop()


def _responses(url: str) -> dict[tuple, float]:
    """edgepop_http_responses_total by (route, status)."""
    return {(s.labels["route"], s.labels["status"]): s.value
            for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
            for s in fam.samples if s.name == "edgepop_http_responses_total"}


def test_an_unknown_model_is_counted_with_the_status_the_client_got_on_every_route(tmp_path, gateway_topo):
    """An unknown model is a 404 on the OpenAI routes (400 on Workers AI's): edgepop_requests_total said 400 for
    both, while edgepop_http_responses_total and the client saw 404."""
    server, _ = _serve(tmp_path, gateway_topo)
    try:
        base = f"{server.url}/client/v4/accounts/local/ai"
        chat = {"model": "@cf/no/such-model", "messages": [{"role": "user", "content": "x"}]}
        cases = [  # (endpoint, path, body, the status the client gets)
            ("chat", "/v1/chat/completions", chat, 404),
            ("chat-stream", "/v1/chat/completions", {**chat, "stream": True}, 404),
            ("embeddings", "/v1/embeddings", {"model": "@cf/no/such-model", "input": "x"}, 404),
            ("run", "/run/@cf/no/such-model", {"prompt": "x"}, 400),
        ]
        for endpoint, path, body, status in cases:
            before, http_before = _requests(server.url), _responses(server.url)
            r = httpx.post(base + path, json=body, timeout=60)
            assert r.status_code == status, r.text
            after, http_after = _requests(server.url), _responses(server.url)
            changed = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            assert changed == {("_unknown", endpoint, str(status)): 1}, (endpoint, changed)
            http = {k: v - http_before.get(k, 0) for k, v in http_after.items()
                    if v != http_before.get(k, 0) and k[0] != "/metrics"}
            assert [s for (_route, s) in http] == [str(status)], (endpoint, http)
    finally:
        server.stop()
