"""OpenAI-compatible request and response shapes (``/ai/v1/chat/completions``, ``/ai/v1/embeddings``), translated to
and from the Workers AI task inputs the gateway runs.

Chat: ``model``, ``messages`` (string content or a list of ``{"type": "text", "text": ...}`` parts), ``max_tokens``
or ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stream``, ``stream_options.include_usage``,
the vLLM extension ``ignore_eos``, and ``model = "<id>:<adapter>"`` for a LoRA adapter; ``n`` must be 1 and
``stop`` is refused (400) rather than ignored, as are tools and function calls, ``response_format`` other than
text, ``logprobs``/``top_logprobs``, ``logit_bias``, non-zero presence or frequency penalties, ``modalities`` other
than text, ``audio`` and ``web_search_options`` (fields that would change what the answer is). Other OpenAI fields
(``user``, ``metadata``, ``store``, ``prediction``, ...) are accepted and ignored.
Embeddings: ``model``, ``input`` (a string or a list of strings), ``encoding_format`` (``float`` or ``base64``:
little-endian float32, which is what the ``openai`` client asks for by default), ``dimensions`` (only the model's
own size) and Workers AI's ``truncate_inputs`` (a text longer than the served model's window is refused, 413,
unless it is true).
"""

from __future__ import annotations

import base64
import time

import numpy as np

from dataplane.gateway.errors import bad_input
from dataplane.tasks import MAX_BATCH_TEXTS


def _model(body) -> str:
    if not isinstance(body, dict):
        raise bad_input("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_input("field 'model' must be a non-empty string")
    return model


def _content(i: int, content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_input(f"messages[{i}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_input(f"messages[{i}].content must be a string or a list of text parts")


def chat_inputs(body) -> tuple[str, dict, bool, bool]:
    """OpenAI chat body -> (model, Workers AI inputs, stream, include_usage).

    ``model = "<model id>:<adapter>"`` selects a LoRA adapter: the id is returned without the suffix and the
    adapter name becomes the Workers AI ``lora`` input (catalog ids contain no ``:``)."""
    model = _model(body)
    lora = None
    if ":" in model:
        model, lora = model.rsplit(":", 1)
        if not model or not lora:
            raise bad_input(f"field 'model': {_short(body['model'])} is not '<model>' or '<model>:<adapter>'")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_input("field 'messages' must be a non-empty list")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_input(f"messages[{i}] must be an object")
        role = "system" if m.get("role") == "developer" else m.get("role")
        messages.append({"role": role, "content": _content(i, m.get("content"))})
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_input("field 'n': only n = 1 is supported")
    if body.get("stop") not in (None, [], ""):  # ignoring it would return text past the client's stop sequence
        raise bad_input("field 'stop': stop sequences are not supported (leave it out, or cut the text client-side)")
    for name, fine in _REFUSED:
        if body.get(name) not in fine:  # ignoring it would hand the client another kind of answer than it asked for
            raise bad_input(f"field {name!r}: {_short(body[name])} is not supported (leave the field out)")
    inputs: dict = {"messages": messages}
    if lora is not None:
        inputs["lora"] = lora
    # (a field sent as null is a field left out, as OpenAI reads it)
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise bad_input(f"field 'max_completion_tokens' has the wrong type ({type(max_tokens).__name__})")
    legacy = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = legacy
    elif legacy is not None and (isinstance(legacy, bool) or not isinstance(legacy, int)):  # checked though unused
        raise bad_input(f"field 'max_tokens' has the wrong type ({type(legacy).__name__})")
    if body.get("max_completion_tokens") is not None and max_tokens < 1:  # (the engine's check says max_tokens)
        raise bad_input(f"field 'max_completion_tokens' must be a positive integer, got {max_tokens}")
    # top_k and repetition_penalty are not OpenAI's but its clients send them (extra_body) as Workers AI takes
    # them: passed on to be honoured or refused there, never dropped
    for key, value in (("max_tokens", max_tokens), ("temperature", body.get("temperature")),
                       ("top_p", body.get("top_p")), ("top_k", body.get("top_k")), ("seed", body.get("seed")),
                       ("repetition_penalty", body.get("repetition_penalty")),
                       ("ignore_eos", body.get("ignore_eos"))):
        if value is not None:
            inputs[key] = value
    stream = body.get("stream") if body.get("stream") is not None else False  # null: the default, as OpenAI reads it
    if not isinstance(stream, bool):
        raise bad_input("field 'stream' must be true or false")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_input(f"field 'stream_options' must be an object, got {_short(opts)}")
    if opts is not None and not stream:
        raise bad_input("field 'stream_options' is only allowed when 'stream' is true")
    include_usage = (opts or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_input(f"field 'stream_options.include_usage' must be true or false, got {_short(include_usage)}")
    return model, inputs, stream, bool(include_usage)


# OpenAI chat fields that change what the answer is (tool calls, a JSON format, log-probabilities, a reshaped
# sampling distribution), with the values that ask for nothing beyond plain text: any other value is refused (400).
_REFUSED = (("tools", (None, [])), ("tool_choice", (None, "none", "auto")), ("functions", (None, [])),
            ("function_call", (None, "none", "auto")), ("response_format", (None, {"type": "text"})),
            ("logprobs", (None, False)), ("top_logprobs", (None, 0)), ("logit_bias", (None, {})),
            ("presence_penalty", (None, 0)), ("frequency_penalty", (None, 0)), ("modalities", (None, ["text"])),
            ("audio", (None,)), ("web_search_options", (None,)))


def _short(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (an error message does not echo a client's megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def chat_completion(cid: str, model: str, text: str, usage: dict) -> dict:
    """The non-streaming ``chat.completion`` object."""
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason(usage), "logprobs": None}],
            "usage": openai_usage(usage)}


def openai_usage(usage: dict) -> dict:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens`` (prompt tokens served from the prefix cache)."""
    p, c = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0))}}


def finish_reason(usage: dict) -> str:
    """OpenAI's ``finish_reason``: ``length`` when generation hit its token limit, else ``stop``."""
    return "length" if usage.get("finish_reason") == "length" else "stop"


def chat_chunk(cid: str, model: str, created: int, delta: dict, finish: str | None = None,
               usage: dict | None = None) -> dict:
    """One ``chat.completion.chunk`` (``choices`` is empty for the final usage chunk)."""
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                                     "logprobs": None}]}
    if usage is not None:
        out["usage"] = openai_usage(usage)
    return out


def embedding_inputs(body) -> tuple[str, dict, str, int | None]:
    """OpenAI embeddings body -> (model, Workers AI inputs, encoding format, ``dimensions`` or None)."""
    model = _model(body)
    inp = body.get("input")
    if isinstance(inp, str):
        texts = [inp]
    elif isinstance(inp, list) and inp and all(isinstance(t, str) for t in inp):
        texts = inp
    else:
        raise bad_input("field 'input' must be a string or a non-empty list of strings (token arrays are not "
                        "supported)")
    for i, t in enumerate(texts):  # (the task's own checks would name its Workers AI field, 'text')
        if not t:
            raise bad_input(f"field 'input' {'is' if isinstance(inp, str) else f'holds at [{i}]'} an empty string")
    if len(texts) > MAX_BATCH_TEXTS:
        raise bad_input(f"field 'input' holds {len(texts)} strings; at most {MAX_BATCH_TEXTS} are allowed")
    fmt = "float" if body.get("encoding_format") is None else body["encoding_format"]  # (only null: the default)
    if fmt not in ("float", "base64"):
        raise bad_input(f"field 'encoding_format' must be 'float' or 'base64', got {_short(fmt)}")
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise bad_input(f"field 'dimensions' must be a positive integer, got {_short(dims)}")
    inputs = {"text": inp}  # (a single string stays one: errors then name 'input', not 'input[0]')
    if body.get("truncate_inputs") is not None:  # Workers AI's field, passed on (extra_body in the openai client)
        inputs["truncate_inputs"] = body["truncate_inputs"]
    return model, inputs, fmt, dims


def check_dimensions(model: str, size: int, dims: int | None) -> None:
    """OpenAI's ``dimensions`` must be the model's own size (400 otherwise): see :func:`embedding_list`."""
    if dims is not None and dims != size:
        raise bad_input(f"model {model!r} returns {size}-dimensional embeddings: field 'dimensions' must be {size} "
                        f"or left out, got {dims}")


def embedding_list(model: str, result: dict, fmt: str, prompt_tokens: int, dims: int | None = None) -> dict:
    """Workers AI ``{shape, data}`` -> the OpenAI ``list`` of ``embedding`` objects. ``dims`` (OpenAI's
    ``dimensions``) must be the model's own size: these models are not trained to be cut shorter, so a shortened
    vector would be a different, unvalidated embedding."""
    check_dimensions(model, int(result["shape"][1]), dims)
    data = []
    for i, vec in enumerate(result["data"]):
        if fmt == "base64":
            emb = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
        else:
            emb = vec
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
