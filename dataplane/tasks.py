"""Task functions with Workers AI input/output shapes.

Each takes the :class:`~dataplane.service.DataPlane`, a model name and the request's ``inputs`` dict, and
returns the Workers AI ``result``. Invalid inputs raise :class:`~dataplane.errors.InvalidInputError`
with a message naming the field, before any work is queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np

from dataplane.engine_lm import GenerationHandle
from dataplane.errors import InvalidInputError
from dataplane.sampling import SamplingParams

MAX_BATCH_TEXTS = 100
ROLES = ("system", "user", "assistant")


def _field(inputs, name: str, types, required: bool = True, default=None):
    if not isinstance(inputs, dict):
        raise InvalidInputError("inputs must be a JSON object")
    if name not in inputs or inputs[name] is None:
        if required:
            raise InvalidInputError(f"missing required field '{name}'")
        return default
    value = inputs[name]
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise InvalidInputError(f"field '{name}' has the wrong type ({type(value).__name__})")
    return value


def _check_task(dp, model: str, task: str) -> None:
    card = dp.card(model)
    if card.task != task:
        raise InvalidInputError(f"model '{model}' serves {card.task}, not {task}")


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
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
    return "".join(parts) + "<|assistant|>\n"


def generation_request(inputs) -> tuple[str, SamplingParams, bool]:
    """Parse text-generation inputs into a prompt, sampling parameters and the stream flag."""
    has_prompt = isinstance(inputs, dict) and inputs.get("prompt") is not None
    has_messages = isinstance(inputs, dict) and inputs.get("messages") is not None
    if has_prompt == has_messages:
        raise InvalidInputError("give exactly one of 'prompt' or 'messages'")
    prompt = _field(inputs, "prompt", str) if has_prompt else chat_prompt(inputs["messages"])
    params = SamplingParams(
        max_tokens=_field(inputs, "max_tokens", int, False, 256),
        temperature=_field(inputs, "temperature", (int, float), False, 0.6),
        top_k=_field(inputs, "top_k", int, False),
        top_p=_field(inputs, "top_p", (int, float), False),
        seed=_field(inputs, "seed", int, False),
    )
    return prompt, params, bool(_field(inputs, "stream", bool, False, False))


def _usage(handle: GenerationHandle) -> dict:
    p, c = len(handle.prompt_ids), len(handle.token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _stream(handle: GenerationHandle) -> Iterator[dict]:
    """Server-sent-event payloads: ``{"response": piece}`` ..., then one with ``usage`` at the end."""
    try:
        for piece in handle:
            yield {"response": piece}
    finally:
        handle.cancel()  # a consumer that stops early frees the sequence's slot; no-op when finished
    yield {"response": "", "usage": _usage(handle)}


def submit_generation(dp, model: str, inputs, on_token=None) -> GenerationHandle:
    """Validate and queue a text-generation request; returns the engine's handle (stream it, cancel it)."""
    _check_task(dp, model, "text-generation")
    prompt, params, _ = generation_request(inputs)
    return dp.engine(model).submit(prompt, params, on_token)


def text_generation(dp, model: str, inputs):
    """{prompt | messages, max_tokens, temperature, top_k, top_p, seed, stream} -> {response, usage},
    or, with ``stream``, an iterator of ``{"response": piece}`` events."""
    _check_task(dp, model, "text-generation")
    prompt, params, stream = generation_request(inputs)
    if isinstance(inputs, dict) and inputs.get("lora") is not None:
        # adapters are loaded per deployment by the gateway (`lora_adapters`); never silently serve the base model
        raise InvalidInputError("field 'lora': adapters are served by the gateway (`lora_adapters` in its config); "
                                "DataPlane.run serves base models only")
    handle = dp.engine(model).submit(prompt, params)
    if stream:
        return _stream(handle)
    res = handle.result()
    return {"response": res.text, "usage": _usage(handle)}


def _gather(futures: list[Future]) -> list:
    return [f.result() for f in futures]


def text_embeddings(dp, model: str, inputs) -> dict:
    """{text: str | [str]} -> {shape: [n, d], data: [[...]]} (unit-length vectors)."""
    _check_task(dp, model, "text-embeddings")
    text = _field(inputs, "text", (str, list))
    texts = [text] if isinstance(text, str) else text
    if not texts or len(texts) > MAX_BATCH_TEXTS:
        raise InvalidInputError(f"field 'text' must hold 1 to {MAX_BATCH_TEXTS} strings")
    m, eng = dp.model(model), dp.engine(model)
    encs = [m.encode(t) for t in texts]
    rows = _gather([eng.submit(e) for e in encs])
    return {"shape": [len(rows), int(rows[0].shape[0])], "data": [r.astype(float).tolist() for r in rows]}


def text_classification(dp, model: str, inputs) -> list[dict]:
    """{text} -> [{label, score}] sorted by score."""
    _check_task(dp, model, "text-classification")
    m = dp.model(model)
    logits = dp.engine(model).submit(m.encode(_field(inputs, "text", str))).result()
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return sorted(({"label": lab, "score": float(s)} for lab, s in zip(m.labels, p, strict=True)),
                  key=lambda d: -d["score"])


def reranking_inputs(inputs) -> tuple[str, list, int | None]:
    """Validated (query, contexts, top_k) of a reranking request (shared with the gateway)."""
    query = _field(inputs, "query", str)
    contexts = _field(inputs, "contexts", list)
    top_k = _field(inputs, "top_k", int, False)
    if not contexts or len(contexts) > MAX_BATCH_TEXTS:
        raise InvalidInputError(f"field 'contexts' must hold 1 to {MAX_BATCH_TEXTS} items")
    if not all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in contexts):
        raise InvalidInputError("each item of 'contexts' must be {text: string}")
    if top_k is not None and top_k < 1:
        raise InvalidInputError("field 'top_k' must be positive")
    return query, contexts, top_k


def text_reranking(dp, model: str, inputs) -> dict:
    """{query, contexts: [{text}], top_k?} -> {response: [{id, score}]}, best first; score = sigmoid(logit)."""
    _check_task(dp, model, "text-reranking")
    query, contexts, top_k = reranking_inputs(inputs)
    m, eng = dp.model(model), dp.engine(model)
    logits = _gather([eng.submit(m.encode(query, c["text"])) for c in contexts])
    scored = [{"id": i, "score": float(1 / (1 + np.exp(-lg[0])))} for i, lg in enumerate(logits)]
    scored.sort(key=lambda d: -d["score"])
    return {"response": scored[:top_k] if top_k else scored}


def image_classification(dp, model: str, inputs) -> list[dict]:
    """{image: bytes | [int]} -> top-5 [{label, score}]."""
    _check_task(dp, model, "image-classification")
    m = dp.model(model)
    probs = dp.engine(model).submit(m.preprocess(_bytes_field(inputs, "image"))).result()
    top = np.argsort(-probs)[:5]
    return [{"label": m.labels[i], "score": float(probs[i])} for i in top]


def speech_recognition(dp, model: str, inputs) -> dict:
    """{audio: WAV bytes | [int]} -> {text, word_count}."""
    _check_task(dp, model, "automatic-speech-recognition")
    m = dp.model(model)
    text = dp.engine(model).submit(m.features(_bytes_field(inputs, "audio"))).result()
    return {"text": text, "word_count": len(text.split())}


TASK_FUNCTIONS = {
    "text-generation": text_generation,
    "text-embeddings": text_embeddings,
    "text-classification": text_classification,
    "text-reranking": text_reranking,
    "image-classification": image_classification,
    "automatic-speech-recognition": speech_recognition,
}
