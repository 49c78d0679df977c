"""What the gateway counts and charges on the OpenAI routes: bad input does not use up the per-minute limit; a
refused ``dimensions`` runs nothing; a stream cut by the time limit is counted (408) and charged; embeddings are
billed by the served model's tokens; chat's ``top_k`` is honoured, not dropped; errors name the field sent."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from kit.gateway import ALICE, EMB, GEN, SLOW, TOKENS, headers, spent_recently

TINY_GEN = "@edgepop/gpt2-tiny"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def strict_gateway(tmp_path_factory, gateway_topo):
    """One PoP; 3 requests a minute for the chat model; engines get 2 s a request (the slow stand-in's 900
    tokens take many seconds on any CPU)."""
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA"], models=[GEN, TINY_GEN, SLOW, EMB], tokens=TOKENS, delay=False,
                        request_timeout_s=2.0,
                        rate_limits={GEN: 3}, neuron_budget_per_day=1e9,
                        db=str(tmp_path_factory.mktemp("gw-strict") / "b.sqlite"))
    app = create_app(cfg, topo=gateway_topo)
    server = ServerThread(app)
    server.start()
    yield server.url, app
    server.stop()


def _count(url: str, endpoint: str, status: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=headers()).text
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("edgepop_requests_total{") and f'endpoint="{endpoint}"' in line
                and f'status="{status}"' in line and f'model="{model}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bad_input_does_not_use_up_the_per_minute_limit(strict_gateway):
    url, _ = strict_gateway
    c = client(url)
    msgs = [{"role": "user", "content": "x"}]
    for bad in ({"max_tokens": 10**6}, {"temperature": 9}, {"max_tokens": 0}, {"top_k": 0}):
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=GEN, messages=msgs, **{k: v for k, v in bad.items() if k != "top_k"},
                                      extra_body={"top_k": bad["top_k"]} if "top_k" in bad else None)
    for _ in range(3):  # the limit is 3: the refused ones above did not count
        assert c.chat.completions.create(model=GEN, messages=msgs, max_tokens=1).object == "chat.completion"
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model=GEN, messages=msgs, max_tokens=1)


def test_a_refused_dimensions_runs_nothing(strict_gateway):
    url, app = strict_gateway
    before = _count(url, "embeddings", "200", EMB)
    with pytest.raises(openai.BadRequestError, match="field 'dimensions' must be 768"):
        client(url).embeddings.create(model=EMB, input="hi", dimensions=100)
    assert _count(url, "embeddings", "200", EMB) == before  # (it ran, and was counted a success, before)


def test_a_stream_past_the_request_timeout_is_counted_and_charged(strict_gateway):
    url, app = strict_gateway
    gw = app.state.gateway
    spent = spent_recently(gw.budget, "alice")
    stream = client(url).chat.completions.create(model=SLOW, messages=[{"role": "user", "content": "go"}],
                                                 max_tokens=900, stream=True, extra_body={"ignore_eos": True})
    with pytest.raises(openai.APIError, match="3007|past 2 s"):
        for _ in stream:
            pass
    deadline = time.monotonic() + 60  # a hang guard: the count lands as the stream's generator ends
    while _count(url, "chat-stream", "408", SLOW) < 1:
        assert time.monotonic() < deadline, "the cut stream was never counted"
        time.sleep(0.05)
    assert spent_recently(gw.budget, "alice") > spent  # its prompt and the tokens sampled were charged


def test_a_request_past_the_request_timeout_is_not_sent_again_by_the_client(strict_gateway):
    """The engine ran (and charged) it: the 408 says x-should-retry: false, so the openai client, which resends a
    408 by default, sends it once."""
    url, _ = strict_gateway
    before = _count(url, "chat", "408", SLOW)
    c = openai.OpenAI(base_url=f"{url}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=2, timeout=60)
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model=SLOW, messages=[{"role": "user", "content": "go"}], max_tokens=900,
                                  extra_body={"ignore_eos": True})
    assert e.value.status_code == 408 and e.value.response.headers.get("x-should-retry") == "false"
    assert _count(url, "chat", "408", SLOW) == before + 1


def test_a_refused_chat_field_is_counted_under_the_model_named(strict_gateway):
    url, _ = strict_gateway
    c = client(url)
    before = _count(url, "chat-stream", "400", TINY_GEN)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=TINY_GEN, messages=[{"role": "user", "content": "x"}], n=2, stream=True)
    assert _count(url, "chat-stream", "400", TINY_GEN) == before + 1


def test_embeddings_usage_counts_the_served_models_tokens(strict_gateway):
    """The stand-in reads 256 tokens at most; the served model (bge-base, 512) reads all of a 302-token text."""
    url, _ = strict_gateway
    c = client(url)
    assert c.embeddings.create(model=EMB, input="word " * 100).usage.prompt_tokens == 102
    assert c.embeddings.create(model=EMB, input="word " * 300).usage.prompt_tokens == 302
    both = c.embeddings.create(model=EMB, input=["word " * 300, "word " * 700], extra_body={"truncate_inputs": True})
    assert both.usage.prompt_tokens == 302 + 512  # a text cut at the served window is billed up to it


def test_chat_top_k_is_honoured_and_errors_name_the_field_sent(strict_gateway):
    url, _ = strict_gateway
    c = client(url)
    msgs = [{"role": "user", "content": "Hi"}]

    def text(**kw):
        out = c.chat.completions.create(model=TINY_GEN, messages=msgs, max_tokens=6, seed=5,
                                        extra_body={"ignore_eos": True, **kw.pop("extra", {})}, **kw)
        return out.choices[0].message.content

    assert text(temperature=1.0, extra={"top_k": 1}) == text(temperature=0)  # top-1 sampling is greedy
    with pytest.raises(openai.BadRequestError, match="repetition_penalty"):
        text(extra={"repetition_penalty": 1.3})
    with pytest.raises(openai.BadRequestError, match=re.escape("field 'max_completion_tokens' must be a positive")):
        c.chat.completions.create(model=TINY_GEN, messages=msgs, extra_body={"max_completion_tokens": 0})
    with pytest.raises(openai.APIStatusError, match="^Error code: 413 - input holds 2002 tokens"):
        c.embeddings.create(model=EMB, input="word " * 2000)


def test_an_empty_string_to_embed_is_refused_naming_input(strict_gateway):
    url, _ = strict_gateway
    with pytest.raises(openai.BadRequestError, match=r"field 'input' holds at \[1\] an empty string"):
        client(url).embeddings.create(model=EMB, input=["ok", ""])
