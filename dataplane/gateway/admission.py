"""The asyncio bridge to the control plane: submit, wait for a slot, release, and the timer that expires queues.

The control plane is a pure library that is not thread-safe, so every call to it happens on the event loop's
thread. Its ``now`` is the plane's own clock, as in the simulator: seconds since the plane started (``t0``, a
``time.monotonic()`` reading), so idle times and the ``scheduled`` autoscaler's hours mean what they mean
simulated (machine uptime would read as hours of idleness). Leases, the shedder and the caller keep
``time.monotonic()``. A request the control plane queues waits on an asyncio future that
is resolved when another request's :meth:`Admission.release` (``plane.finish``) starts it, or failed with 3007
when :meth:`ControlPlane.poll` expires it.

A request naming a LoRA adapter also takes an adapter slot of its replica once it is there
(:meth:`ControlPlane.acquire_adapter`); with every slot in use it waits for one, and releasing a request hands
its slot to the next waiter (:meth:`ControlPlane.release_adapter`). The live engines hold every served adapter,
so only the slot bookkeeping (what the ``adapter-aware`` router reads) is emulated, not the copy time.

Load shedding (:class:`~dataplane.gateway.shedding.LoadShedder`) sits in front of the control plane: a request
whose estimated wait is over the bound on every engine that can serve its model is refused at once (429/3040)
with a ``Retry-After`` from the engines' drain estimate. Otherwise the replicas whose engine is over the bound are
withheld from the routing decision (``ControlPlane.submit(avoid=...)``), as full replicas are, so the request
spills over to one that can take it rather than being shed at the nearest while the others idle; when nothing
else can take it, it is shed the same way. The control plane's own capacity refusals (queue full,
``rejectIfBusy``) get the same ``Retry-After``. Every admitted request counts as outstanding work on its
replica's engine (``engine_key``) until it is released.

Invariant (tested): every submitted request is released exactly once, so the plane's running counts and the
shedder's outstanding counts return to zero when the gateway is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time

from controlplane.outcomes import Code
from controlplane.plane import ControlPlane
from controlplane.routing.base import QUEUE, REJECT, Decision
from controlplane.state import Request
from dataplane.gateway.errors import from_code, queue_timeout, shed
from dataplane.gateway.shedding import LoadShedder


class Lease:
    """A request the control plane admitted: where it goes, and whether it holds (or waits for) a slot."""

    __slots__ = ("req", "decision", "started", "released", "queued_at", "started_at", "adapter", "ticket")

    def __init__(self, req: Request, decision: Decision, started: asyncio.Future, now: float):
        self.req, self.decision, self.started = req, decision, started
        self.ticket = None  # the shedder's note of it, on its replica's engine
        self.released = False
        self.adapter: asyncio.Future | None = None  # set while waiting for an adapter slot
        self.queued_at = now
        self.started_at = now if started.done() else math.nan

    @property
    def replica(self):
        return self.req.replica

    @property
    def queued(self) -> bool:
        return self.decision.action == QUEUE


class Admission:
    """Owns the control plane (and the load shedder in front of it) on the event loop.

    ``engine_key(replica)`` names the engine that executes a replica's requests; ``engine_keys(model)`` the
    engines that can serve a model (by default one per replica: ``("replica", id)``).
    """

    def __init__(self, plane: ControlPlane, shedder: LoadShedder | None = None, engine_key=None, engine_keys=None,
                 t0: float | None = None):
        self.plane = plane
        self.t0 = time.monotonic() if t0 is None else t0  # the plane's t=0 on the monotonic clock
        self.shedder = shedder
        self.engine_key = engine_key or (lambda r: ("replica", r.id))
        self.engine_keys = engine_keys or (lambda model: [self.engine_key(r)
                                                          for r in plane.state.by_model.get(model, ())])
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.leases_open = 0

    def new_request(self, model: str, ingress: int, prompt_tokens: int, output_tokens: int, *, session=None,
                    reject_if_busy: bool = False, account: str = "default", hash_ids: tuple = (),
                    adapter: str = "") -> Request:
        return Request(next(self._ids), model, ingress, prompt_tokens, output_tokens, arrival=self.plane_now(),
                       session=session, reject_if_busy=reject_if_busy, account=account, hash_ids=hash_ids,
                       adapter=adapter)

    def plane_now(self, now: float | None = None) -> float:
        """The control plane's time of monotonic time ``now`` (default: now)."""
        return (time.monotonic() if now is None else now) - self.t0

    def _retry_after(self, model: str, now: float, work: float) -> float | None:
        if self.shedder is None:
            return None
        keys = self.engine_keys(model)
        if not keys:
            return None
        return self.shedder.retry_after(min(keys, key=lambda k: self.shedder.wait_s(k, now, work)), now, work)

    def _shed(self, model: str, now: float, work: float):
        self.shedder.shed_count += 1
        return shed(self._retry_after(model, now, work), f"estimated wait over {self.shedder.max_wait_s:g} s")

    def submit(self, req: Request, work: float = 1.0) -> Lease:
        """Admit and route ``req`` (of ``work``, in its engine's units) now; raises the HTTP error of a refusal
        (3040 with ``Retry-After``, 3006, 5007)."""
        now = time.monotonic()
        avoid = []
        if self.shedder is not None and self.shedder.enabled:
            # The model's replicas whose engine is over the bound: every one of them, and the request is shed now;
            # some, and the control plane routes around them as around full replicas.
            replicas = self.plane.state.by_model.get(req.model, ())
            bound, wait = self.shedder.max_wait_s, self.shedder.wait_s
            avoid = [r for r in replicas if wait(self.engine_key(r), now, work) > bound]
            if avoid and len(avoid) == len(replicas):
                raise self._shed(req.model, now, work)
        d = self.plane.submit(req, self.plane_now(now), avoid=avoid)
        if d.action == REJECT:
            code = d.code or int(Code.OUT_OF_CAPACITY)
            if avoid and code == Code.OUT_OF_CAPACITY:  # nothing within the bound could take it: shed
                raise self._shed(req.model, now, work)
            retry = self._retry_after(req.model, now, work) if code == Code.OUT_OF_CAPACITY else None
            raise from_code(code, retry_after_s=retry)
        fut = asyncio.get_running_loop().create_future()
        lease = Lease(req, d, fut, now)
        if self.shedder is not None:
            lease.ticket = self.shedder.admitted(self.engine_key(d.replica), now, work)
        req.payload = lease
        if d.action == QUEUE:
            self._wake.set()  # a new queue deadline for the timer
        else:
            fut.set_result(now)
        self.leases_open += 1
        return lease

    async def wait_started(self, lease: Lease) -> None:
        """Wait until the control plane starts ``lease`` (at once unless it was queued); 3007 on expiry."""
        if not lease.started.done():
            try:
                lease.started_at = await asyncio.shield(lease.started)
            except asyncio.CancelledError:
                self.release(lease)  # the client went away while queued: leave the queue
                raise
        else:
            lease.started_at = lease.started.result()

    async def wait_adapter(self, lease: Lease) -> None:
        """Take the request's adapter slot on its replica (at once unless every slot there is in use)."""
        if self.plane.acquire_adapter(lease.req, self.plane_now()) is not None:
            return
        lease.adapter = asyncio.get_running_loop().create_future()
        await lease.adapter

    def release(self, lease: Lease) -> None:
        """The request's engine work ended (or it was abandoned): free its slot or leave its queue, give back its
        adapter slot; idempotent."""
        if lease.released:
            return
        lease.released = True
        self.leases_open -= 1
        now = time.monotonic()
        ran = lease.started.done() and not lease.started.cancelled() and lease.started.exception() is None
        if lease.ticket is not None:
            self.shedder.finished(lease.ticket, now, served=ran)
        for req, _ready, _loaded in self.plane.release_adapter(lease.req, self.plane_now(now)):
            waiter = req.payload.adapter if req.payload is not None else None
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if ran:
            self._start_all(self.plane.finish(lease.req, self.plane_now(now)), now)
        else:
            if not lease.started.done():
                lease.started.cancel()
            self._start_all(self.plane.cancel(lease.req, self.plane_now(now)), now)

    def _start_all(self, started: list[Request], now: float) -> None:
        for req in started:
            lease = req.payload
            if lease is not None and not lease.started.done():
                if lease.ticket is not None and (key := self.engine_key(req.replica)) != lease.ticket.key:
                    lease.ticket = self.shedder.moved(lease.ticket, key, now)  # started on a sibling replica
                lease.started.set_result(now)

    # ------------------------------------------------------------------ the control plane's timer
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._timer(), name="edgepop-admission-timer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def poll(self) -> None:
        """Run the control plane's due work: queued requests past their timeout fail with 3007."""
        now = time.monotonic()
        started, expired = self.plane.poll(self.plane_now(now))
        self._start_all(started, now)
        for req in expired:
            lease = req.payload
            if lease is not None and not lease.started.done():
                lease.started.set_exception(queue_timeout(f"queued longer than "
                                                          f"{self.plane.admission.queue_timeout_s:g} s"))

    async def _timer(self) -> None:
        while True:
            self.poll()
            wait = self.plane.next_wakeup() - self.plane_now()
            self._wake.clear()
            if math.isfinite(wait):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.001))
            else:
                await self._wake.wait()
