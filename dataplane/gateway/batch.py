"""Async batch: ``?queueRequest=true`` jobs stored in SQLite and run in the background through the same path as
live requests (control plane, engines, WAN delays), at most ``batch_concurrency`` items at a time.

Items refused for capacity (3040) or that time out in a queue (3007) go back to the store and are retried after a
short pause (or the refusal's ``Retry-After``); any other error is that item's outcome (``success: false``). All
SQLite work happens on one worker thread so the event loop never waits on a disk sync.

Items of a model this server does not serve (a restart with other ``--models``) are neither run nor failed: they
stay queued for a server that serves it (logged once at start), and their job still answers polls.

Batch items are not counted against the per-minute rate limits (the submission is), but they spend the
account's neuron budget like any request.

Shutdown: :meth:`BatchService.drain` (on SIGTERM/SIGINT) stops claiming items; :meth:`BatchService.stop` lets
the items already running finish until the drain deadline, or until :meth:`BatchService.force` (a second SIGINT),
then cancels the rest and puts them back in the queue, so the next start runs them; queued items simply stay
queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dataplane.gateway.batch_store import BatchStore
from dataplane.gateway.errors import NOT_FOUND, GatewayError, bad_input, from_exception, retried

_SURROGATE = re.compile("[\ud800-\udfff]")  # (a lone one: JSON escapes can make one)

MAX_REQUESTS = 10_000
RETRY_S = 0.25
IDLE_POLL_S = 0.5
STORE_RETRY_S = 1.0
STOP_CLAIM_S = 5.0  # how long stop waits for the runner to finish a claim under way
log = logging.getLogger("edgepop.gateway")


class BatchService:
    """Stores jobs, answers polls and runs queued items."""

    def __init__(self, gw, path: str | Path, concurrency: int = 4):
        self.gw, self.concurrency = gw, concurrency
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edgepop-sqlite")
        self.store: BatchStore = self._pool.submit(BatchStore, path).result()
        self.cached_counts = self.store.counts()
        if gw is not None:
            waiting = self._pool.submit(self.store.waiting, self._served()).result()
            if waiting:
                log.warning("batch: jobs queued for models this server does not serve wait for a server that does: "
                            "%s", "; ".join(f"{m}: {len(jobs)} job(s) {', '.join(jobs[:3])}"
                                            f"{', ...' if len(jobs) > 3 else ''}" for m, jobs in waiting.items()))
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._inflight: dict[asyncio.Task, dict] = {}  # running item tasks -> their item
        self.requeued_at_stop = 0
        self._forced = asyncio.Event()  # a forced exit: stop waits no longer for running items
        self._draining = False  # claim no more; a claim under way finishes and its items run
        self.store_errors = 0  # rounds of the runner that the store failed (logged; the runner retried)

    async def _db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def submit(self, account: str, model: str, body: dict, place) -> dict:
        """Queue ``body["requests"]``; returns the Workers AI ``result`` ({status, request_id, model})."""
        reqs = self.check(model, body)
        job = await self._db(self.store.create, account, model, reqs, place.lat, place.lon)
        if self._wake is not None:
            self._wake.set()
        return {"status": "queued", "request_id": job, "model": model}

    def check(self, model: str, body: dict) -> list:
        """The submission's items, once its model is served (5007) and its body well formed (400)."""
        self.gw.spec(model)
        reqs = body.get("requests")
        if not isinstance(reqs, list) or not reqs or len(reqs) > MAX_REQUESTS:
            raise bad_input(f"field 'requests' must be a list of 1 to {MAX_REQUESTS} input objects")
        for i, r in enumerate(reqs):
            if not isinstance(r, dict):
                raise bad_input(f"requests[{i}] is not an object")
            ref = r.get("external_reference")
            # stored as text, echoed back (a lone surrogate, which UTF-8 cannot store, never gets past parse_json)
            if ref is not None and not isinstance(ref, str):
                raise bad_input(f"requests[{i}].external_reference must be a string, got {type(ref).__name__}")
        return reqs

    async def poll(self, account: str, request_id, served: bool = True) -> dict:
        """The job's status, or all its responses once every item is done (404 for another account's job).
        ``served``: whether this server runs the job's model (a job of a model it does not serve only waits)."""
        if not isinstance(request_id, str) or not request_id:
            raise bad_input("field 'request_id' must be a non-empty string")
        head = await self._db(self.store.progress, account, request_id)
        if head is None:
            raise GatewayError(404, NOT_FOUND, f"no batch request {request_id!r} for this account")
        model, total, done, running = head
        if done < total:  # (a failed item is done too: its response says success false)
            # running: an item runs now, or some are done and the runner here will take the rest; queued: items
            # wait and none runs (nothing claimed yet, or a model this server does not serve)
            status = "running" if running or (done and served) else "queued"
            return {"status": status, "request_id": request_id, "model": model, "completed": done, "total": total}
        rows = await self._db(self.store.results, request_id)
        # 10,000 results can be tens of MB of JSON: decoded and added up on a worker thread, not the event loop
        return await asyncio.to_thread(_done, request_id, model, rows)

    async def poll_unserved(self, account: str, model: str, body: bytes) -> dict | None:
        """A poll through the URL of a model not served here, of a job queued for that model (before a restart
        dropped it): the job's status; None for anything else (the route answers 5007, as for any request)."""
        try:
            inputs = json.loads(body)
        except (ValueError, RecursionError):  # (malformed, or nested past the parser's depth)
            return None
        rid = inputs.get("request_id") if isinstance(inputs, dict) else None
        if not isinstance(rid, str) or not rid or not rid.isprintable() or _SURROGATE.search(rid):
            return None  # (a lone surrogate has no UTF-8 for SQLite; no id the store made is unprintable)
        if await self._db(self.store.model_of, account, rid) != model:
            return None
        return await self.poll(account, rid, served=False)

    def _served(self) -> list[str]:
        return self.gw.backend.catalog.ids

    # ------------------------------------------------------------------ background runner
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="edgepop-batch")

    def drain(self) -> None:
        """Claim no more items (the ones running go on). The runner is told, not cancelled: a cancel that landed
        while a claim committed left its items marked running with no task, put back in the queue at stop instead
        of running in the drain as the others do."""
        self._draining = True
        if self._wake is not None:
            self._wake.set()

    def force(self) -> None:
        """A forced exit (a second SIGINT): :meth:`stop` cancels the running items now instead of waiting."""
        self._forced.set()

    async def stop(self, timeout_s: float = 0.0) -> None:
        """Stop claiming, give running items ``timeout_s`` to finish (less if :meth:`force` comes first), cancel
        and requeue the rest, close the store."""
        if self._task is not None:
            self.drain()
            # The runner ends at its next step; one held up by a failing store (retries back off up to 30 s) is
            # cancelled after a while.
            await asyncio.wait({self._task}, timeout=STOP_CLAIM_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        running = dict(self._inflight)
        if running and timeout_s > 0 and not self._forced.is_set():
            log.warning("drain: waiting up to %g s for %d running batch items (SIGINT again to stop now: they go "
                        "back to the queue)", timeout_s, len(running))
            waits = [asyncio.ensure_future(asyncio.wait(list(running))), asyncio.ensure_future(self._forced.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:  # (cancelling the wait leaves the items running; they are cancelled below)
                    w.cancel()
        left = {t: item for t, item in running.items() if not t.done()}
        for t in left:
            t.cancel()
        for t in left:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        try:
            for item in left.values():  # back to the queue now, not left 'running' for crash recovery
                await self._db(self.store.requeue, item["job"], item["idx"], 0.0)
            # Nothing runs now; a claim the drain interrupted may still have marked items running in the store:
            # they go back as a killed process's would.
            self.requeued_at_stop = len(left) + await self._db(self.store.recover)
        except Exception:  # a store that fails now: the next start's recovery re-queues what is left running
            log.exception("batch store failed at shutdown; the next start re-queues the items left running")
        finally:
            self._pool.submit(self.store.close).result()
            self._pool.shutdown()

    async def _loop(self) -> None:
        failures = 0
        while not self._draining:
            try:
                await self._claim_and_wait()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # a locked or full database: the queue waits, the runner goes on
                failures += 1
                await self._store_failed("claiming items", failures)

    async def _store_failed(self, what: str, failures: int) -> None:
        """Log a store failure (in full the first time, then one line) and wait before the next try: 1 s, doubling
        up to 30 s while it keeps failing."""
        self.store_errors += 1
        wait = min(STORE_RETRY_S * 2 ** (failures - 1), 30.0)
        if failures == 1:
            log.exception("batch store failed %s; retrying in %g s", what, wait)
        else:
            log.warning("batch store still failing %s (%d tries); retrying in %g s", what, failures, wait)
        await asyncio.sleep(wait)

    async def _write(self, fn, *args) -> None:
        """A store write an item's outcome depends on, retried until the store takes it (a failed write is the
        store's problem, never the item's outcome)."""
        failures = 0
        while True:
            try:
                return await self._db(fn, *args)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                await self._store_failed(f"recording a batch item ({fn.__name__})", failures)

    async def _claim_and_wait(self) -> None:
        """One round: claim what there is room for, start it, wait for a wake-up (unless more is waiting)."""
        room = self.concurrency - len(self._inflight)
        claimed = await self._db(self.store.claim, room, None, self._served()) if room > 0 else []
        for item in claimed:
            t = asyncio.get_running_loop().create_task(self._run_item(item))
            self._inflight[t] = item
            t.add_done_callback(self._item_finished)
        self.cached_counts = await self._db(self.store.counts)
        if claimed and len(self._inflight) < self.concurrency:
            return
        self._wake.clear()
        if self._draining:  # (a drain during the claim set the wake-up just cleared)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=IDLE_POLL_S)

    def _item_finished(self, task: asyncio.Task) -> None:
        self._inflight.pop(task, None)
        if self._wake is not None:
            self._wake.set()

    async def _run_item(self, item: dict) -> None:
        inputs = dict(item["input"])
        inputs.pop("stream", None)  # a batch item is answered whole
        inputs.pop("options", None)  # (rejectIfBusy: a batch item waits its turn; the /run route drops it too)
        place = self.gw.locator.at(item["lat"], item["lon"], "batch")
        try:
            _, fin = await self.gw.infer(item["model"], inputs, place, account=item["account"], endpoint="batch",
                                         limited=False, retried=True)
        except asyncio.CancelledError:
            raise  # shutting down: stop() puts the item back in the queue
        except Exception as exc:
            err = from_exception(exc)
            if retried(err):  # capacity or queue timeout: try again (counted when it ends)
                await self._write(self.store.requeue, item["job"], item["idx"], max(RETRY_S, err.retry_after_s or 0))
            else:  # an engine that ran past --request-timeout (3007) included: that item's outcome
                await self._write(self.store.complete, item["job"], item["idx"],
                                  {"errors": [{"code": err.code, "message": err.message}]}, False)
        else:
            await self._write(self.store.complete, item["job"], item["idx"],
                              {"result": fin.result, "usage": _usage(fin)}, True)


def _done(request_id: str, model: str, rows: list[tuple]) -> dict:
    """A finished job's poll result from its stored rows (:meth:`BatchStore.results`)."""
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    responses = []
    for idx, text, success, ref in rows:
        res = json.loads(text) if text is not None else {}
        success = bool(success) if success is not None else None
        for k in usage:
            usage[k] += int(res.get("usage", {}).get(k, 0)) if success else 0
        entry = {"id": idx, "success": success, "external_reference": ref}
        entry.update({"result": res.get("result")} if success else {"errors": res.get("errors", [])})
        responses.append(entry)
    return {"status": "done", "request_id": request_id, "model": model, "responses": responses, "usage": usage}


async def poll_response(content: dict):
    """``content`` (a poll's envelope) as a JSON response encoded on a worker thread, as Starlette's
    ``JSONResponse`` would encode it; FastAPI would otherwise walk and encode a big job's responses on the loop."""
    from starlette.responses import Response

    return Response(await asyncio.to_thread(_encode, content), media_type="application/json")


def _encode(content: dict) -> bytes:
    # One response at a time: one json.dumps holds the GIL throughout, so a single call over tens of MB would stall
    # the event loop's thread even from a worker thread.
    result = content.get("result")
    responses = result.get("responses") if isinstance(result, dict) else None
    if not responses:
        return _dumps(content)
    head = _dumps({**content, "result": {**result, "responses": []}})
    at = head.index(b'"responses":[]') + len(b'"responses":[')  # (a key inside a string would be escaped)
    return b"".join((head[:at], b",".join(_dumps(r) for r in responses), head[at:]))


def _dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _usage(fin) -> dict:
    p = int(fin.usage.get("prompt_tokens", 0) or 0)
    c = int(fin.usage.get("completion_tokens", 0) or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

