"""Every way a request can end returns what it held: the LM engine's KV reservation on finish, failure and every
kind of cancel (its handle's, its future's, an awaited ``wrap_future``'s); the batching engine's thread survives a
``run_batch`` that raises or breaks its one-result-per-item contract."""

from __future__ import annotations

import asyncio
import threading

import pytest
from kit.waiting import until

from dataplane.engine_batch import BatchConfig, BatchingEngine, BatchResultError
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.sampling import SamplingParams

LONG = SamplingParams(max_tokens=100, seed=1, stop_on_eos=False)  # "hello world" + 100 tokens = 111 reserved


def _until(cond, what: str, limit: float = 60.0) -> None:
    """Hang guard only: poll ``cond`` for a generous while."""
    until(cond, f"gave up waiting for {what}", limit, 0.005)


@pytest.fixture
def small(lm):
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=400))  # three of LONG fit, not four
    yield eng
    eng.close()


def _started(eng: LMEngine, on_token=None):
    h = eng.submit("hello world", LONG, on_token=on_token)
    _until(lambda: h.token_ids, "a first token")
    return h


def _held(eng: LMEngine):
    """A request that has its first token and cannot make another until ``release.set()``: the engine thread waits
    in its token callback, so the request cannot run to its end before the test cancels it (a fast machine, or a
    test thread paused on a loaded one, would otherwise race it)."""
    release = threading.Event()
    return _started(eng, on_token=lambda tok, text: release.wait(60)), release


def _budget_is_whole_again(eng: LMEngine) -> None:
    _until(lambda: eng._reserved == 0 and not eng.active, "the reservations to come back")
    fresh = [eng.submit("hello world", LONG) for _ in range(3)]  # (a leak would keep some of them waiting)
    _until(lambda: all(h.token_ids for h in fresh), "three fresh requests admitted together")
    assert [h.result(60).finish_reason for h in fresh] == ["length"] * 3
    assert eng._reserved == 0


def test_gateway_style_cancel_returns_the_reservation(small):
    for _ in range(4):  # the gateway on a disconnect: cancel the handle, then the future itself
        h, release = _held(small)
        h.cancel()
        assert h.future.cancel()
        release.set()
        _until(lambda: not small.active, "the cancelled row to leave")
    _budget_is_whole_again(small)


def test_cancelling_only_the_future_stops_the_request_and_returns_the_reservation(small):
    for _ in range(4):  # more than the budget holds at once
        h, release = _held(small)
        assert h.future.cancel() and h.cancelled
        release.set()
        _until(lambda: not small.active, "the cancelled row to leave")
        assert len(h.token_ids) < 100  # stopped early, not run to max_tokens
    _budget_is_whole_again(small)


def test_cancelled_await_of_wrap_future_returns_the_reservation(small):
    async def main():
        release = threading.Event()
        h = small.submit("hello world", LONG, on_token=lambda tok, text: release.wait(60))  # (see _held)
        task = asyncio.ensure_future(asyncio.wrap_future(h.future))
        while not h.token_ids:
            await asyncio.sleep(0.005)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            release.set()
        return h

    for _ in range(3):
        h = asyncio.run(asyncio.wait_for(main(), 60))
        assert h.future.cancelled()
    _budget_is_whole_again(small)


def test_cancel_while_queued_and_stream_iterators_end(small):
    hold, release = threading.Event(), threading.Event()
    # once all three run, the engine waits in their token callback until released: none can end before it is
    # cancelled, so the budget stays full and the fourth stays queued
    running = [_started(small, on_token=lambda tok, text: hold.is_set() and release.wait(60)) for _ in range(3)]
    hold.set()
    queued = small.submit("hello world", LONG)
    assert queued.future.cancel()
    done = threading.Event()

    def drain():
        try:
            list(running[0])
        except BaseException:  # a cancelled future's stream ends by raising CancelledError
            done.set()

    threading.Thread(target=drain, daemon=True).start()
    for h in running:
        assert h.future.cancel()
    release.set()
    assert done.wait(60)  # the stream of a request whose future was cancelled still ends
    _budget_is_whole_again(small)
    assert not queued.token_ids


def test_failed_requests_return_the_reservation(small):
    def boom(tok, text):
        raise RuntimeError("callback failed")

    for _ in range(4):
        h = small.submit("hello world", LONG, on_token=boom)
        with pytest.raises(RuntimeError, match="callback failed"):
            h.result(60)
    _budget_is_whole_again(small)


def _short_by_one(calls):
    def run(items):
        calls.append(list(items))
        return [x * 2 for x in items[:-1]] if len(items) > 1 else [items[0] * 2]

    return run


def test_wrong_result_count_fails_the_batch_clearly_and_the_engine_lives_on():
    calls: list = []
    eng = BatchingEngine(_short_by_one(calls), BatchConfig(max_batch=4, max_wait_ms=200), name="short")
    try:
        with eng._cond:  # queue all three before the thread can take a batch
            futs = [eng.submit(i) for i in range(3)]
        for f in futs:
            with pytest.raises(BatchResultError, match=r"model 'short' returned 2 results for a batch of 3 items"):
                f.result(30)
        assert eng._thread.is_alive()
        assert eng.submit(10).result(30) == 20  # later requests are served
    finally:
        eng.close()


def test_run_batch_returning_no_list_or_raising_anything_fails_only_its_items():
    def run(items):
        if items == ["none"]:
            return None
        if items == ["exit"]:
            raise SystemExit(3)
        return [x.upper() for x in items]

    eng = BatchingEngine(run, BatchConfig(max_batch=1, max_wait_ms=0), name="odd")
    try:
        with pytest.raises(BatchResultError, match="a NoneType, not a list"):
            eng.submit("none").result(30)
        with pytest.raises(SystemExit):
            eng.submit("exit").result(30)
        assert eng.submit("ok").result(30) == "OK"
        assert eng._thread.is_alive()
    finally:
        eng.close()
