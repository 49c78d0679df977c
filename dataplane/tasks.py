"""The Workers AI tasks as one table: prepare -> run -> shape.

Reading guide:

* :class:`Prepared` - a validated request: its size for the control plane (``units``, ``output_tokens``, billed
  ``input_units``, ``stream``) and the engine's work (``items``, sampling ``params``, ``extra``).
* :class:`Task` and :data:`TASKS` - one row per Workers AI task. ``prepare(dp, stand_in, inputs)`` validates
  (a malformed input raises :class:`InvalidInputError` naming the field, a request that can never fit raises
  :class:`CapacityError`, both before any work is queued), tokenizes or decodes, and returns a
  :class:`Prepared`; ``shape(dp, prep, outputs)`` turns the engine's outputs into the Workers AI ``result``.
  ``heavy`` marks prepares that decode images or audio, so async callers run them in a worker thread.
* :func:`submit` - the engine step both callers share: ``Prepared.items`` onto the model's engine.
* :func:`run` - the synchronous path (:meth:`~dataplane.service.DataPlane.run`): prepare, submit, wait, shape.
  The live gateway runs the same rows asynchronously (:mod:`dataplane.gateway.invoke`), so a request gets the
  same validation, the same errors and the same result on both paths.
* ``text_generation`` ... (:data:`TASK_FUNCTIONS`) - :func:`run` bound to one task.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dataplane.engine_lm import GenerationHandle
from dataplane.errors import CapacityError, InvalidInputError
from dataplane.sampling import SamplingParams

MAX_BATCH_TEXTS = 100
ROLES = ("system", "user", "assistant")
MEL_FRAMES_PER_S = 100  # log-mel features are 10 ms frames
MAX_IMAGE_PIXELS = 40_000_000  # ~160 MB of RGBA once decoded: bigger images are refused (413) unread


@dataclass
class Prepared:
    """A validated request: what the control plane needs (``units``, ``output_tokens``) and the engine input."""

    task: str = ""
    stand_in: str = ""
    units: int = 0  # prompt tokens (the longest text for encoders), images, or audio seconds
    output_tokens: int = 0
    input_units: float = 0.0  # billed input: all tokens / images / audio minutes
    stream: bool = False
    items: list = field(default_factory=list)
    params: Any = None
    extra: dict = field(default_factory=dict)  # per task (reranking's top_k); the gateway adds a LoRA "adapter"


# ----- input fields ---------------------------------------------------------------------------------------
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


def workers_usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """The Workers AI ``usage`` object; ``prompt_tokens_details.cached_tokens`` (OpenAI's field) appears when a
    prefix of the prompt was served from the prefix KV cache."""
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


# ----- the tasks: prepare(model, stand_in, inputs) -> Prepared, shape(model, prep, outputs) -> result -------
def _prepare_generation(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {prompt | messages, max_tokens, temperature, top_k, top_p, seed, stream, ignore_eos}."""
    prompt, params, stream = generation_request(inputs)
    if _field(inputs, "ignore_eos", bool, False, False):  # vLLM's extension: exact output lengths
        params = replace(params, stop_on_eos=False)
    ids = model.tokenizer.encode(prompt) or [model.tokenizer.eos_id]  # as the engine does for an empty prompt
    n_ctx = model.spec.n_ctx
    if len(ids) >= n_ctx:
        raise CapacityError(f"prompt has {len(ids)} tokens; {stand_in}'s context holds {n_ctx}")
    out = min(params.max_tokens, n_ctx - len(ids))  # as the engine clips it; the control plane reserves this
    return Prepared(units=len(ids), output_tokens=out, input_units=float(len(ids)), stream=stream,
                    items=[ids], params=params)


def _shape_generation(model, prep: Prepared, outs: list) -> dict:
    """Result: {response, usage}. (A stream's pieces come from the engine; its caller sends them.)"""
    res = outs[0]
    usage = workers_usage(res.prompt_tokens, res.completion_tokens, res.cached_tokens)
    return {"response": res.text, "usage": usage}


def _encoded(encs: list, **extra) -> Prepared:
    # An encoder batch pads to its longest sequence, so that one sizes the request; every token is billed.
    return Prepared(units=max(len(e) for e in encs), input_units=float(sum(len(e) for e in encs)), items=encs,
                    extra=extra)


def _prepare_embeddings(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {text: str | [str], truncate_inputs?}. Texts are cut to the model's window; the gateway refuses one
    longer than the *served* model's window unless ``truncate_inputs`` is true (:func:`over_window`)."""
    text = _field(inputs, "text", (str, list))
    texts = [text] if isinstance(text, str) else text
    if not texts or len(texts) > MAX_BATCH_TEXTS or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError(f"field 'text' must be a string or hold 1 to {MAX_BATCH_TEXTS} strings")
    for i, t in enumerate(texts):
        _unicode(t, "field 'text'" if isinstance(text, str) else f"text[{i}]")
        if not t:  # (Workers AI's schema: at least one character)
            raise InvalidInputError(f"field {'text' if isinstance(text, str) else f'text[{i}]'!r} is empty")
    _field(inputs, "truncate_inputs", bool, False, False)  # (its type: read by over_window)
    pooling = _field(inputs, "pooling", str, False, "mean")
    if pooling != "mean":  # Workers AI's bge models also offer 'cls'; these encoders pool by the mean only
        raise InvalidInputError(f"field 'pooling' = {pooling!r} is not supported (only 'mean'; leave it out)")
    return _encoded([model.encode(t) for t in texts])


def over_window(prep: Prepared, inputs, window: int, name: str = "text") -> tuple[str, int] | None:
    """The first text of an embeddings request longer than ``window`` tokens (the served model's, counted by the
    stand-in's tokenizer) as (``text`` or ``text[i]``, with ``name`` for ``text``; its tokens); None when none is,
    or when ``truncate_inputs`` asks for the cut. Workers AI refuses such a text unless asked to cut it: an
    embedding of a cut text is of another text."""
    if inputs.get("truncate_inputs") is True:
        return None
    for i, e in enumerate(prep.items):
        n = e.full_length or len(e)
        if n > window:
            return (name if isinstance(inputs.get("text"), str) else f"{name}[{i}]"), n
    return None


def _shape_embeddings(model, prep: Prepared, outs: list) -> dict:
    """Result: {shape: [n, d], data: [[...]]} (unit-length vectors: :meth:`TextEncoder.run` normalises every
    embedding output)."""
    return {"shape": [len(outs), int(outs[0].shape[0])], "data": [r.astype(float).tolist() for r in outs]}


def _prepare_classification(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {text}."""
    return _encoded([model.encode(_field(inputs, "text", str))])


def _shape_classification(model, prep: Prepared, outs: list) -> list[dict]:
    """Result: [{label, score}], best first (softmax of the logits)."""
    logits = outs[0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return sorted(({"label": lab, "score": float(s)} for lab, s in zip(model.labels, p, strict=True)),
                  key=lambda d: -d["score"])


def _prepare_reranking(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {query, contexts: [{text}], top_k?}."""
    query, contexts, top_k = reranking_inputs(inputs)
    return _encoded([model.encode(query, c["text"]) for c in contexts], top_k=top_k)


def _shape_reranking(model, prep: Prepared, outs: list) -> dict:
    """Result: {response: [{id, score}]}, best first; score = sigmoid(logit)."""
    scored = [{"id": i, "score": float(1 / (1 + np.exp(-lg[0])))} for i, lg in enumerate(outs)]
    scored.sort(key=lambda d: -d["score"])
    k = prep.extra.get("top_k")
    return {"response": scored[:k] if k else scored}


def _prepare_image(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {image: bytes | [int]}. Decoded and resized here; a decompression bomb is refused unread."""
    from PIL import Image, UnidentifiedImageError

    data = _bytes_field(inputs, "image")
    try:
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            w, h = img.size
    except Image.DecompressionBombError:  # Pillow's own bound, far above ours: too large, not undecodable
        raise CapacityError(f"image has more than {MAX_IMAGE_PIXELS:,} pixels, the most accepted") from None
    except Exception as exc:  # (Pillow's "cannot identify" names a buffer's address: said in words instead)
        why = ("not an image format Pillow reads" if isinstance(exc, UnidentifiedImageError)
               else str(exc)[:160] or type(exc).__name__)
        raise InvalidInputError(f"image bytes could not be decoded ({why})") from None
    if w * h > MAX_IMAGE_PIXELS:
        raise CapacityError(f"image is {w}x{h} pixels; at most {MAX_IMAGE_PIXELS:,} are accepted")
    return Prepared(units=1, input_units=1.0, items=[model.preprocess(data)])


def _shape_image(model, prep: Prepared, outs: list) -> list[dict]:
    """Result: the top 5 [{label, score}]."""
    probs = outs[0]
    return [{"label": model.labels[i], "score": float(probs[i])} for i in np.argsort(-probs)[:5]]


def _prepare_speech(model, stand_in: str, inputs) -> Prepared:
    """Inputs: {audio: WAV bytes | [int]}; billed per audio minute."""
    mel = model.features(_bytes_field(inputs, "audio"))
    seconds = mel.shape[1] / MEL_FRAMES_PER_S
    return Prepared(units=max(1, round(seconds)), input_units=seconds / 60.0, items=[mel])


def _shape_speech(model, prep: Prepared, outs: list) -> dict:
    """Result: {text, word_count}."""
    text = outs[0]
    return {"text": text, "word_count": len(text.split())}


@dataclass(frozen=True)
class Task:
    """One Workers AI task: how its inputs become engine work and how the engine's outputs become its result."""

    name: str
    unit: str  # what Prepared.units counts: "tokens", "images" or "seconds" (of audio)
    prepare_fn: Callable[[Any, str, Any], Prepared] = field(repr=False)
    shape_fn: Callable[[Any, Prepared, list], Any] = field(repr=False)
    heavy: bool = False  # prepare decodes bytes for long enough that an event loop must not run it
    generative: bool = False  # served by the LM engine: one generation, sampling params, streaming, adapters

    def prepare(self, dp, stand_in: str, inputs) -> Prepared:
        """Validate ``inputs`` for model ``stand_in`` and turn them into engine items (raises
        InvalidInputError / CapacityError)."""
        card = dp.card(stand_in)
        if card.task != self.name:
            raise InvalidInputError(f"model '{stand_in}' serves {card.task}, not {self.name}")
        _require_object(inputs)
        prep = self.prepare_fn(dp.model(stand_in), stand_in, inputs)
        prep.task, prep.stand_in = self.name, stand_in
        return prep

    def shape(self, dp, prep: Prepared, outs: list):
        """The engine's outputs (one per item of ``prep.items``) -> the Workers AI ``result``."""
        return self.shape_fn(dp.model(prep.stand_in), prep, outs)


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("text-generation", "tokens", _prepare_generation, _shape_generation, generative=True),
    Task("text-embeddings", "tokens", _prepare_embeddings, _shape_embeddings),
    Task("text-classification", "tokens", _prepare_classification, _shape_classification),
    Task("text-reranking", "tokens", _prepare_reranking, _shape_reranking),
    Task("image-classification", "images", _prepare_image, _shape_image, heavy=True),
    Task("automatic-speech-recognition", "seconds", _prepare_speech, _shape_speech, heavy=True),
)}


def task_named(name: str) -> Task:
    """The row of task ``name`` (InvalidInputError if no row serves it)."""
    try:
        return TASKS[name]
    except KeyError:
        raise InvalidInputError(f"task {name!r} is not served") from None


# ----- run: submit Prepared.items to the engine -----------------------------------------------------------
def submit(dp, prep: Prepared, on_token=None, replica: int | None = None
           ) -> tuple[GenerationHandle | None, list[Future]]:
    """Queue ``prep`` on its model's engine (``replica``: that replica's engine): a generation gives its handle
    and ``[handle.future]``, other tasks ``(None, one future per item)``. ``on_token(token_id, piece)`` runs on
    the engine thread per token."""
    eng = dp.engine(prep.stand_in, replica)
    if TASKS[prep.task].generative:
        handle = eng.submit(prep.items[0], prep.params, on_token, adapter=prep.extra.get("adapter"))
        return handle, [handle.future]
    return None, [eng.submit(x) for x in prep.items]


def _prepare_sync(dp, model: str, inputs, task: str | None) -> Prepared:
    prep = task_named(task or dp.card(model).task).prepare(dp, model, inputs)
    if inputs.get("lora") is not None:
        # adapters are loaded per deployment by the gateway (`lora_adapters`); never silently serve the base model
        raise InvalidInputError("field 'lora': adapters are served by the gateway (`lora_adapters` in its config); "
                                "DataPlane.run serves base models only")
    return prep


def _stream(dp, prep: Prepared, handle: GenerationHandle) -> Iterator[dict]:
    """Server-sent-event payloads: ``{"response": piece}`` ..., then one with ``usage`` at the end."""
    try:
        for piece in handle:
            yield {"response": piece}
    finally:
        handle.cancel()  # a consumer that stops early frees the sequence's slot; no-op when finished
    yield {"response": "", "usage": TASKS[prep.task].shape(dp, prep, [handle.result()])["usage"]}


def run(dp, model: str, inputs, task: str | None = None):
    """The synchronous path: prepare, submit, wait, shape. Returns the Workers AI result of model ``model``'s
    task (``task`` names it to insist on one), or, for a generation with ``stream``, an iterator of
    ``{"response": piece}`` events and a final one with ``usage``."""
    prep = _prepare_sync(dp, model, inputs, task)
    handle, futures = submit(dp, prep)
    if handle is not None and prep.stream:
        return _stream(dp, prep, handle)
    return TASKS[prep.task].shape(dp, prep, [f.result() for f in futures])


def submit_generation(dp, model: str, inputs, on_token=None) -> GenerationHandle:
    """Validate and queue a text-generation request; returns the engine's handle (stream it, cancel it)."""
    return submit(dp, _prepare_sync(dp, model, inputs, "text-generation"), on_token)[0]


# `run` bound to one task; each row's prepare_fn and shape_fn docstrings give its input and result shapes.
def text_generation(dp, model: str, inputs):
    return run(dp, model, inputs, "text-generation")


def text_embeddings(dp, model: str, inputs) -> dict:
    return run(dp, model, inputs, "text-embeddings")


def text_classification(dp, model: str, inputs) -> list[dict]:
    return run(dp, model, inputs, "text-classification")


def text_reranking(dp, model: str, inputs) -> dict:
    return run(dp, model, inputs, "text-reranking")


def image_classification(dp, model: str, inputs) -> list[dict]:
    return run(dp, model, inputs, "image-classification")


def speech_recognition(dp, model: str, inputs) -> dict:
    return run(dp, model, inputs, "automatic-speech-recognition")


TASK_FUNCTIONS = {
    "text-generation": text_generation,
    "text-embeddings": text_embeddings,
    "text-classification": text_classification,
    "text-reranking": text_reranking,
    "image-classification": image_classification,
    "automatic-speech-recognition": speech_recognition,
}
