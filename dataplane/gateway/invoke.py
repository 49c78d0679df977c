"""Asynchronous task execution on the data-plane engines, split into *prepare* and *run*.

:func:`dataplane.tasks` validates, submits and blocks in one call. The gateway needs the request's size before
the control plane admits it (prompt tokens decide 3006 and the KV reservation) and must never block the event
loop, so here each task is two steps: :func:`prepare` validates and tokenizes (images and audio are decoded in a
worker thread) and returns a :class:`Prepared`; :func:`run` submits it to the stand-in's engine and awaits the
engine's futures. Inputs and results have the same Workers AI shapes as :mod:`dataplane.tasks`, whose field
checks are reused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dataplane import tasks
from dataplane.errors import CapacityError, InvalidInputError
from dataplane.tasks import MAX_BATCH_TEXTS, _bytes_field, _field, reranking_inputs

MEL_FRAMES_PER_S = 100  # log-mel features are 10 ms frames
MAX_IMAGE_PIXELS = 40_000_000  # ~160 MB of RGBA once decoded: bigger images are refused (413) unread


@dataclass
class Prepared:
    """A validated request: what the control plane needs (``units``, ``output_tokens``) and the engine input."""

    task: str
    stand_in: str
    units: int  # prompt tokens (the longest text for encoders), images, or audio seconds
    output_tokens: int = 0
    input_units: float = 0.0  # billed input: all tokens / images / audio minutes
    stream: bool = False
    items: list = field(default_factory=list)
    params: Any = None
    extra: dict = field(default_factory=dict)


@dataclass
class Finished:
    """A completed engine run: the Workers AI ``result``, when it was produced, and token usage."""

    result: Any
    t_done: float
    usage: dict = field(default_factory=dict)


async def prepare(dp, task: str, stand_in: str, inputs) -> Prepared:
    """Validate ``inputs`` for ``task`` and turn them into engine items (raises InvalidInputError/CapacityError)."""
    if not isinstance(inputs, dict):
        raise InvalidInputError("inputs must be a JSON object")
    model = dp.model(stand_in)
    if task == "text-generation":
        prompt, params, stream = tasks.generation_request(inputs)
        if _field(inputs, "ignore_eos", bool, False, False):  # vLLM's extension: exact output lengths
            params = replace(params, stop_on_eos=False)
        ids = model.tokenizer.encode(prompt) or [model.tokenizer.eos_id]
        n_ctx = model.spec.n_ctx
        if len(ids) >= n_ctx:
            raise CapacityError(f"prompt has {len(ids)} tokens; {stand_in}'s context holds {n_ctx}")
        out = min(params.max_tokens, n_ctx - len(ids))
        return Prepared(task, stand_in, len(ids), out, float(len(ids)), stream, [ids], params)
    if task == "text-embeddings":
        text = _field(inputs, "text", (str, list))
        texts = [text] if isinstance(text, str) else text
        if not texts or len(texts) > MAX_BATCH_TEXTS or not all(isinstance(t, str) for t in texts):
            raise InvalidInputError(f"field 'text' must be a string or hold 1 to {MAX_BATCH_TEXTS} strings")
        encs = [model.encode(t) for t in texts]
        return Prepared(task, stand_in, max(len(e) for e in encs), 0, float(sum(len(e) for e in encs)),
                        items=encs)
    if task == "text-classification":
        enc = model.encode(_field(inputs, "text", str))
        return Prepared(task, stand_in, len(enc), 0, float(len(enc)), items=[enc])
    if task == "text-reranking":
        query, contexts, top_k = reranking_inputs(inputs)
        encs = [model.encode(query, c["text"]) for c in contexts]
        return Prepared(task, stand_in, max(len(e) for e in encs), 0, float(sum(len(e) for e in encs)),
                        items=encs, extra={"top_k": top_k})
    if task == "image-classification":
        data = _bytes_field(inputs, "image")
        x = await asyncio.to_thread(_preprocess_image, model, data)
        return Prepared(task, stand_in, 1, 0, 1.0, items=[x])
    if task == "automatic-speech-recognition":
        data = _bytes_field(inputs, "audio")
        mel = await asyncio.to_thread(model.features, data)
        seconds = mel.shape[1] / MEL_FRAMES_PER_S
        return Prepared(task, stand_in, max(1, round(seconds)), 0, seconds / 60.0, items=[mel])
    raise InvalidInputError(f"task {task!r} is not served")


def _preprocess_image(model, data: bytes) -> np.ndarray:
    """Decode and resize an image, refusing decompression bombs before any pixel is decoded."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            w, h = img.size
    except Exception as exc:
        raise InvalidInputError(f"image bytes could not be decoded ({type(exc).__name__})") from None
    if w * h > MAX_IMAGE_PIXELS:
        raise CapacityError(f"image is {w}x{h} pixels; at most {MAX_IMAGE_PIXELS:,} are accepted")
    return model.preprocess(data)


def _softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max())
    return p / p.sum()


def _shape(dp, prep: Prepared, outs: list):
    """Engine outputs -> the Workers AI result of the task (as :mod:`dataplane.tasks` shapes it)."""
    m = dp.model(prep.stand_in)
    if prep.task == "text-embeddings":
        return {"shape": [len(outs), int(outs[0].shape[0])], "data": [r.astype(float).tolist() for r in outs]}
    if prep.task == "text-classification":
        p = _softmax(outs[0])
        return sorted(({"label": lab, "score": float(s)} for lab, s in zip(m.labels, p, strict=True)),
                      key=lambda d: -d["score"])
    if prep.task == "text-reranking":
        scored = [{"id": i, "score": float(1 / (1 + np.exp(-lg[0])))} for i, lg in enumerate(outs)]
        scored.sort(key=lambda d: -d["score"])
        k = prep.extra.get("top_k")
        return {"response": scored[:k] if k else scored}
    if prep.task == "image-classification":
        probs = outs[0]
        return [{"label": m.labels[i], "score": float(probs[i])} for i in np.argsort(-probs)[:5]]
    text = outs[0]
    return {"text": text, "word_count": len(text.split())}


def workers_usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """The Workers AI ``usage`` object; ``prompt_tokens_details.cached_tokens`` (OpenAI's field) appears when a
    prefix of the prompt was served from the prefix KV cache."""
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


class EngineRun:
    """Work submitted to an engine: awaitable, cancellable, with a future that completes when the engine is done
    with it (success, failure or cancellation), which is when the control-plane slot is released."""

    def __init__(self, dp, prep: Prepared, on_piece=None):
        self.prep, self.dp = prep, dp
        self.handle = None
        eng = dp.engine(prep.stand_in)
        if prep.task == "text-generation":
            self.handle = eng.submit(prep.items[0], prep.params, on_piece, adapter=prep.extra.get("adapter"))
            self._cfutures = [self.handle.future]
        else:
            self._cfutures = [eng.submit(x) for x in prep.items]
        self.futures = [asyncio.wrap_future(f) for f in self._cfutures]
        self.done = asyncio.gather(*self.futures, return_exceptions=True)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        for f in self._cfutures:
            f.cancel()  # a queued encoder item is skipped; a running one finishes

    async def result(self) -> Finished:
        """Wait for the outputs and shape them (raises the engine's error)."""
        outs = [await f for f in self.futures]
        t = time.monotonic()
        if self.handle is not None:
            res = outs[0]
            p, c = res.prompt_tokens, res.completion_tokens
            return Finished({"response": res.text, "usage": workers_usage(p, c, res.cached_tokens)},
                            t, {"prompt_tokens": p, "completion_tokens": c, "finish_reason": res.finish_reason,
                                "cached_tokens": res.cached_tokens})
        n = int(round(self.prep.input_units)) if self.prep.task.startswith("text-") else 0
        return Finished(_shape(self.dp, self.prep, outs), t, {"prompt_tokens": n, "completion_tokens": 0})


class TokenStream:
    """Text pieces of a generation as they are produced, each with its monotonic production time."""

    def __init__(self, dp, prep: Prepared):
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        put = self._queue.put_nowait

        def on_piece(_token: int, piece: str) -> None:  # engine thread: hand over to the loop
            if piece:
                loop.call_soon_threadsafe(put, (piece, time.monotonic()))

        self.run = EngineRun(dp, prep, on_piece)
        self.run.done.add_done_callback(lambda _f: put(None))  # after every piece (FIFO on the loop)
        self.sent_text: list[str] = []

    async def pieces(self) -> AsyncIterator[tuple[str, float]]:
        """(piece, produced_at) until the generation ends; then the decoder's tail, if any."""
        while (item := await self._queue.get()) is not None:
            self.sent_text.append(item[0])
            yield item
        fut = self.run.futures[0]
        if fut.exception() is not None:
            raise fut.exception()
        text, sent = fut.result().text, "".join(self.sent_text)
        if len(text) > len(sent) and text.startswith(sent):
            yield text[len(sent):], time.monotonic()

    def usage(self) -> dict:
        fut = self.run.futures[0]
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            return {}
        res = fut.result()
        p, c = res.prompt_tokens, res.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "finish_reason": res.finish_reason, "cached_tokens": res.cached_tokens}
