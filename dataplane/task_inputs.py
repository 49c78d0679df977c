"""The Workers AI tasks' input fields, parsed and checked: the helpers every task's ``prepare`` reads its fields
with (a malformed one raises :class:`InvalidInputError` naming it), the chat template, and the text-generation and
reranking requests (:mod:`dataplane.tasks` holds the tasks themselves)."""

from __future__ import annotations

from dataplane.errors import InvalidInputError
from dataplane.sampling import SamplingParams

MAX_BATCH_TEXTS = 100
ROLES = ("system", "user", "assistant")


def _require_object(inputs) -> None:
    if not isinstance(inputs, dict):
        raise InvalidInputError("inputs must be a JSON object")


def _field(inputs, name: str, types, required: bool = True, default=None):
    _require_object(inputs)  # the public parsers below may be handed anything
    if name not in inputs or inputs[name] is None:
        if required:
            raise InvalidInputError(f"missing required field '{name}'")
        return default
    value = inputs[name]
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise InvalidInputError(f"field '{name}' has the wrong type ({type(value).__name__})")
    if isinstance(value, str):
        _unicode(value, f"field '{name}'")
    return value


def _unicode(text: str, what: str) -> None:
    """Text the tokenizers can encode: a lone surrogate (Python strings can hold one; JSON's \\ud800 gives one)
    is not Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{what} is not valid Unicode text ({exc.reason} at character {exc.start})") from None


def _bytes_field(inputs, name: str) -> bytes:
    value = _field(inputs, name, (bytes, bytearray, list))
    if isinstance(value, list):  # Workers AI also accepts an array of 0-255 integers
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 256 for v in value):
            raise InvalidInputError(f"field '{name}' must be bytes or a list of integers 0-255")
        value = bytes(value)
    if not value:
        raise InvalidInputError(f"field '{name}' is empty")
    return bytes(value)


def chat_prompt(messages) -> str:
    """Render chat messages with a plain template (``<|role|>`` lines, then ``<|assistant|>``)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("field 'messages' must be a non-empty list")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidInputError(f"messages[{i}] must be {{role: {'|'.join(ROLES)}, content: string}}")
        _unicode(m["content"], f"messages[{i}].content")
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
    return "".join(parts) + "<|assistant|>\n"


def generation_request(inputs) -> tuple[str, SamplingParams, bool]:
    """Parse text-generation inputs into a prompt, sampling parameters and the stream flag."""
    _require_object(inputs)
    # a misspelt field silently dropped (max_token) or one the engine ignores (stop) would run another request
    # than the one sent; null is a field left out
    if inputs.get("stop") not in (None, [], ""):
        raise InvalidInputError("field 'stop': stop sequences are not supported (leave it out, or cut the text "
                                "client-side)")
    unknown = [k for k, v in inputs.items() if k not in GENERATION_FIELDS and k != "stop" and v is not None]
    if unknown:
        raise InvalidInputError(f"unknown field {repr(unknown[0])[:60]} (text generation takes "
                                f"{', '.join(GENERATION_FIELDS)})")
    for name, plain in PLAIN_ONLY:
        if inputs.get(name) not in plain:
            raise InvalidInputError(f"field {name!r} = {repr(inputs[name])[:60]} is not supported (these models "
                                    "answer plain text; leave the field out)")
    has_prompt = isinstance(inputs, dict) and inputs.get("prompt") is not None
    has_messages = isinstance(inputs, dict) and inputs.get("messages") is not None
    if has_prompt == has_messages:
        raise InvalidInputError("give exactly one of 'prompt' or 'messages'")
    prompt = _field(inputs, "prompt", str) if has_prompt else chat_prompt(inputs["messages"])
    if not prompt:  # (Workers AI's schema: at least one character; the engine would generate from nothing)
        raise InvalidInputError("field 'prompt' is empty")
    params = SamplingParams(
        max_tokens=_field(inputs, "max_tokens", int, False, 256),
        temperature=_field(inputs, "temperature", (int, float), False, 0.6),
        top_k=_field(inputs, "top_k", int, False),
        top_p=_field(inputs, "top_p", (int, float), False),
        seed=_field(inputs, "seed", int, False),
    )
    # Workers AI fields the engine does not implement: their neutral values only (a penalty silently ignored
    # would change what the client believes it measured); ``raw`` (no chat template) is what a prompt gets anyway.
    for name, neutral in NEUTRAL_ONLY:
        value = _field(inputs, name, (int, float), False)
        if value is not None and value != neutral:
            raise InvalidInputError(f"field '{name}' = {value!r} is not supported (penalties are not implemented; "
                                    f"leave it out or give {neutral})")
    _field(inputs, "raw", bool, False)
    return prompt, params, bool(_field(inputs, "stream", bool, False, False))


NEUTRAL_ONLY = (("frequency_penalty", 0), ("presence_penalty", 0), ("repetition_penalty", 1))
# Workers AI fields that ask for more than plain text (a JSON format, tool calls): their plain values only
PLAIN_ONLY = (("response_format", (None, {"type": "text"})), ("tools", (None, [])), ("functions", (None, [])))
GENERATION_FIELDS = ("prompt", "messages", "max_tokens", "temperature", "top_k", "top_p", "seed", "stream", "raw",
                     "ignore_eos", "lora", *(n for n, _ in NEUTRAL_ONLY), *(n for n, _ in PLAIN_ONLY))


def reranking_inputs(inputs) -> tuple[str, list, int | None]:
    """Validated (query, contexts, top_k) of a reranking request."""
    query = _field(inputs, "query", str)
    contexts = _field(inputs, "contexts", list)
    top_k = _field(inputs, "top_k", int, False)
    if not contexts or len(contexts) > MAX_BATCH_TEXTS:
        raise InvalidInputError(f"field 'contexts' must hold 1 to {MAX_BATCH_TEXTS} items")
    if not all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in contexts):
        raise InvalidInputError("each item of 'contexts' must be {text: string}")
    for i, c in enumerate(contexts):
        _unicode(c["text"], f"contexts[{i}].text")
    if top_k is not None and top_k < 1:
        raise InvalidInputError("field 'top_k' must be positive")
    return query, contexts, top_k
