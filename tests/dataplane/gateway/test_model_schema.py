"""``GET /ai/models/schema?model=X`` (the ``cloudflare`` SDK's ``ai.models.schema.get``) against a live gateway: a
JSON Schema (draft 2020-12) of each served model's ``/ai/run`` body and result, checked against what ``/ai/run``
does: bodies the schema takes are answered 200 and their results match the output schema; bodies it refuses
(wrong types, values out of range, missing fields, fields the gateway does not know) are 400 on ``/ai/run`` too."""

from __future__ import annotations

import json

import cloudflare
import httpx
import jsonschema
import pytest
from kit.gateway import ALICE, BOB, EMB, GEN, MODELS, headers, png_bytes, run_url, wav_bytes

from dataplane.task_inputs import GENERATION_FIELDS, MAX_BATCH_TEXTS

CLS, RERANK, IMAGE, SPEECH = ("@edgepop/bert-small-classify", "@edgepop/bert-small-rerank", "@cf/microsoft/resnet-50",
                              "@cf/openai/whisper")
DRAFT = "https://json-schema.org/draft/2020-12/schema"  # the draft the schemas declare
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi"}]
# model -> (bodies /ai/run answers 200, bodies it refuses with 400); the valid ones are what the other tests send
CASES = {
    GEN: ([{"prompt": "Hi there", "max_tokens": 6, "seed": 3, "ignore_eos": True},
           {"messages": MSGS, "max_tokens": 4, "ignore_eos": True},
           {"prompt": "x", "max_tokens": 2, "temperature": 0, "top_k": 5, "top_p": 0.9, "frequency_penalty": 0,
            "repetition_penalty": 1, "response_format": {"type": "text"}, "tools": [], "raw": True,
            "options": {"rejectIfBusy": "False"}},
           {"prompt": "x", "max_tokens": 2, "lora": None, "stop": None, "not_a_field": None, "messages": None},
           {"prompt": "x", "max_tokens": 511},  # the window (512, the stand-in's) less a one-token prompt
           {"prompt": "Count", "max_tokens": 8, "seed": 4, "ignore_eos": True, "stream": True}],
          [{}, {"prompt": 5}, {"prompt": ""}, {"prompt": "a", "messages": MSGS}, {"messages": []},
           {"messages": [{"role": "robot", "content": "hi"}]}, {"messages": [{"role": "user"}]},
           {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": 512}, {"prompt": "x", "max_tokens": "5"},
           {"prompt": "x", "temperature": 5.5}, {"prompt": "x", "temperature": -1}, {"prompt": "x", "top_p": 0},
           {"prompt": "x", "top_p": 1.5}, {"prompt": "x", "top_k": 0}, {"prompt": "x", "seed": -1},
           {"prompt": "x", "stream": "yes"}, {"prompt": "x", "raw": 1}, {"prompt": "x", "max_token": 5},
           {"prompt": "x", "not_a_field": 1},
           {"prompt": "x", "frequency_penalty": 0.5}, {"prompt": "x", "repetition_penalty": 1.2},
           {"prompt": "x", "stop": ["\n"]}, {"prompt": "x", "tools": [{"name": "f"}]},
           {"prompt": "x", "response_format": {"type": "json_object"}}, {"prompt": "x", "lora": "nope"},
           {"prompt": "x", "options": 5}, {"prompt": "x", "options": {"rejectIfBusy": "maybe"}}]),
    EMB: ([{"text": "one"}, {"text": ["first sentence", "second one"]},
           {"text": "a", "truncate_inputs": True, "pooling": "mean"}],
          [{}, {"text": [1, 2]}, {"text": ""}, {"text": []}, {"text": ["x", ""]},
           {"text": ["x"] * (MAX_BATCH_TEXTS + 1)},
           {"text": "a", "pooling": "cls"}, {"text": "a", "truncate_inputs": "yes"}, {"text": "a", "lora": "x"}]),
    CLS: ([{"text": "great film"}], [{}, {"text": 5}, {"text": "a", "options": {"rejectIfBusy": 2}}]),
    RERANK: ([{"query": "q", "contexts": [{"text": "a"}, {"text": "b"}], "top_k": 1},
              {"query": "q", "contexts": [{"text": "a"}]}],
             [{"contexts": [{"text": "a"}]}, {"query": "q", "contexts": []}, {"query": "q", "contexts": ["a"]},
              {"query": "q", "contexts": [{"text": "a"}], "top_k": 0}, {"query": 1, "contexts": [{"text": "a"}]}]),
    IMAGE: ([{"image": list(png_bytes())}], [{}, {"image": []}, {"image": [300]}, {"image": "abc"}]),
    SPEECH: ([{"audio": list(wav_bytes())}], [{}, {"audio": [-1]}, {"audio": True}]),
}


def client(url: str, token: str = ALICE) -> cloudflare.Cloudflare:
    return cloudflare.Cloudflare(api_token=token, base_url=f"{url}/client/v4", max_retries=0, timeout=30)


def test_every_task_and_generation_field_has_a_schema():
    """A task added to the table, or a text-generation field added to the validator, without a schema fails here
    (the generation schema is built by reading GENERATION_FIELDS, so a field without one raises)."""
    from dataplane.gateway import schemas
    from dataplane.tasks import TASKS

    assert set(schemas.BY_TASK) == set(TASKS)
    inp, _ = schemas._generation(512, 32768, {})
    assert set(inp["properties"]) == {*GENERATION_FIELDS, "stop", "options"}


def schema_of(url: str, model: str) -> dict:
    r = httpx.get(f"{url}/client/v4/accounts/alice/ai/models/schema", params={"model": model}, headers=headers())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["errors"] == [] and set(body["result"]) == {"input", "output"}
    return body["result"]


def _def(schema: dict, name: str) -> jsonschema.Draft202012Validator:
    """A validator of ``schema``'s ``$defs/name`` (its references resolved within ``schema``)."""
    return jsonschema.Draft202012Validator({"$schema": DRAFT, "$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})


def _events(r: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]


def test_sdk_gets_a_valid_schema_for_every_served_model(gateway):
    url, _ = gateway
    c = client(url)
    for model in MODELS:
        got = c.ai.models.schema.get(account_id="alice", model=model)
        assert got.input.type == "object" and got.input.description, model  # the SDK's typed fields
        for side in ("input", "output"):
            schema = getattr(got, side).to_dict()
            assert schema["$schema"] == DRAFT
            jsonschema.Draft202012Validator.check_schema(schema)  # a schema, by the draft's metaschema
    props = schema_of(url, GEN)["input"]["properties"]
    assert set(GENERATION_FIELDS) <= set(props) and props["max_tokens"]["anyOf"][0]["maximum"] == 511
    assert "lora" in props and "stream" in props and "messages" in props


@pytest.mark.parametrize("model", list(CASES))
def test_schema_and_run_agree(gateway, model):
    """Every body the schema takes is answered 200 and its result validates against the output schema; every body
    the schema refuses is a 400 on /ai/run."""
    url, _ = gateway
    schema = schema_of(url, model)
    inp = jsonschema.Draft202012Validator(schema["input"])
    out = jsonschema.Draft202012Validator(schema["output"])
    good, bad = CASES[model]
    for body in good:
        assert inp.is_valid(body), (model, body, [e.message for e in inp.iter_errors(body)])
        r = httpx.post(run_url(url, model), json=body, headers=headers(), timeout=60)
        assert r.status_code == 200, (body, r.text)
        if body.get("stream"):  # each data line's JSON is a $defs/stream_event; the body itself is the string form
            assert not out.is_valid(r.text) and _def(schema["output"], "stream").is_valid(r.text)
            assert schema["output"]["$defs"]["stream"]["contentSchema"] == {"$ref": "#/$defs/stream_event"}
            data = _events(r)
            assert data[-1] == "[DONE]" and len(data) > 2
            event = _def(schema["output"], "stream_event")
            for d in data[:-1]:
                assert event.is_valid(json.loads(d)), d
            continue
        result = r.json()["result"]
        assert out.is_valid(result), (body, [e.message for e in out.iter_errors(result)])
    for body in bad:
        assert not inp.is_valid(body), (model, "the schema takes", body)
        r = httpx.post(run_url(url, model), json=body, headers=headers(), timeout=60)
        assert (r.status_code, r.json()["errors"][0]["code"]) == (400, 5006), (model, body, r.text)


def test_output_schema_refuses_what_the_gateway_never_answers(gateway):
    """The output schemas are not vacuous: a result of another shape fails them."""
    url, _ = gateway
    gen = jsonschema.Draft202012Validator(schema_of(url, GEN)["output"])
    assert not gen.is_valid({"response": "x"}) and not gen.is_valid({"response": 1, "usage": {}})
    emb = jsonschema.Draft202012Validator(schema_of(url, EMB)["output"])
    assert not emb.is_valid({"shape": [1, 384], "data": [[0.0] * 384]})  # the stand-in's size, not the served one


def test_missing_or_unknown_model_and_auth(gateway):
    url, _ = gateway
    path = f"{url}/client/v4/accounts/alice/ai/models/schema"
    r = httpx.get(path, headers=headers())
    assert r.status_code == 400 and r.json()["success"] is False
    assert r.json()["errors"][0]["code"] == 5006 and "'model'" in r.json()["errors"][0]["message"]
    # an unknown model: the error /ai/run gives it
    ran = httpx.post(run_url(url, "@cf/no/such-model"), json={"prompt": "x"}, headers=headers())
    r = httpx.get(path, params={"model": "@cf/no/such-model"}, headers=headers())
    assert (r.status_code, r.json()["errors"][0]["code"]) == (ran.status_code, ran.json()["errors"][0]["code"]) \
        == (400, 5007)
    with pytest.raises(cloudflare.BadRequestError) as e:
        client(url).ai.models.schema.get(account_id="alice", model="@cf/no/such-model")
    assert e.value.errors[0].code == 5007
    assert httpx.get(path, params={"model": GEN}).status_code == 401
    with pytest.raises(cloudflare.PermissionDeniedError):
        client(url, token=BOB).ai.models.schema.get(account_id="alice", model=GEN)
