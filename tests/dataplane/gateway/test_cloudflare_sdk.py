"""The official ``cloudflare`` Python SDK (v4+) against the gateway, used as a user would: ``client.ai.run`` for
each task, streaming through ``with_streaming_response``, ``client.ai.models.list`` with auto-pagination, and the
SDK's exception classes carrying the Workers AI error envelope."""

from __future__ import annotations

import asyncio
import json
import time

import cloudflare
import pytest
from cloudflare import AsyncCloudflare, Cloudflare
from kit.gateway import ALICE, BOB, EMB, GEN, MODELS, png_bytes, wav_bytes


def client(url: str, token: str = ALICE) -> Cloudflare:
    return Cloudflare(api_token=token, base_url=f"{url}/client/v4", max_retries=0, timeout=30)


def test_sdk_names_the_resource_client_ai():
    """v4+ puts Workers AI at ``client.ai`` (``client.workers.ai`` is gone); the docs say so."""
    c = Cloudflare(api_token="x", base_url="http://127.0.0.1:1/client/v4")
    assert callable(c.ai.run) and not hasattr(c.workers, "ai")


def test_text_generation_prompt_and_messages(gateway):
    url, _ = gateway
    c = client(url)
    out = c.ai.run(GEN, account_id="alice", prompt="Hi there", max_tokens=6, seed=3, ignore_eos=True)
    assert isinstance(out["response"], str)  # the SDK unwraps ``result``
    assert out["usage"]["completion_tokens"] == 6
    out = c.ai.run(GEN, account_id="alice", messages=[{"role": "system", "content": "be brief"},
                                                       {"role": "user", "content": "Hi"}], max_tokens=4,
                   ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 4
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 4


def test_streaming_through_with_streaming_response(gateway):
    """``ai.run(stream=True)`` cannot parse SSE in the SDK (it hands the text to its ``result`` unwrapper, which
    raises), against Cloudflare too; ``with_streaming_response`` hands back the event lines, which match the plain
    answer."""
    url, _ = gateway
    c = client(url)
    kw = {"account_id": "alice", "prompt": "Count", "max_tokens": 8, "seed": 4, "ignore_eos": True}
    with c.ai.with_streaming_response.run(GEN, stream=True, **kw) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[-1]["usage"]["completion_tokens"] == 8
    assert "".join(e["response"] for e in events) == c.ai.run(GEN, **kw)["response"]
    with pytest.raises(AttributeError):  # the SDK's own limitation, documented in docs/gateway.md
        c.ai.run(GEN, stream=True, **kw)


def test_embeddings_and_classification(gateway):
    url, _ = gateway
    c = client(url)
    out = c.ai.run(EMB, account_id="alice", text=["first sentence", "second one"])
    assert out["shape"] == [2, 768] and len(out["data"]) == 2 and len(out["data"][1]) == 768
    assert c.ai.run(EMB, account_id="alice", text="one")["shape"] == [1, 768]
    # A list answer is parsed into the SDK's models (an object answer stays a dict)
    labels = c.ai.run("@edgepop/bert-small-classify", account_id="alice", text="great film")
    assert isinstance(labels[0].label, str) and 0 <= labels[0].score <= 1


def test_image_and_speech_as_byte_lists(gateway):
    """The SDK types ``image`` and ``audio`` as lists of byte values, as Workers AI's JSON form takes them."""
    url, _ = gateway
    c = client(url)
    top = c.ai.run("@cf/microsoft/resnet-50", account_id="alice", image=list(png_bytes()))
    assert len(top) == 5 and isinstance(top[0].label, str) and 0 <= top[0].score <= 1
    speech = c.ai.run("@cf/openai/whisper", account_id="alice", audio=list(wav_bytes()))
    assert isinstance(speech["text"], str) and "word_count" in speech


def test_fields_the_sdk_lacks_go_through_extra_body_and_extra_query(gateway):
    """Reranking inputs and the async batch API have no SDK parameters: ``extra_body`` / ``extra_query`` carry
    them (``run`` needs only ``account_id``), and the unwrapped answers are the gateway's ``result``."""
    url, _ = gateway
    c = client(url)
    ranked = c.ai.run("@edgepop/bert-small-rerank", account_id="alice",
                      extra_body={"query": "cats", "contexts": [{"text": "a cat"}, {"text": "a car"}]})
    assert sorted(r["id"] for r in ranked["response"]) == [0, 1]
    job = c.ai.run(GEN, account_id="alice", extra_query={"queueRequest": "true"},
                   extra_body={"requests": [{"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}]})
    assert job["status"] == "queued"
    for _ in range(600):  # hang guard only
        polled = c.ai.run(GEN, account_id="alice", extra_body={"request_id": job["request_id"]})
        if polled["status"] == "done":
            break
        time.sleep(0.05)
    assert polled["responses"][0]["result"]["usage"]["completion_tokens"] == 3


def test_global_api_key_is_refused_with_the_envelope(gateway):
    """The gateway takes API tokens only (as Workers AI's REST docs use): the SDK's ``api_key``/``api_email``
    (X-Auth-Key) is a 401 whose message names the header wanted."""
    url, _ = gateway
    c = Cloudflare(api_key="k" * 37, api_email="a@example.com", base_url=f"{url}/client/v4", max_retries=0)
    with pytest.raises(cloudflare.AuthenticationError) as e:
        c.ai.run(GEN, account_id="alice", prompt="x")
    assert e.value.errors[0].code == 10000 and "Bearer" in e.value.errors[0].message


def test_models_search_auto_paginates(gateway):
    url, _ = gateway
    c = client(url)
    first = c.ai.models.list(account_id="alice", per_page=2)
    assert first.result_info.page == 1 and first.result_info.per_page == 2 and len(first.result) == 2
    names = [m["name"] for m in c.ai.models.list(account_id="alice", per_page=2)]  # every page, then stops
    assert sorted(names) == sorted(MODELS)
    gen = [m["name"] for m in c.ai.models.list(account_id="alice", task="Text Generation", per_page=1)]
    assert GEN in gen and EMB not in gen


def test_models_search_filters_by_author_and_source(gateway):
    """``author`` and ``source`` are SDK filters: ignoring them would list every model as the author's."""
    url, _ = gateway
    c = client(url)
    meta = [m["name"] for m in c.ai.models.list(account_id="alice", author="meta")]
    assert meta == [GEN]
    assert [m["name"] for m in c.ai.models.list(account_id="alice", author="edgepop", task="text-generation")] \
        == ["@edgepop/gpt2-tiny"]
    assert len(list(c.ai.models.list(account_id="alice", source=1))) == len(MODELS)
    assert list(c.ai.models.list(account_id="alice", source=2)) == []


def test_tasks_and_authors_lists(gateway):
    """``client.ai.tasks.list`` and ``client.ai.authors.list``: the tasks and authors of the served models."""
    url, _ = gateway
    c = client(url)
    tasks = {t["id"]: t for t in c.ai.tasks.list(account_id="alice")}
    assert {"text-generation", "text-embeddings", "image-classification", "automatic-speech-recognition"} <= set(tasks)
    assert tasks["text-generation"]["name"] == "Text Generation"
    # a task's name is what the models list's ``task`` filter takes
    for t in tasks.values():
        assert list(c.ai.models.list(account_id="alice", task=t["name"]))
    authors = {a["name"] for a in c.ai.authors.list(account_id="alice")}
    assert {"meta", "baai", "openai", "microsoft", "edgepop"} == authors
    for a in authors:
        assert list(c.ai.models.list(account_id="alice", author=a))
    with pytest.raises(cloudflare.PermissionDeniedError):
        client(url, token=BOB).ai.tasks.list(account_id="alice")


def test_errors_raise_sdk_exceptions_with_the_envelope(gateway):
    url, _ = gateway
    c = client(url)
    with pytest.raises(cloudflare.BadRequestError) as e:
        c.ai.run("@cf/none/x", account_id="alice", prompt="x")
    assert e.value.status_code == 400 and e.value.errors[0].code == 5007 and "No such model" in e.value.errors[0].message
    with pytest.raises(cloudflare.AuthenticationError) as e:
        client(url, token="tok-wrong-0000000").ai.run(GEN, account_id="alice", prompt="x")
    assert e.value.status_code == 401 and e.value.errors[0].code == 10000
    with pytest.raises(cloudflare.PermissionDeniedError) as e:
        client(url, token=BOB).ai.run(GEN, account_id="alice", prompt="x")
    assert e.value.status_code == 403 and e.value.errors[0].code == 10000
    # Over the context window: 413/3006. The SDK has no class of its own for 413: its base APIStatusError.
    with pytest.raises(cloudflare.APIStatusError) as e:
        c.ai.run(GEN, account_id="alice", prompt="word " * 3000)
    assert e.value.status_code == 413 and e.value.errors[0].code == 3006 and "context" in e.value.errors[0].message
    with pytest.raises(cloudflare.BadRequestError) as e:  # prompt plus max_tokens past the window
        c.ai.run(GEN, account_id="alice", prompt="word " * 100, max_tokens=5000)
    assert e.value.errors[0].code == 5006 and "maximum context length" in e.value.errors[0].message
    with pytest.raises(cloudflare.NotFoundError) as e:  # a path the gateway does not serve: still the envelope
        c.get("/accounts/alice/ai/no-such-route", cast_to=object)
    assert e.value.status_code == 404 and e.value.errors


def test_async_client(gateway):
    url, _ = gateway

    async def main():
        async with AsyncCloudflare(api_token=ALICE, base_url=f"{url}/client/v4", max_retries=0, timeout=30) as c:
            return await c.ai.run(GEN, account_id="alice", prompt="Hi", max_tokens=3, ignore_eos=True)

    assert asyncio.run(main())["usage"]["completion_tokens"] == 3
