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
    with pytest.raises(openai.NotFoundError) as e:  # OpenAI's 404 model_not_found (Workers AI's 400/5007)
        client(url).chat.completions.create(model="@cf/none/x", messages=[{"role": "user", "content": "x"}])
    assert "No such model" in str(e.value) and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client(url).embeddings.create(model="@cf/none/x", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        client(url).chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}], n=2)
    assert e.value.code == "5006"  # OpenAI's code is a string: the Workers AI code as text where it has no name
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
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="@cf/" + "x" * 100_000, messages=msgs)
    assert len(str(e.value)) < 1000 and "message cut" in str(e.value)
    for field, value in (("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
                         ("response_format", {"type": "json_object"}), ("logprobs", True), ("top_logprobs", 3),
                         ("logit_bias", {"50256": -100}), ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
                         ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}),
                         ("web_search_options", {"search_context_size": "high"})):
        with pytest.raises(openai.BadRequestError, match=f"field '{field}'"):
            c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, **{field: value})
    # what asks for nothing beyond plain text is served: zero penalties, no tools, a text format
    ok = c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, presence_penalty=0, frequency_penalty=0,
                                   tool_choice="none", response_format={"type": "text"}, logprobs=False,
                                   modalities=["text"])
    assert ok.object == "chat.completion"


def test_stream_options_and_encoding_format_are_checked_not_read_loosely(gateway):
    """``include_usage: "false"`` is no boolean (it was read as true and the usage chunk sent); ``stream_options``
    without streaming is refused, as OpenAI does; an empty or mistyped ``encoding_format`` is no 'float'."""
    url, _ = gateway
    c = client(url)
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match="field 'stream_options.include_usage' must be true or false"):
        c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, stream=True,
                                  stream_options={"include_usage": "false"})
    with pytest.raises(openai.BadRequestError, match="'stream_options' is only allowed when 'stream' is true"):
        c.chat.completions.create(model=GEN, messages=msgs, max_tokens=2, stream_options={"include_usage": True})
    for fmt in ("", 0, False, []):
        with pytest.raises(openai.BadRequestError, match="field 'encoding_format' must be 'float' or 'base64'") as e:
            c.embeddings.create(model=EMB, input="short", extra_body={"encoding_format": fmt})
        assert e.value.param == "encoding_format"  # OpenAI's error body names the field it refused
    assert len(c.embeddings.create(model=EMB, input="short", extra_body={"encoding_format": None}).data) == 1


def test_a_null_field_is_a_field_left_out(gateway):
    """``max_completion_tokens: null`` beside ``max_tokens`` leaves ``max_tokens`` in force (a null read as a value
    handed back the model's whole default output)."""
    url, _ = gateway
    out = client(url).chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                              extra_body={"max_completion_tokens": None, "ignore_eos": True})
    assert out.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="field 'max_completion_tokens' has the wrong type"):
        client(url).chat.completions.create(model=GEN, messages=[{"role": "user", "content": "x"}],
                                            extra_body={"max_completion_tokens": "a"})


def test_embedding_a_text_over_the_window_is_refused_unless_truncation_is_asked_for(gateway):
    """Workers AI's ``truncate_inputs``: without it a text longer than the served model's window (512 tokens) is a
    413 naming the text (its embedding would be of another, shorter text); with it the text is cut and embedded.
    A text within the served window but beyond the stand-in's (256) is served: the stand-in's limit is the
    emulation's, not the client's."""
    url, _ = gateway
    c = client(url)
    long_text = "word " * 2000
    with pytest.raises(openai.APIStatusError, match=r"input\[1\] holds 2002 tokens, more than .*'s window of 512") as e:
        c.embeddings.create(model=EMB, input=["short", long_text])
    assert e.value.status_code == 413
    assert len(c.embeddings.create(model=EMB, input="word " * 400).data) == 1
    cut = c.embeddings.create(model=EMB, input=["short", long_text], extra_body={"truncate_inputs": True})
    assert len(cut.data) == 2 and len(cut.data[1].embedding) == 768
