"""Exact Workers AI and OpenAI shapes over the live gateway: ``{code, message}`` notes, ``result_info``, stand-ins
said as such, embeddings in the real model's dimension, ``max_tokens`` beyond the window, ``rejectIfBusy`` on the
OpenAI routes, Retry-After on capacity refusals, and the daily neuron budget (3036)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest
from kit.gateway import ALICE, EMB, GEN, SLOW, TOKENS, headers, run_url

from dataplane.gateway.standins import projection

LONG = {"prompt": "busy", "max_tokens": 400, "ignore_eos": True, "temperature": 0}


def test_envelope_messages_are_code_message_objects(gateway):
    url, _ = gateway
    doc = httpx.post(run_url(url, GEN), json={"prompt": "hi", "max_tokens": 2}, headers=headers()).json()
    assert doc["success"] and doc["messages"]
    assert all(set(m) == {"code", "message"} and isinstance(m["code"], int) for m in doc["messages"])
    assert {m["code"] for m in doc["messages"]} == {1001, 1002}  # a stand-in, with synthetic weights
    real = httpx.post(run_url(url, "@edgepop/gpt2-tiny"), json={"prompt": "hi", "max_tokens": 2},
                      headers=headers()).json()
    assert [m["code"] for m in real["messages"]] == [1002]  # itself, not a stand-in (synthetic weights still)
    err = httpx.post(run_url(url, GEN), json={"prompt": 5}, headers=headers()).json()
    assert set(err["errors"][0]) == {"code", "message"} and err["messages"] == []


def test_models_search_result_info_and_stand_ins(gateway):
    url, _ = gateway
    base = f"{url}/client/v4/accounts/alice/ai/models/search"
    doc = httpx.get(base, params={"per_page": 2, "page": 2}, headers=headers()).json()
    info = doc["result_info"]
    assert info["page"] == 2 and info["per_page"] == 2 and info["count"] == len(doc["result"]) == 2
    assert info["total_count"] >= 7 and info["total_pages"] == -(-info["total_count"] // 2)
    models = {m["name"]: {p["property_id"]: p["value"] for p in m["properties"]}
              for m in httpx.get(base, headers=headers()).json()["result"]}
    assert models[GEN]["is_stand_in"] == "true" and models["@edgepop/gpt2-tiny"]["is_stand_in"] == "false"
    assert models[EMB]["is_stand_in"] == "true" and models[EMB]["dimensions"] == "768"
    assert models[GEN]["context_window"] == "512"  # the stand-in's window is what is served


def test_stand_in_embeddings_in_the_real_dimension_keep_similarities(gateway):
    url, app = gateway
    texts = ["A man is eating food.", "A man is eating a meal.", "The stock market fell sharply."]
    real = np.array(app.state.gateway.backend.dp.run("minilm-l6-v2", {"text": texts})["data"])  # the stand-in
    served = np.array(httpx.post(run_url(url, EMB), json={"text": texts}, headers=headers()).json()["result"]["data"])
    assert real.shape == (3, 384) and served.shape == (3, 768)
    assert np.allclose(served @ served.T, real @ real.T, atol=1e-5)  # every cosine similarity kept
    assert np.allclose(served, real @ projection(EMB, 384, 768).T, atol=1e-6)  # one fixed map, the same each time


def test_max_tokens_beyond_the_context_window_is_refused(gateway):
    url, _ = gateway
    r = httpx.post(run_url(url, GEN), json={"prompt": "hello", "max_tokens": 100_000}, headers=headers())
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == 5006
    assert "maximum context length is 512 tokens" in r.json()["errors"][0]["message"]
    c = openai.OpenAI(base_url=f"{url}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="context length"):
        c.chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}], max_tokens=600)
    # Without max_tokens the default is fitted to the room the prompt leaves.
    r = httpx.post(run_url(url, GEN), json={"prompt": "p" * 400, "ignore_eos": True}, headers=headers(), timeout=60)
    assert r.status_code == 200 and r.json()["result"]["usage"]["completion_tokens"] <= 112


async def _post(client, url, body, hdrs):
    r = await client.post(url, json=body, headers=hdrs)
    return r


def test_reject_if_busy_on_openai_routes_and_retry_after_on_capacity(small_gateway):
    url, app = small_gateway
    chat = f"{url}/client/v4/accounts/alice/ai/v1/chat/completions"
    msg = {"model": SLOW, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as c:
            # the slow stand-in holds the only slot for seconds, however fast the machine
            long_ = asyncio.create_task(_post(c, run_url(url, SLOW), {**LONG, "max_tokens": 300}, headers()))
            deadline = time.monotonic() + 120  # a hang guard, not a timing goal
            while app.state.gateway.backend.plane.snapshot()["running"] == 0:
                assert time.monotonic() < deadline, "the long request never started"
                await asyncio.sleep(0.01)
            body = await _post(c, chat, {**msg, "options": {"rejectIfBusy": True}}, headers())
            query = await _post(c, chat + "?rejectIfBusy=true", msg, headers())
            workers = await _post(c, run_url(url, SLOW), {"prompt": "x", "max_tokens": 2,
                                                         "options": {"rejectIfBusy": True}}, headers())
            return body, query, workers, await long_

    body, query, workers, long_ = asyncio.run(scenario())
    for r in (body, query):
        assert r.status_code == 429 and "error" in r.json()
    assert workers.status_code == 429 and workers.json()["errors"][0]["code"] == 3040
    for r in (body, query, workers):
        assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) >= 1
    assert long_.status_code == 200


@pytest.fixture(scope="module")
def budget_gateway(tmp_path_factory, gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], tokens=TOKENS, delay=False, neuron_budget_per_day=0.01,
                        db=str(tmp_path_factory.mktemp("gw-budget") / "b.sqlite"))
    server = ServerThread(create_app(cfg, topo=gateway_topo))
    yield server.start()
    server.stop()


def test_daily_neuron_budget_answers_3036(budget_gateway):
    url = budget_gateway
    body = {"prompt": "spend", "max_tokens": 8, "ignore_eos": True}
    assert httpx.post(run_url(url, GEN), json=body, headers=headers()).status_code == 200  # costs > 0.01 neurons
    r = httpx.post(run_url(url, GEN), json=body, headers=headers())
    assert r.status_code == 429 and r.json()["errors"][0]["code"] == 3036
    assert 1 <= int(r.headers["retry-after"]) <= 86_400  # until 00:00 UTC
    oai = openai.OpenAI(base_url=f"{url}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        oai.chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert e.value.code == "insufficient_quota"
    bob = httpx.post(run_url(url, GEN, "bob"), json=body, headers=headers("tok-bob-00000001"))
    assert bob.status_code == 200  # per account


def test_server_keeps_idle_connections_longer_than_clients_do(gateway):
    """A client that reuses a pooled connection just as the server closes it gets a ReadError (uvicorn's default
    keep-alive, 5 s, equals httpx's and the openai client's pool expiry); the server must outlast the client."""
    from dataplane.gateway.server import DRAIN_GRACE_S, uvicorn_config

    _, app = gateway
    cfg = uvicorn_config(app, "127.0.0.1", 1)
    assert cfg.timeout_keep_alive > 2 * httpx.Limits().keepalive_expiry
    # uvicorn's deadline comes after the gateway's own, which answers what is still in flight
    assert cfg.timeout_graceful_shutdown == app.state.gateway.config.drain_timeout_s + DRAIN_GRACE_S
