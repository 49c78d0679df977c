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
* :mod:`dataplane.task_inputs` - the field parsers the prepares use, the chat template and the text-generation
  and reranking requests.
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
from dataplane.task_inputs import (  # noqa: F401  (MAX_BATCH_TEXTS, chat_prompt, ...: read from here too)
    GENERATION_FIELDS,
    MAX_BATCH_TEXTS,
    NEUTRAL_ONLY,
    ROLES,
    _bytes_field,
    _field,
    _require_object,
    _unicode,
    chat_prompt,
    generation_request,
    reranking_inputs,
)

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
    """Run one ``text-generation`` request through the task table (``run`` bound to the task)."""
    return run(dp, model, inputs, "text-generation")


def text_embeddings(dp, model: str, inputs) -> dict:
    """Run one ``text-embeddings`` request through the task table (``run`` bound to the task)."""
    return run(dp, model, inputs, "text-embeddings")


def text_classification(dp, model: str, inputs) -> list[dict]:
    """Run one ``text-classification`` request through the task table (``run`` bound to the task)."""
    return run(dp, model, inputs, "text-classification")


def text_reranking(dp, model: str, inputs) -> dict:
    """Run one ``text-reranking`` request through the task table (``run`` bound to the task)."""
    return run(dp, model, inputs, "text-reranking")


def image_classification(dp, model: str, inputs) -> list[dict]:
    """Run one ``image-classification`` request through the task table (``run`` bound to the task)."""
    return run(dp, model, inputs, "image-classification")


def speech_recognition(dp, model: str, inputs) -> dict:
    """Run one ``automatic-speech-recognition`` request through the task table (``run`` bound to the
    task)."""
    return run(dp, model, inputs, "automatic-speech-recognition")


TASK_FUNCTIONS = {
    "text-generation": text_generation,
    "text-embeddings": text_embeddings,
    "text-classification": text_classification,
    "text-reranking": text_reranking,
    "image-classification": image_classification,
    "automatic-speech-recognition": speech_recognition,
}
