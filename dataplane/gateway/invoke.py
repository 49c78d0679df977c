"""The gateway's asynchronous *run* step around the task table's prepare and shape (:mod:`dataplane.tasks`).

:meth:`DataPlane.run` validates, submits and blocks in one call. The gateway needs the request's size before the
control plane admits it (prompt tokens decide 3006 and the KV reservation) and must never block the event loop,
so it takes the steps apart:

* :func:`prepare` - the task's ``prepare`` from :data:`~dataplane.tasks.TASKS` (validation, tokenizing; in a
  worker thread for tasks marked ``heavy``: image decoding, audio features), giving a :class:`Prepared`;
* :class:`EngineRun` - submits it (:func:`dataplane.tasks.submit`) to the engine of the replica the control plane
  chose, awaits the engine's futures and shapes them with the task's ``shape`` into a :class:`Finished`;
* :class:`TokenStream` - a generation's text pieces as the engine produces them.

:class:`Prepared` and :func:`workers_usage` are defined with the table and re-exported here for the gateway.

Validation and result shapes live only in the table, so the gateway and :meth:`DataPlane.run` answer alike.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dataplane import tasks
from dataplane.tasks import Prepared, workers_usage

__all__ = ["EngineRun", "Finished", "Prepared", "TokenStream", "prepare", "workers_usage"]


@dataclass
class Finished:
    """A completed engine run: the Workers AI ``result``, when it was produced, and token usage."""

    result: Any
    t_done: float
    usage: dict = field(default_factory=dict)


# Inputs with more text than this (characters) are tokenized in a worker thread too: megabytes of text take
# seconds, and on the event loop every other request (health checks included) would wait for them.
THREAD_TEXT_CHARS = 100_000


async def prepare(dp, task: str, stand_in: str, inputs) -> Prepared:
    """Validate ``inputs`` for ``task`` and turn them into engine items (raises InvalidInputError/CapacityError)."""
    row = tasks.task_named(task)
    if row.heavy or _text_chars(inputs, THREAD_TEXT_CHARS) > THREAD_TEXT_CHARS:
        return await asyncio.to_thread(row.prepare, dp, stand_in, inputs)
    return row.prepare(dp, stand_in, inputs)  # a little text: cheaper than a hop to a thread and back


def _text_chars(value, cap: int) -> int:
    """Characters of text in ``value`` (strings in nested lists and objects), counted up to just past ``cap``."""
    if isinstance(value, str):
        return len(value)
    total = 0
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        total += _text_chars(item, cap - total)
        if total > cap:
            break
    return total


class EngineRun:
    """Work submitted to an engine: awaitable, cancellable, with a future that completes when the engine is done
    with it (success, failure or cancellation), which is when the control-plane slot is released."""

    def __init__(self, dp, prep: Prepared, on_piece=None, replica: int | None = None):
        self.prep, self.dp, self.task = prep, dp, tasks.TASKS[prep.task]
        self.handle, self._cfutures = tasks.submit(dp, prep, on_piece, replica)
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
        result = self.task.shape(self.dp, self.prep, outs)
        # ``usage`` here is the gateway's metrics record, not the Workers AI field (that is in ``result``).
        if self.handle is not None:
            res = outs[0]
            return Finished(result, t, {"prompt_tokens": res.prompt_tokens,
                                        "completion_tokens": res.completion_tokens,
                                        "finish_reason": res.finish_reason, "cached_tokens": res.cached_tokens})
        n = int(round(self.prep.input_units)) if self.task.unit == "tokens" else 0
        return Finished(result, t, {"prompt_tokens": n, "completion_tokens": 0})


class TokenStream:
    """Text pieces of a generation as they are produced, each with its monotonic production time."""

    def __init__(self, dp, prep: Prepared, replica: int | None = None):
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        put = self._queue.put_nowait

        def on_piece(_token: int, piece: str) -> None:  # engine thread: hand over to the loop
            if piece:
                loop.call_soon_threadsafe(put, (piece, time.monotonic()))

        self.run = EngineRun(dp, prep, on_piece, replica)
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
            # The decoder's tail was produced when the engine finalised the request, not when this consumer
            # (which waits out each earlier piece's return delay) comes to ask for it.
            timing = getattr(self.run.handle, "timing", None)
            done = getattr(timing, "finished", math.nan)
            yield text[len(sent):], done if math.isfinite(done) else time.monotonic()

    def usage(self) -> dict:
        fut = self.run.futures[0]
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            return {}
        res = fut.result()
        p, c = res.prompt_tokens, res.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "finish_reason": res.finish_reason, "cached_tokens": res.cached_tokens}
