"""Dynamic batching engine: requests queue up and run together (up to ``max_batch``, waiting at most
``max_wait_ms`` after the first one arrives).

Used for encoders, image and speech models. Thread-safe: ``submit`` may be called from any thread and
returns a :class:`concurrent.futures.Future` (``asyncio.wrap_future`` makes it awaitable). If a batch
fails, its items are retried one by one so that a bad item fails alone; cancelled futures are skipped. A
``run_batch`` that returns the wrong number of results fails that batch's items with :class:`BatchResultError`
(naming the model and the counts); the engine thread outlives anything ``run_batch`` raises or returns.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from dataplane.errors import EngineClosedError

MAX_WAIT_MS = 86_400_000.0  # a day, as the gateway's encoder_max_wait_ms allows


@dataclass(frozen=True)
class BatchConfig:
    """``max_batch`` items per call; the first item of a batch waits at most ``max_wait_ms`` for company."""

    max_batch: int = 32
    max_wait_ms: float = 2.0

    def __post_init__(self):
        # max_batch=0 made the engine thread spin on empty batches; a huge wait overflowed Condition.wait.
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"BatchConfig.max_batch must be a positive integer, got {self.max_batch!r}")
        w = self.max_wait_ms
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= MAX_WAIT_MS:
            raise ValueError(f"BatchConfig.max_wait_ms must be a number of milliseconds in [0, {MAX_WAIT_MS:g}], "
                             f"got {w!r}")


@dataclass
class BatchStats:
    """What a batching engine has run: batches and items (``mean_batch``: items per batch)."""
    batches: int = 0
    items: int = 0

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class BatchingEngine:
    """Runs ``run_batch(items) -> results`` (one result per item, same order) on a background thread."""

    def __init__(self, run_batch: Callable[[list[Any]], list[Any]], config: BatchConfig | None = None,
                 name: str = "batch"):
        self.run_batch = run_batch
        self.name = name
        self.config = config or BatchConfig()
        self.stats = BatchStats()
        self._queue: collections.deque[tuple[Any, Future, float]] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"edgepop-{name}", daemon=True)
        self._thread.start()

    def submit(self, item: Any) -> Future:
        """Queue one (already validated) item; the future resolves to its result or exception."""
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise EngineClosedError("engine is closed")
            self._queue.append((item, fut, time.monotonic()))
            self._cond.notify()
        return fut

    def __call__(self, item: Any, timeout: float | None = None) -> Any:
        """Submit and wait (a convenience for synchronous callers)."""
        return self.submit(item).result(timeout)

    def close(self) -> None:
        """Stop accepting work, finish what is queued, and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _take_batch(self) -> list[tuple[Any, Future, float]] | None:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._queue[0][2] + self.config.max_wait_ms / 1000.0
            while len(self._queue) < self.config.max_batch and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            n = min(self.config.max_batch, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            live = [(item, fut) for item, fut, _ in batch if fut.set_running_or_notify_cancel()]
            if not live:
                continue
            self.stats.batches += 1
            self.stats.items += len(live)
            try:
                results = self.run_batch([item for item, _ in live])
            except BaseException:  # isolate the culprit: each item gets its own call and outcome
                for item, fut in live:
                    self._run_one(item, fut)
                continue
            self._deliver(live, results)

    def _deliver(self, live: list[tuple[Any, Future]], results: Any) -> None:
        """One result per item, in order; any other count fails every item (which result is whose is unknown)."""
        try:
            n = len(results)
        except TypeError:
            n = None
        if n != len(live):
            got = (f"{n} result{'' if n == 1 else 's'}" if n is not None
                   else f"a {type(results).__name__}, not a list")
            err = BatchResultError(f"model {self.name!r} returned {got} for a batch of {len(live)} items")
            for _, fut in live:
                _resolve(fut, error=err)
            return
        for (_, fut), res in zip(live, results, strict=True):
            _resolve(fut, res)

    def _run_one(self, item: Any, fut: Future) -> None:
        try:
            results = self.run_batch([item])
        except BaseException as exc:  # the item's own failure, delivered to its caller only
            _resolve(fut, error=exc)
        else:
            self._deliver([(item, fut)], results)


class BatchResultError(RuntimeError):
    """``run_batch`` broke its contract (one result per item, same order): a fault of the model, not the input."""


def _resolve(fut: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set an outcome unless the future already has one; never raises, so the engine thread survives."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass
