"""JSON Schemas (draft 2020-12) of what ``POST /ai/run/{model}`` accepts and returns, per served model:
``GET /client/v4/accounts/{a}/ai/models/schema?model=X`` (Workers AI's ``client.ai.models.schema.get``).

The schemas are built from the constants the validators read (:mod:`dataplane.task_inputs`: the text-generation
fields, the neutral-only and plain-only fields, the chat roles, the batch bound; :mod:`dataplane.sampling`: the
temperature bound; the route's ``options`` flag words) and from the served deployment (the model's context window
as :meth:`Gateway.context_window` gives it, the KV budget its engines were started with, its LoRA adapters, its
embedding size), and ``tests/dataplane/gateway/test_model_schema.py`` and ``test_model_schema_bounds.py`` send
bodies on both sides of every bound to ``/ai/run`` and to the schema, so the two cannot drift apart unnoticed.

What a schema cannot say, and the gateway still checks: prompt tokens (413 beyond the stand-in's context, 400 when
prompt plus ``max_tokens`` passes the window, 413 when it passes the engines' KV budget: the schema bounds
``max_tokens`` alone, by the tighter of the two less the one-token shortest prompt, and cannot see the default 256
of a body without it), an embedding text longer than the served window without ``truncate_inputs`` (413), image
and audio bytes that do not decode, images of more than 40,000,000 pixels (413), bodies over the served
``max_body_bytes`` (10 MiB unless configured; 413), integers of more than 4,300 digits (Python's
``sys.get_int_max_str_digits()``: the JSON parser refuses them, 400), strings holding a lone UTF-16 surrogate, and
JSON's single number type (``5.0`` is an integer to JSON Schema; the gateway wants ``5`` where it takes an
integer).

The SDK's typed reading of the answer wants ``type``, ``description`` and a boolean ``additionalProperties`` at the
top of ``input`` and ``output``; every schema here has them. A text generation's ``output`` is its JSON
``result`` (an object); with ``stream: true`` the body is ``$defs/stream`` instead, a ``text/event-stream`` whose
``data:`` lines each hold a ``$defs/stream_event`` (its ``contentSchema``, an annotation), then ``data: [DONE]``.
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


# What ``str.strip()`` removes (the characters ``str.isspace()`` holds; a test checks the two agree). ``\s`` means
# another set in each regex dialect (Python's includes U+001C-U+001F and U+0085; ECMA-262's, the one JSON Schema
# names, includes U+FEFF instead), so the pattern spells the class out in ``\uXXXX`` escapes, read alike by both.
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b)))
              + "\u2028\u2029\u202f\u205f\u3000")


def char_class(chars: str) -> str:
    """A regex character class of exactly ``chars`` (runs as ranges), in escapes Python and ECMA-262 read alike."""
    codes, runs = sorted(set(map(ord, chars))), []
    for c in codes:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "[" + "".join(f"\\u{a:04x}" + (f"-\\u{b:04x}" if b > a else "") for a, b in runs) + "]"


# ``options.rejectIfBusy``: a boolean or one of the words :func:`http_util.flag` reads, in any case, with the
# whitespace ``str.strip()`` removes around it
_WS = char_class(WHITESPACE)
FLAG = {"anyOf": [{"type": ["boolean", "null"]}, {
    "type": "string",
    "pattern": f"^{_WS}*(" + "|".join(_any_case(w) for w in TRUE_WORDS + FALSE_WORDS if w) + f")?{_WS}*$"}]}
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
LABELS = {"type": "object", "required": ["label", "score"], "additionalProperties": False,
          "properties": {"label": {"type": "string"}, "score": SCORE}}


def _lora(adapters) -> dict:
    """``lora``: one of the model's adapters, or null (left out) when it serves none."""
    names = sorted(adapters)
    if not names:
        return {"type": "null", "description": "no LoRA adapters are served for this model"}
    return {"enum": [*names, None], "description": "the LoRA adapter to apply (served ones only)"}


def _generation_field(name: str, window: int, budget: int, adapters) -> dict:
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
        "max_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": min(window, budget) - 1,
                                 "description": f"tokens to generate (default 256); prompt + max_tokens must fit "
                                                f"the context window of {window} tokens and the KV budget of "
                                                f"{budget} tokens"}),
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE}),
        "top_k": _nullable({"type": "integer", "minimum": 1}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "seed": _nullable({"type": "integer", "minimum": 0}),
        "stream": _nullable({"type": "boolean", "description": "answer server-sent events"}),
        "raw": _nullable({"type": "boolean"}),
        "ignore_eos": _nullable({"type": "boolean", "description": "generate exactly max_tokens tokens"}),
        "lora": _lora(adapters),
    }[name]


def _generation(window: int, budget: int, adapters) -> tuple[dict, dict]:
    """Text generation's (input, output) for a served context ``window`` and engine KV ``budget`` (tokens)."""
    props = {name: _generation_field(name, window, budget, adapters) for name in GENERATION_FIELDS}
    props["stop"] = {"enum": [None, [], ""], "description": "stop sequences are not supported"}
    props["options"] = OPTIONS
    # Other fields are taken as null only: said by the allOf, so that the top can say additionalProperties as a
    # boolean (what the SDK's typed reading wants) without overriding it.
    inp = {"description": "Text generation: exactly one of prompt or messages; fields not listed must be null",
           "type": "object", "properties": props, "additionalProperties": True,
           "allOf": [{"properties": dict.fromkeys(props, True), "additionalProperties": {"type": "null"}}],
           "oneOf": [{"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                     {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]}
    event = {"type": "object", "minProperties": 1, "additionalProperties": False,
             "properties": {"response": {"type": "string"},
                            "usage": {"anyOf": [USAGE, {"type": "object", "maxProperties": 0}]}, "error": ERROR},
             "anyOf": [{"required": ["response"]}, {"required": ["error"]}]}
    stream = {"description": "With stream: true, the body instead of a result: 'data: ' lines each holding a JSON "
                             "$defs/stream_event (text pieces, then one with usage, or an error once the 200 is "
                             "sent), then 'data: [DONE]'; contentSchema is what each data line holds",
              "type": "string", "contentMediaType": "text/event-stream",
              "contentSchema": {"$ref": "#/$defs/stream_event"}}
    out = {"description": "The generated text and its token counts (with stream: true the body is $defs/stream "
                          "instead, whose data lines are $defs/stream_event)",
           "type": "object", "required": ["response", "usage"],
           "properties": {"response": {"type": "string"}, "usage": USAGE}, "additionalProperties": False,
           "$defs": {"stream": stream, "stream_event": event}}
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
    # (additionalProperties says nothing of an array; it is there for the SDK, and true of the items' objects)
    out = {"description": "Every label with its probability, best first", "type": "array", "minItems": 1,
           "items": LABELS, "additionalProperties": False}
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
                                             "minItems": 1, "maxItems": 5, "items": LABELS,
                                             "additionalProperties": False}


def _speech() -> tuple[dict, dict]:
    out = {"description": "The transcript", "type": "object", "required": ["text", "word_count"],
           "properties": {"text": {"type": "string"}, "word_count": COUNT}, "additionalProperties": False}
    return _binary("automatic-speech-recognition"), out


def kv_budget(gw) -> int:
    """Tokens (prompt + max_tokens) one generation may reserve in the served engines' KV budget: the engine
    refuses more (413); with a one-token prompt, ``max_tokens`` up to this less one is served."""
    return gw.backend.dp.config.lm.kv_budget_tokens


# task -> (gw, model, catalog entry) -> (input, output); every row of dataplane.tasks.TASKS has one (a test checks)
BY_TASK = {
    "text-generation": lambda gw, model, spec: _generation(gw.context_window(model), kv_budget(gw),
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
