"""JSON Schemas (draft 2020-12) of what ``POST /ai/run/{model}`` accepts and returns, per served model:
``GET /client/v4/accounts/{a}/ai/models/schema?model=X`` (Workers AI's ``client.ai.models.schema.get``).

The schemas are built from the constants the validators read (:mod:`dataplane.task_inputs`: the text-generation
fields, the neutral-only and plain-only fields, the chat roles, the batch bound; :mod:`dataplane.sampling`: the
temperature bound; the route's ``options`` flag words) and from the served deployment (the model's context window
as :meth:`Gateway.context_window` gives it, its LoRA adapters, its embedding size), and
``tests/dataplane/gateway/test_model_schema.py`` sends bodies on both sides of every bound to ``/ai/run`` and to the
schema, so the two cannot drift apart unnoticed.

What a schema cannot say, and the gateway still checks: prompt tokens (413 beyond the stand-in's context, 400 when
prompt plus ``max_tokens`` passes the window: the schema bounds ``max_tokens`` alone, by the window less the
one-token shortest prompt), an embedding text longer than the served window without ``truncate_inputs`` (413),
image and audio bytes that do not decode, strings holding a lone UTF-16 surrogate, and JSON's single number type
(``5.0`` is an integer to JSON Schema; the gateway wants ``5`` where it takes an integer).
"""

from __future__ import annotations

from dataplane.gateway.http_util import BINARY_FIELD, FALSE_WORDS, TRUE_WORDS
from dataplane.sampling import MAX_TEMPERATURE
from dataplane.task_inputs import GENERATION_FIELDS, MAX_BATCH_TEXTS, NEUTRAL_ONLY, PLAIN_ONLY, ROLES

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _nullable(schema: dict) -> dict:
    """``schema`` or null: the gateway reads a field sent as null as a field left out."""
    return {"anyOf": [schema, {"type": "null"}]}


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


# ``options.rejectIfBusy``: a boolean or one of the words :func:`http_util.flag` reads, in any case
FLAG = {"anyOf": [{"type": ["boolean", "null"]}, {
    "type": "string",
    "pattern": r"^\s*(" + "|".join(_any_case(w) for w in TRUE_WORDS + FALSE_WORDS if w) + r")?\s*$"}]}
OPTIONS = _nullable({"type": "object", "properties": {"rejectIfBusy": FLAG},
                     "description": "read by the route: rejectIfBusy refuses (429) instead of queueing"})
SCORE = {"type": "number", "minimum": 0, "maximum": 1}
COUNT = {"type": "integer", "minimum": 0}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {"prompt_tokens": COUNT, "completion_tokens": COUNT, "total_tokens": COUNT,
                        "prompt_tokens_details": {"type": "object", "required": ["cached_tokens"],
                                                  "properties": {"cached_tokens": {"type": "integer", "minimum": 1}},
                                                  "additionalProperties": False}},
         "additionalProperties": False}
ERROR = {"type": "object", "required": ["code", "message"],
         "properties": {"code": {"type": "integer"}, "message": {"type": "string"}}}
LABELS = {"type": "object", "required": ["label", "score"], "properties": {"label": {"type": "string"},
                                                                           "score": SCORE}}


def _lora(adapters) -> dict:
    """``lora``: one of the model's adapters, or null (left out) when it serves none."""
    names = sorted(adapters)
    if not names:
        return {"type": "null", "description": "no LoRA adapters are served for this model"}
    return {"enum": [*names, None], "description": "the LoRA adapter to apply (served ones only)"}


def _generation_field(name: str, window: int, adapters) -> dict:
    """The schema of one of :data:`GENERATION_FIELDS` (a KeyError for a field without one: a test reads them all)."""
    neutral, plain = dict(NEUTRAL_ONLY), dict(PLAIN_ONLY)
    if name in neutral:
        return {"enum": [neutral[name], None], "description": f"penalties are not implemented: {neutral[name]} only"}
    if name in plain:
        return {"enum": list(plain[name]), "description": "these models answer plain text only"}
    return {
        "prompt": _nullable({"type": "string", "minLength": 1}),
        "messages": _nullable({"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": list(ROLES)}, "content": {"type": "string"}}}}),
        "max_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": window - 1,
                                 "description": f"tokens to generate (default 256); prompt + max_tokens must fit "
                                                f"the context window of {window} tokens"}),
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE}),
        "top_k": _nullable({"type": "integer", "minimum": 1}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "seed": _nullable({"type": "integer", "minimum": 0}),
        "stream": _nullable({"type": "boolean", "description": "answer server-sent events"}),
        "raw": _nullable({"type": "boolean"}),
        "ignore_eos": _nullable({"type": "boolean", "description": "generate exactly max_tokens tokens"}),
        "lora": _lora(adapters),
    }[name]


def _generation(window: int, adapters) -> tuple[dict, dict]:
    props = {name: _generation_field(name, window, adapters) for name in GENERATION_FIELDS}
    props["stop"] = {"enum": [None, [], ""], "description": "stop sequences are not supported"}
    props["options"] = OPTIONS
    inp = {"description": "Text generation: exactly one of prompt or messages; fields not listed must be null",
           "type": "object", "properties": props, "unevaluatedProperties": {"type": "null"},
           "oneOf": [{"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                     {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]}
    result = {"type": "object", "required": ["response", "usage"],
              "properties": {"response": {"type": "string"}, "usage": USAGE}, "additionalProperties": False}
    event = {"type": "object", "minProperties": 1, "additionalProperties": False,
             "properties": {"response": {"type": "string"},
                            "usage": {"anyOf": [USAGE, {"type": "object", "maxProperties": 0}]}, "error": ERROR},
             "anyOf": [{"required": ["response"]}, {"required": ["error"]}]}
    out = {"description": "The result (JSON), or with stream: true a text/event-stream body: 'data: ' lines each "
                          "holding a JSON event ($defs/stream_event: text pieces, then one with usage, or an error "
                          "once the 200 is sent), then 'data: [DONE]'",
           "oneOf": [result, {"type": "string", "contentMediaType": "text/event-stream"}],
           "$defs": {"stream_event": event}}
    return inp, out


def _texts() -> dict:
    one = {"type": "string", "minLength": 1}
    return {"anyOf": [one, {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_TEXTS, "items": one}]}


def _embeddings(hidden: int, window: int) -> tuple[dict, dict]:
    inp = {"description": f"Text embeddings: a text or up to {MAX_BATCH_TEXTS}; each at most {window} tokens "
                          "unless truncate_inputs is true",
           "type": "object", "required": ["text"],
           "properties": {"text": _texts(), "truncate_inputs": _nullable({"type": "boolean"}),
                          "pooling": {"enum": ["mean", None]}}, "additionalProperties": True}
    vector = {"type": "array", "minItems": hidden, "maxItems": hidden, "items": {"type": "number"}}
    out = {"description": f"One {hidden}-dimensional unit vector per text, in order", "type": "object",
           "required": ["shape", "data"], "additionalProperties": False,
           "properties": {"shape": {"type": "array", "prefixItems": [
               {"type": "integer", "minimum": 1, "maximum": MAX_BATCH_TEXTS}, {"const": hidden}], "items": False,
               "minItems": 2},
               "data": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_TEXTS, "items": vector}}}
    return inp, out


def _classification() -> tuple[dict, dict]:
    inp = {"description": "Text classification", "type": "object", "required": ["text"],
           "properties": {"text": {"type": "string"}}, "additionalProperties": True}
    out = {"description": "Every label with its probability, best first", "type": "array", "minItems": 1,
           "items": LABELS}
    return inp, out


def _reranking() -> tuple[dict, dict]:
    inp = {"description": f"Text reranking: a query and 1 to {MAX_BATCH_TEXTS} contexts", "type": "object",
           "required": ["query", "contexts"], "additionalProperties": True,
           "properties": {"query": {"type": "string"},
                          "contexts": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_TEXTS, "items": {
                              "type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}},
                          "top_k": _nullable({"type": "integer", "minimum": 1})}}
    out = {"description": "Contexts by relevance, best first (top_k of them when given)", "type": "object",
           "required": ["response"], "additionalProperties": False,
           "properties": {"response": {"type": "array", "items": {
               "type": "object", "required": ["id", "score"],
               "properties": {"id": COUNT, "score": SCORE}, "additionalProperties": False}}}}
    return inp, out


def _binary(task: str) -> dict:
    name = BINARY_FIELD[task]
    return {"description": f"{name} file bytes as a list of byte values (or the raw file as the request body)",
            "type": "object", "required": [name], "additionalProperties": True,
            "properties": {name: {"type": "array", "minItems": 1,
                                  "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}


def _image() -> tuple[dict, dict]:
    return _binary("image-classification"), {"description": "The top 5 labels, best first", "type": "array",
                                             "minItems": 1, "maxItems": 5, "items": LABELS}


def _speech() -> tuple[dict, dict]:
    out = {"description": "The transcript", "type": "object", "required": ["text", "word_count"],
           "properties": {"text": {"type": "string"}, "word_count": COUNT}, "additionalProperties": False}
    return _binary("automatic-speech-recognition"), out


# task -> (gw, model, catalog entry) -> (input, output); every row of dataplane.tasks.TASKS has one (a test checks)
BY_TASK = {
    "text-generation": lambda gw, model, spec: _generation(gw.context_window(model),
                                                           gw.backend.adapters.get(model, {})),
    "text-embeddings": lambda gw, model, spec: _embeddings(spec.hidden, spec.context_window),
    "text-classification": lambda *_: _classification(),
    "text-reranking": lambda *_: _reranking(),
    "image-classification": lambda *_: _image(),
    "automatic-speech-recognition": lambda *_: _speech(),
}


def model_schema(gw, model: str) -> dict:
    """``{input, output}``: the JSON Schemas of ``/ai/run/{model}``'s body and of its ``result`` (400/5007 for a
    model not served here)."""
    spec = gw.spec(model)
    task = spec.task
    inp, out = BY_TASK[task](gw, model, spec)
    if task != "text-generation":  # fields of any /ai/run body: read by the route and by admission
        inp["properties"].update(options=OPTIONS, lora=_lora(gw.backend.adapters.get(model, {})))
    return {"input": {"$schema": DRAFT, **inp}, "output": {"$schema": DRAFT, **out}}
