"""The official ``openai`` Python client against the gateway: chat (plain and streaming) and embeddings."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from kit.gateway import ALICE, BOB, EMB, GEN


def client(url: str, token: str = ALICE, account: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/client/v4/accounts/{account}/ai/v1", api_key=token, max_retries=0,
                         timeout=30)


def test_chat_completion(gateway):
    url, _ = gateway
    out = client(url).chat.completions.create(model=GEN, messages=[{"role": "user", "content": "Hi there"}],
                                              max_tokens=8, seed=5, extra_body={"ignore_eos": True})
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and isinstance(out.choices[0].message.content, str)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.total_tokens == out.usage.prompt_tokens + 8


def test_chat_completion_streaming_matches_plain(gateway):
    url, _ = gateway
    c = client(url)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Count"}]
    stream = c.chat.completions.create(model=GEN, messages=msgs, max_tokens=10, seed=9, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []
    plain = c.chat.completions.create(model=GEN, messages=msgs, max_tokens=10, seed=9,
                                      extra_body={"ignore_eos": True})
    assert plain.choices[0].message.content == text


def test_embeddings_base64_default_and_float(gateway):
    url, _ = gateway
    c = client(url)
    a = c.embeddings.create(model=EMB, input=["first sentence", "second one"])  # client asks for base64
    b = c.embeddings.create(model=EMB, input=["first sentence", "second one"], encoding_format="float")
    assert len(a.data) == 2 and len(a.data[0].embedding) == 768  # bge-base-en-v1.5's dimension
    assert np.allclose(a.data[1].embedding, b.data[1].embedding, atol=1e-6)
    assert a.usage.prompt_tokens > 0


def test_openai_errors_map_to_client_exceptions(gateway):
    url, _ = gateway
    with pytest.raises(openai.BadRequestError) as e:
        client(url).chat.completions.create(model="@cf/none/x", messages=[{"role": "user", "content": "x"}])
    assert "No such model" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client(url).embeddings.create(model=GEN, input="wrong task")
    with pytest.raises(openai.AuthenticationError):
        client(url, token="tok-wrong-0000000").chat.completions.create(
            model=GEN, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.PermissionDeniedError):
        client(url, token=BOB).chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}])
    models = client(url).models.list()
    assert GEN in {m.id for m in models.data}


def test_fields_that_would_change_the_answer_are_refused_not_ignored(gateway):
    """``stop`` and a shortened ``dimensions`` are 400s naming the field (ignoring them would hand back text past a
    stop sequence or vectors of another size); ``dimensions`` equal to the model's size is served; a list of more
    strings than allowed names OpenAI's field; one model is retrieved, an unknown one is a 404; a huge value is not
    echoed whole."""
    url, _ = gateway
    c = client(url)
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match="field 'stop'"):
        c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, stop=["\n"])
    assert c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, stop=None).object == "chat.completion"
    with pytest.raises(openai.BadRequestError, match="768-dimensional embeddings: field 'dimensions' must be 768"):
        c.embeddings.create(model=EMB, input="short", dimensions=256)
    with pytest.raises(openai.BadRequestError, match="field 'dimensions' must be a positive integer"):
        c.embeddings.create(model=EMB, input="short", dimensions=0)
    assert len(c.embeddings.create(model=EMB, input="short", dimensions=768).data[0].embedding) == 768
    with pytest.raises(openai.BadRequestError, match="field 'input' holds 101 strings; at most 100"):
        c.embeddings.create(model=EMB, input=["a"] * 101)
    assert c.models.retrieve(GEN).id == GEN
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        c.models.retrieve("@cf/none/x")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="@cf/" + "x" * 100_000, messages=msgs)
    assert len(str(e.value)) < 1000 and "message cut" in str(e.value)
