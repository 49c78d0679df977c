"""Workers AI REST over the live gateway: every task, SSE streaming, headers, model search, metrics, and errors."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
from kit.gateway import EMB, GEN, headers, png_bytes, run_url, wav_bytes

from dataplane.gateway.sse import DONE, parse_events


def test_every_task_answers_in_the_workers_ai_envelope(gateway):
    url, _ = gateway
    cases = [
        (GEN, {"prompt": "Hello", "max_tokens": 6, "seed": 1}, lambda r: r["usage"]["completion_tokens"] <= 6),
        (EMB, {"text": ["a cat", "a dog"]}, lambda r: r["shape"] == [2, 768] and len(r["data"][0]) == 768),
        ("@edgepop/bert-small-classify", {"text": "great"}, lambda r: {d["label"] for d in r} == {"NEGATIVE",
                                                                                                  "POSITIVE"}),
        ("@edgepop/bert-small-rerank", {"query": "q", "contexts": [{"text": "a"}, {"text": "b"}], "top_k": 1},
         lambda r: len(r["response"]) == 1 and 0 <= r["response"][0]["score"] <= 1),
        ("@cf/microsoft/resnet-50", {"image": list(png_bytes())}, lambda r: len(r) == 5),
        ("@cf/openai/whisper", {"audio": list(wav_bytes())}, lambda r: "text" in r and "word_count" in r),
    ]
    for model, body, check in cases:
        r = httpx.post(run_url(url, model), json=body, headers=headers(), timeout=30)
        assert r.status_code == 200, (model, r.text)
        doc = r.json()
        assert doc["success"] is True and doc["errors"] == [], model
        assert check(doc["result"]), (model, doc["result"])
        assert r.headers["x-edgepop-pop"] in {"FRA", "LHR", "IAD"}
        timing = r.headers["server-timing"]
        assert "infer;dur=" in timing and "gateway;dur=" in timing


def test_raw_binary_body_for_image_models(gateway):
    url, _ = gateway
    r = httpx.post(run_url(url, "@cf/microsoft/resnet-50"), content=png_bytes(),
                   headers=headers(**{"content-type": "image/png"}), timeout=30)
    assert r.status_code == 200 and len(r.json()["result"]) == 5


def test_embeddings_are_the_real_minilm_vectors(gateway):
    url, _ = gateway
    r = httpx.post(run_url(url, EMB), json={"text": ["A man is eating food.", "A man is eating a meal.",
                                                     "The stock market fell sharply."]}, headers=headers())
    v = np.array(r.json()["result"]["data"])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3  # paraphrases are much closer than unrelated sentences


def test_sse_stream_pieces_usage_and_done(gateway):
    url, _ = gateway
    with httpx.stream("POST", run_url(url, GEN), json={"prompt": "Tell me", "max_tokens": 12, "stream": True,
                                                       "ignore_eos": True, "seed": 3}, headers=headers()) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    events = parse_events(body)
    assert events[-1] == DONE
    frames = [json.loads(e) for e in events[:-1]]
    assert all("response" in f for f in frames)
    assert frames[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}
    streamed = "".join(f["response"] for f in frames)
    plain = httpx.post(run_url(url, GEN), json={"prompt": "Tell me", "max_tokens": 12, "ignore_eos": True,
                                                "seed": 3}, headers=headers()).json()["result"]["response"]
    assert streamed == plain  # same seed: the stream carries exactly the generated text


def test_models_search(gateway):
    url, _ = gateway
    base = f"{url}/client/v4/accounts/alice/ai/models/search"
    all_ = httpx.get(base, headers=headers()).json()["result"]
    assert {m["name"] for m in all_} >= {GEN, EMB}
    gen = httpx.get(base, params={"task": "Text Generation"}, headers=headers()).json()["result"]
    assert {m["name"] for m in gen} == {GEN, "@edgepop/gpt2-tiny"}
    llama = httpx.get(base, params={"search": "llama"}, headers=headers()).json()["result"]
    assert [m["name"] for m in llama] == [GEN]
    props = {p["property_id"]: p["value"] for p in llama[0]["properties"]}
    assert props["pops"] == "FRA,IAD,LHR" and props["stand_in"] == "gpt2-tiny"


BAD_BODIES = [
    (b"{not json", 5006), (b"", 5006), (b"[1, 2]", 5006), (b'"text"', 5006), (b"\xff\xfe\x00", 5006),
    (json.dumps({"max_tokens": 5}).encode(), 5006),  # neither prompt nor messages
    (json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}).encode(), 5006),
    (json.dumps({"prompt": 5}).encode(), 5006), (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 5006),
    (json.dumps({"prompt": "x", "max_tokens": "9"}).encode(), 5006),
    (json.dumps({"prompt": "x", "temperature": 99}).encode(), 5006),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 5006),
    (json.dumps({"messages": "hi"}).encode(), 5006), (json.dumps({"prompt": "x", "options": 3}).encode(), 5006),
    # Workers AI fields the engine does not implement: refused, not ignored (neutral values pass)
    (json.dumps({"prompt": "x", "frequency_penalty": 3}).encode(), 5006),
    (json.dumps({"prompt": "x", "presence_penalty": "x"}).encode(), 5006),
    (json.dumps({"prompt": "x", "repetition_penalty": -1}).encode(), 5006),
    (json.dumps({"prompt": "x", "raw": "yes"}).encode(), 5006),
    (b"[" * 50_000 + b"]" * 50_000, 5006),  # nesting deeper than the JSON parser's recursion limit
    (b"{" + b" " * 300_000 + b"}", 3006),  # over the 200 kB body limit of the test gateway
]


def test_neutral_penalties_raw_and_every_workers_ai_field_are_accepted(gateway):
    url, _ = gateway
    body = {"prompt": "x", "max_tokens": 2, "frequency_penalty": 0, "presence_penalty": 0.0,
            "repetition_penalty": 1, "raw": True}
    r = httpx.post(run_url(url, GEN), json=body, headers=headers())
    assert r.status_code == 200, r.text
    body = {**body, "temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 1, "stream": False, "ignore_eos": True,
            "lora": None, "tools": [], "functions": [], "response_format": {"type": "text"}, "stop": None,
            "options": {"rejectIfBusy": False}}
    r = httpx.post(run_url(url, GEN), json=body, headers=headers())
    assert r.status_code == 200 and r.json()["result"]["usage"]["completion_tokens"] == 2, r.text


@pytest.mark.parametrize("extra,needle", [({"max_token": 4}, "unknown field 'max_token' (text generation takes "
                                                            "prompt, messages, max_tokens,"),
                                          ({"stop": ["a"]}, "field 'stop': stop sequences are not supported"),
                                          ({"tools": [{"type": "function"}]}, "field 'tools' = [{'type': "),
                                          ({"response_format": {"type": "json_object"}}, "field 'response_format'")])
def test_an_unknown_or_unimplemented_generation_field_is_refused_not_dropped(gateway, extra, needle):
    """A misspelt max_tokens ran with the default 256 tokens; stop, tools and a JSON format were ignored."""
    url, _ = gateway
    r = httpx.post(run_url(url, GEN), json={"prompt": "hi", **extra}, headers=headers())
    assert r.status_code == 400 and needle in r.json()["errors"][0]["message"], r.text


@pytest.mark.parametrize("body,code", BAD_BODIES)
def test_bad_input_is_a_4xx_never_a_500(gateway, body, code):
    url, _ = gateway
    r = httpx.post(run_url(url, GEN), content=body, headers=headers(**{"content-type": "application/json"}))
    assert r.status_code == (413 if code == 3006 else 400), r.text
    doc = r.json()
    assert doc["success"] is False and doc["errors"][0]["code"] == code and doc["errors"][0]["message"]


def test_error_codes_for_model_size_and_schema(gateway):
    url, _ = gateway
    r = httpx.post(run_url(url, "@cf/no/such-model"), json={"prompt": "x"}, headers=headers())
    assert (r.status_code, r.json()["errors"][0]["code"]) == (400, 5007)
    # A batch poll through an unknown model's URL (a restart's unserved model answers its queued job's status) with
    # a body nested past the parser's depth or an id holding a lone surrogate was a 500 (RecursionError,
    # UnicodeEncodeError in SQLite): it is the unknown model's 5007, as without ?queueRequest.
    for body in (b"[" * 100_000, b'{"request_id": "\\ud800"}'):
        r = httpx.post(run_url(url, "@cf/no/such-model") + "?queueRequest=true", content=body,
                       headers=headers(**{"content-type": "application/json"}))
        assert (r.status_code, r.json()["errors"][0]["code"]) == (400, 5007), r.text
    r = httpx.post(run_url(url, GEN), json={"prompt": "x" * 600}, headers=headers())  # stand-in context is 512
    assert (r.status_code, r.json()["errors"][0]["code"]) == (413, 3006)
    r = httpx.post(run_url(url, EMB), json={"text": [1, 2]}, headers=headers())
    assert r.status_code == 400
    r = httpx.post(run_url(url, "@cf/microsoft/resnet-50"), content=b"not an image",
                   headers=headers(**{"content-type": "application/octet-stream"}))
    assert (r.status_code, r.json()["errors"][0]["code"]) == (400, 5006)
    r = httpx.post(run_url(url, GEN), json={"prompt": "x"},
                   headers=headers(**{"x-edgepop-client-location": "91,0"}))
    assert r.status_code == 400 and "x-edgepop-client-location" in r.json()["errors"][0]["message"]
    r = httpx.post(run_url(url, GEN), json={"prompt": "x"}, headers=headers(**{"x-edgepop-client-city": "Xyzzyville"}))
    assert r.status_code == 400
    # ... and the gateway still serves afterwards
    assert httpx.post(run_url(url, GEN), json={"prompt": "ok", "max_tokens": 2}, headers=headers()).status_code == 200


def test_metrics_expose_requests_memory_and_control_plane(gateway):
    url, _ = gateway
    httpx.post(run_url(url, GEN), json={"prompt": "m", "max_tokens": 2}, headers=headers())
    for path in ("/metrics", "/edgepop/deployment"):  # traffic and placement are not for anyone on the port
        assert httpx.get(f"{url}{path}").status_code == 401
    assert httpx.get(f"{url}/edgepop/deployment", headers=headers()).json()["placement"]
    text = httpx.get(f"{url}/metrics", headers=headers()).text
    assert 'edgepop_requests_total{endpoint="run",model="@cf/meta/llama-3.2-1b-instruct"' in text
    assert "process_resident_memory_bytes" in text
    assert 'edgepop_cp_requests{state="running"}' in text
    assert 'edgepop_engine_outstanding{engine="gpt2-tiny@' in text and "edgepop_shed_total" in text
    assert 'edgepop_http_responses_total{route="/client/v4/accounts/{account_id}/ai/run/{model:path}",status="400"}' \
        in text


def test_a_streamed_wav_an_unknown_model_and_embedding_fields_workers_ai_checks(gateway):
    """A WAV whose header gives 0xFFFFFFFF frames (ffmpeg writing to a pipe) is read for the frames it holds (it
    was refused as longer than 30 s); an image sent to an unknown model is a 5007, not 'not valid JSON'; an
    empty text and a 'cls' pooling are refused (these encoders pool by the mean: the vector was the same)."""
    url, _ = gateway
    wav = bytearray(wav_bytes(2.0))
    wav[4:8] = wav[40:44] = b"\xff\xff\xff\xff"
    r = httpx.post(run_url(url, "@cf/openai/whisper"), content=bytes(wav),
                   headers=headers(**{"content-type": "audio/wav"}), timeout=60)
    assert r.status_code == 200 and "text" in r.json()["result"], r.text
    r = httpx.post(run_url(url, "@cf/microsoft/resnet-5"), content=png_bytes(),
                   headers=headers(**{"content-type": "image/png"}), timeout=30)
    assert (r.status_code, r.json()["errors"][0]["code"]) == (400, 5007), r.text
    for body, needle in (({"text": ""}, "field 'text' is empty"), ({"text": "a", "pooling": "cls"}, "field 'pooling'")):
        r = httpx.post(run_url(url, EMB), json=body, headers=headers(), timeout=30)
        assert r.status_code == 400 and needle in r.json()["errors"][0]["message"], r.text
    assert httpx.post(run_url(url, EMB), json={"text": "a", "pooling": "mean"}, headers=headers(),
                      timeout=30).status_code == 200


def test_malformed_binaries_are_400s(gateway):
    url, _ = gateway
    from PIL import Image

    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    Image.new("L", (7_000, 7_000)).save(buf, "PNG")  # 49 Mpixel decompression bomb, ~50 kB compressed
    bomb = buf.getvalue()
    wav = wav_bytes()
    cases = [("@cf/microsoft/resnet-50", rng.bytes(5000), 400), ("@cf/microsoft/resnet-50", png_bytes()[:60], 400),
             ("@cf/microsoft/resnet-50", bomb, 413), ("@cf/openai/whisper", rng.bytes(5000), 400),
             ("@cf/openai/whisper", wav[:44], 400), ("@cf/openai/whisper", wav[:22] + b"\x00\x00" + wav[24:], 400),
             ("@cf/openai/whisper", wav_bytes(40.0, rate=2000), 400),  # longer than the model's 30 s
             ("@cf/openai/whisper", wav[:16] + (10**6).to_bytes(4, "little") + wav[20:], 400)]  # fmt runs past the end
    for model, data, status in cases:
        r = httpx.post(run_url(url, model), content=data, headers=headers(**{"content-type": "application/octet-stream"}),
                       timeout=30)
        assert r.status_code == status, (model, len(data), r.text)
        assert "Error" not in r.json()["errors"][0]["message"], r.text  # said in words, not an exception's name


def test_client_mistakes_found_by_an_audit_are_400s(gateway):
    """An integer of thousands of digits, a batch external_reference that is not a string, a chat ``stream`` of
    null (OpenAI's default); a reranker request with more text than the event loop tokenizes itself (sent to a
    worker thread) answers as any other."""
    url, _ = gateway
    body = b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
    r = httpx.post(run_url(url, GEN), content=body, headers=headers(**{"content-type": "application/json"}))
    message = r.json()["errors"][0]["message"]
    assert r.status_code == 400 and "not valid JSON (an integer of more than 4,300 digits)" in message, message
    assert "set_int_max_str_digits" not in message  # Python's advice to itself, not to the client
    for ref in ({"a": 1}, [1], 2**70):
        r = httpx.post(run_url(url, GEN) + "?queueRequest=true",
                       json={"requests": [{"prompt": "hi", "external_reference": ref}]}, headers=headers())
        assert r.status_code == 400 and "external_reference must be a string" in r.json()["errors"][0]["message"]
    chat = f"{url}/client/v4/accounts/alice/ai/v1/chat/completions"
    r = httpx.post(chat, json={"model": GEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                               "stream": None}, headers=headers(), timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = httpx.delete(chat, headers=headers())  # a client's mistake: the OpenAI shape says so, and what is allowed
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error" and "POST" in r.headers["allow"]
    assert httpx.head(f"{url}/healthz").status_code == 200
    r = httpx.post(run_url(url, "@edgepop/bert-small-rerank"), headers=headers(), timeout=120,
                   json={"query": "q" * 60_000, "contexts": [{"text": "c" * 20_000}] * 5})  # (the test's cap: 200 kB)
    assert r.status_code == 200 and len(r.json()["result"]["response"]) == 5


def test_an_unexpected_error_is_one_counted_logged_500(gateway, monkeypatch, caplog):
    """A route that raises something unforeseen answers 500 (3043) in the route's own error shape, is counted in
    /metrics under its route like any other response, is logged once with its traceback, and the server goes on."""
    url, app = gateway

    def broken():
        raise RuntimeError("an error nobody foresaw")

    monkeypatch.setattr(app.state.gateway.backend, "describe", broken)
    route = 'edgepop_http_responses_total{route="/edgepop/deployment",status="500"}'

    def count() -> float:
        text = httpx.get(f"{url}/metrics", headers=headers()).text
        return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(route)), 0.0)

    before = count()
    with caplog.at_level("ERROR"):
        r = httpx.get(f"{url}/edgepop/deployment", headers=headers())
    assert r.status_code == 500 and r.json()["errors"][0]["code"] == 3043, r.text
    assert "RuntimeError" in r.json()["errors"][0]["message"]
    assert count() == before + 1
    logged = [rec for rec in caplog.records if rec.levelname == "ERROR" and rec.exc_info]
    assert len(logged) == 1 and "an error nobody foresaw" in str(logged[0].exc_info[1])
    monkeypatch.undo()
    assert httpx.get(f"{url}/edgepop/deployment", headers=headers()).status_code == 200


def test_a_lone_surrogate_escape_is_a_400_naming_its_field(gateway, caplog):
    """JSON can spell a lone UTF-16 surrogate (``\\ud800``), which no tokenizer can read: a 400 naming the field,
    on both APIs, with nothing logged; a surrogate pair (an emoji sent escaped) is text like any other."""
    url, _ = gateway
    chat = f"{url}/client/v4/accounts/alice/ai/v1/chat/completions"
    raw = {"content-type": "application/json"}
    with caplog.at_level("WARNING"):
        r = httpx.post(chat, content=b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800"}]}'
                       % GEN.encode(), headers=headers(**raw))
        assert r.status_code == 400 and "field 'messages[0].content' holds a lone UTF-16 surrogate" in r.text, r.text
        r = httpx.post(run_url(url, EMB), content=b'{"text": ["ok", "\\udc00"]}', headers=headers(**raw))
        assert r.status_code == 400 and "field 'text[1]' holds a lone" in r.json()["errors"][0]["message"]
    assert not [rec for rec in caplog.records if rec.levelname in ("WARNING", "ERROR")]
    r = httpx.post(run_url(url, EMB), content=b'{"text": "smile \\ud83d\\ude00"}', headers=headers(**raw), timeout=60)
    assert r.status_code == 200 and r.json()["result"]["shape"][0] == 1


def test_a_boolean_option_that_is_not_a_boolean_is_a_400_naming_it(gateway):
    """``rejectIfBusy`` of 1 or "maybe" was read as false (the request queued where its client asked to be refused);
    ``queueRequest=banana`` said only that ``requests`` is an unknown field. A chat's ``max_tokens`` of the wrong type
    beside ``max_completion_tokens`` was ignored. Each is a 400 naming the field and value; true/false words pass."""
    url, _ = gateway
    for options, query in (({"rejectIfBusy": 1}, ""), ({"rejectIfBusy": "maybe"}, ""), ({}, "?rejectIfBusy=maybe"),
                           ({}, "?queueRequest=banana")):
        r = httpx.post(run_url(url, GEN) + query, json={"prompt": "hi", "max_tokens": 1, "options": options},
                       headers=headers(), timeout=30)
        message = r.json()["errors"][0]["message"]
        assert r.status_code == 400 and "must be true or false" in message, (options, query, message)
        assert ("rejectIfBusy" in message or "queueRequest" in message) and ("maybe" in message or "banana" in message
                                                                            or "1" in message), message
    for options, query in (({"rejectIfBusy": "false"}, "?rejectIfBusy=0"), ({"rejectIfBusy": False}, "?queueRequest=no")):
        r = httpx.post(run_url(url, GEN) + query, json={"prompt": "hi", "max_tokens": 1, "options": options},
                       headers=headers(), timeout=60)
        assert r.status_code == 200, r.text
    chat = f"{url}/client/v4/accounts/alice/ai/v1/chat/completions"
    r = httpx.post(chat, json={"model": GEN, "messages": [{"role": "user", "content": "hi"}],
                               "max_completion_tokens": 2, "max_tokens": "a"}, headers=headers(), timeout=30)
    assert r.status_code == 400 and "field 'max_tokens' has the wrong type (str)" in r.text, r.text


def test_an_empty_prompt_is_a_400_naming_it(gateway):
    """Workers AI's schema gives prompt at least one character: an empty one ran, generating from nothing (plain
    and streamed). An empty chat message list was refused already, on both APIs."""
    url, _ = gateway
    body = {"prompt": "", "max_tokens": 3}
    for b in (body, {**body, "stream": True}):
        r = httpx.post(run_url(url, GEN), json=b, headers=headers(), timeout=60)
        assert r.status_code == 400 and r.json()["errors"][0]["code"] == 5006, r.text
        assert "field 'prompt' is empty" in r.json()["errors"][0]["message"], r.text
    r = httpx.post(run_url(url, GEN), json={"messages": [], "max_tokens": 3}, headers=headers(), timeout=60)
    assert r.status_code == 400 and "field 'messages'" in r.json()["errors"][0]["message"], r.text
    r = httpx.post(f"{url}/client/v4/accounts/alice/ai/v1/chat/completions", headers=headers(), timeout=60,
                   json={"model": GEN, "messages": [], "max_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
