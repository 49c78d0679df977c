"""Prefix KV reuse through a live gateway: a second request sharing a long prefix reports cached tokens."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from kit.gateway import GEN, TOKENS, headers, run_url

from dataplane.gateway.sse import parse_events

SYSTEM = ("You are the edge assistant of a content delivery network. Answer in one short sentence, cite the "
          "PoP that served the request, never invent latency figures, and prefer plain words. ") * 2


@pytest.fixture(scope="module")
def prefix_gateway(tmp_path_factory, gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], tokens=TOKENS, delay=False, lm_prefix_cache_mb=16,
                        lm_prefix_block=16, db=str(tmp_path_factory.mktemp("gw-prefix") / "b.sqlite"))
    server = ServerThread(create_app(cfg, topo=gateway_topo))
    server.start()
    yield server.url
    server.stop()


def test_openai_usage_reports_cached_prompt_tokens(prefix_gateway):
    c = openai.OpenAI(base_url=f"{prefix_gateway}/client/v4/accounts/alice/ai/v1", api_key="tok-alice-0000001",
                      max_retries=0, timeout=30)
    outs = []
    for question in ("Where am I served from?", "How fast was that?"):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        outs.append(c.chat.completions.create(model=GEN, messages=msgs, max_tokens=4, temperature=0))
    first, second = (o.usage for o in outs)
    assert first.prompt_tokens_details.cached_tokens == 0
    assert 200 <= second.prompt_tokens_details.cached_tokens < second.prompt_tokens
    assert second.prompt_tokens_details.cached_tokens % 16 == 0


def test_workers_ai_usage_reports_cached_prompt_tokens(prefix_gateway):
    body = {"prompt": SYSTEM + "Which PoP?", "max_tokens": 4, "temperature": 0}
    first = httpx.post(run_url(prefix_gateway, GEN), json=body, headers=headers(), timeout=30).json()
    body["prompt"] = SYSTEM + "And the RTT?"
    second = httpx.post(run_url(prefix_gateway, GEN), json=body, headers=headers(), timeout=30).json()
    assert first["success"] and second["success"]
    assert second["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 200
    with httpx.stream("POST", run_url(prefix_gateway, GEN), json={**body, "stream": True}, headers=headers(),
                      timeout=30) as r:
        events = parse_events(r.read().decode())
    usage = json.loads(events[-2])["usage"]  # the last frame before [DONE]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 200
