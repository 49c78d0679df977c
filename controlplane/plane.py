"""The control plane facade: admission, routing, queues, cold starts, faults and autoscaling over one ClusterState.

A pure library that reads no clock: every method whose outcome depends on the time takes it (``now``, seconds;
``acquire_adapter``'s ``t``) and returns what the caller must act on; the rest (``check``, ``set_slots``, the
prefix pins, ``next_wakeup``, ``snapshot``) change nothing that depends on it. The simulator and the live gateway
both drive it the same way::

    d = plane.submit(req, now)          # START / QUEUE / REJECT (with a Workers AI code)
    started = plane.finish(req, now)    # requests that left a queue and start now
    started, expired = plane.poll(now)  # replicas that finished loading; queued requests past their timeout
    plane.next_wakeup()                 # when poll() has something to do next

Techniques with state the router reads live here too, changed only through the plane:

* prefix caching (``prefix``, a :class:`~controlplane.prefix_index.PrefixIndex`): a request's prefix blocks
  are pinned on its replica when it starts (``req.cached_tokens`` is set then, from computed blocks only; a driver
  that reports prefills, like the simulator, looks it up again with ``prefix_hit`` and marks the blocks computed
  with ``prefix_computed``) and unpinned when it finishes, is cancelled or is lost to a node failure; they stay
  cached in the replica's free KV space afterwards;
* LoRA adapters (``adapters``, an :class:`~controlplane.adapter_index.AdapterIndex`): the driver calls
  :meth:`ControlPlane.acquire_adapter` when a started request reaches its replica and
  :meth:`ControlPlane.release_adapter` when it ends (which returns requests that were waiting for a slot).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from controlplane.adapter_index import AdapterIndex
from controlplane.catalog import Catalog, CatalogError
from controlplane.outcomes import Code
from controlplane.prefix_index import PrefixIndex
from controlplane.routing import QUEUE, REJECT, START, Decision, make_router
from controlplane.routing.base import Router, reject
from controlplane.routing.checked import check_outside
from controlplane.state import COLD, INF, LOADING, READY, ClusterState, Replica, Request, bad_request
from edgepop.errors import UserError


@dataclass
class AdmissionConfig:
    """Admission limits: queue length per replica, queue timeout, and cold-start costs.

    ``queue_timeout_s``: a request still queued after this is dropped with 3007 (timeout).
    Cold start = weight bytes / ``load_gbs`` (GB/s from local NVMe or a nearby object store) + ``init_s``.
    """

    queue_limit: int = 64
    queue_timeout_s: float = 30.0
    load_gbs: float = 2.0
    init_s: float = 5.0

    def cold_start_s(self, spec) -> float:
        return spec.weight_bytes / (self.load_gbs * 1e9) + self.init_s


class ControlPlane:
    """Admission + routing + queue management for one deployment (edge or central).

    ``one_llm_per_gpu``: replicas loaded at run time (:meth:`add_replica`, reloads) never put a second language
    model on a GPU (the placement's own rows are taken as given)."""

    def __init__(self, catalog: Catalog, fleet, placement, rtt: np.ndarray, router: str = "nearest-with-capacity",
                 router_options: dict | None = None, admission: AdmissionConfig | None = None, perf=None,
                 rng: np.random.Generator | None = None, autoscaler=None, typical_tokens: tuple = (512, 128),
                 max_candidates: int | None = 64, prefix: PrefixIndex | None = None,
                 adapters: AdapterIndex | None = None, adapter_routing: bool = True, one_llm_per_gpu: bool = False):
        self.catalog = catalog
        self.admission = admission or AdmissionConfig()
        table = getattr(placement, "table", placement)
        self.state = ClusterState(catalog, fleet, table, rtt, queue_limit=self.admission.queue_limit,
                                  max_candidates=max_candidates, one_llm_per_gpu=one_llm_per_gpu)
        self.perf, self.typical_tokens = perf, typical_tokens
        self._estimates: dict = {}
        for r in self.state.replicas:
            self._estimate(r)
        self.state.prefix, self.state.adapters = prefix, adapters
        # A router edgepop does not ship is checked: each of its decisions must keep the routing contract.
        self.router = check_outside(make_router(router, self.state, rng, **(router_options or {})), self.state)
        if adapters is not None and adapter_routing and self.router.name != "adapter-aware":
            self.router = make_router("adapter-aware", self.state, rng, base=self.router)
        self.autoscaler = autoscaler
        # Most policies keep no per-request state: skip their no-op forget() on every finished request.
        self._forgets = type(self.router).forget is not Router.forget
        self._pins: dict = {}  # request -> replica whose prefix blocks it pins (prefix caching on)
        self._limits: dict = {}  # model -> admission limits (check() runs once per request)
        # (deadline, request, enqueued_at: a retry's stale entries differ); FIFO because the timeout is one constant
        self._deadlines: deque = deque()
        self._ingresses = len(self.state.rtt)  # valid ingress keys: the RTT matrix's rows
        self.counts = dict.fromkeys(("submitted", "started", "queued", "rejected", "expired", "cold_loads",
                                     "router_loads"), 0)

    # ---------------------------------------------------------------- estimates for latency-aware routing
    def _estimate(self, r: Replica) -> None:
        if self.perf is None:
            return
        key = (r.spec.id, r.gpu)
        if key not in self._estimates:
            p = self.perf
            lo, hi = p.prefill_ms(r.spec, r.gpu, 128), p.prefill_ms(r.spec, r.gpu, 2048)
            b = (hi - lo) / 1920
            prompt, out = self.typical_tokens
            busy = p.prefill_ms(r.spec, r.gpu, prompt)
            if r.spec.generative:
                busy += out * p.decode_step_ms(r.spec, r.gpu, max(1, r.slots // 2), prompt + out / 2)
            self._estimates[key] = (lo - 128 * b, b, busy)
        r.est_prefill_a, r.est_prefill_b, r.est_request_ms = self._estimates[key]

    def add_replica(self, model: str, node: int, now: float, cold: bool = True) -> Replica:
        """Load a new replica on ``node`` (ready after its cold start unless ``cold`` is False)."""
        spec = self.catalog[model]
        delay = self.admission.cold_start_s(spec) if cold else 0.0
        r = self.state.add_replica(spec, node, status=LOADING if cold else READY, ready_at=now + delay)
        self._estimate(r)
        self.counts["cold_loads"] += int(cold)
        return r

    def set_slots(self, slots: int, replicas=None) -> None:
        """Concurrent sequences per replica (all, or ``replicas``): a live host's engine limit, say."""
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, got {slots!r}")
        for r in self.state.replicas if replicas is None else replicas:
            r.slots = slots
        self.state.refresh()

    # ---------------------------------------------------------------- requests
    def _limits_of(self, model: str) -> tuple | None:
        """(context window or None, KV pool or None, ``ModelSpec.kv_charge`` of a sliding-window model or None) of
        ``model``; None for a model not in the catalog."""
        try:
            spec = self.catalog[model]
        except CatalogError:
            lim = None
        else:
            # A reranking request is a query scored against several passages, each pair within the window.
            one_sequence = spec.unit == "token" and spec.task != "text-reranking"
            lim = (spec.context_window if one_sequence else None, spec.kv_pool_tokens if spec.generative else None,
                   spec.kv_charge if spec.sliding_window else None)
        self._limits[model] = lim
        return lim

    def check(self, req: Request) -> int | None:
        """Admission checks before routing: 5007 unknown model, 3006 too large for the context window or the KV pool.
        Sets ``req.kv_charge`` for a sliding-window model (what routers and replicas then reserve). A request whose
        fields are not a request (an ingress that is not an integer row of the RTT matrix, a negative, NaN or
        infinite size) is the caller's mistake, not an outcome: a ``UserError`` naming the field."""
        # A few comparisons per request (NaN fails them; a string raises TypeError); the message only on failure.
        # The type first: 3.0 and True compare and hash like rows 3 and 1 (a cached candidate list would serve them).
        ingress = req.ingress
        try:
            ok = (type(ingress) is int and 0 <= ingress < self._ingresses and 0 <= req.prompt_tokens < INF
                  and req.output_tokens >= 0)
        except TypeError:
            ok = False
        if not ok and (error := bad_request(req, self._ingresses)) is not None:  # (or a numpy / IntEnum row)
            raise error
        lim = self._limits.get(req.model, False)
        if lim is False:
            lim = self._limits_of(req.model)
        if lim is None:
            return int(Code.NO_SUCH_MODEL)
        window, pool, charge = lim
        kv = req.prompt_tokens + req.output_tokens
        if window is not None and kv > window:
            return int(Code.TOO_LARGE)
        if charge is not None:  # (a sliding window: the pool holds full-layer equivalents, fewer than its tokens)
            kv = req.kv_charge = charge(kv)
        if pool is not None and kv > pool:
            return int(Code.TOO_LARGE)
        return None

    def submit(self, req: Request, now: float, avoid=()) -> Decision:
        """Admit and route one request; START and QUEUE decisions are applied to the state before returning.

        ``avoid``: replicas this decision must not use (as if down), e.g. ones whose engine the caller knows to be
        over its wait bound; with none left the request is rejected (3040)."""
        r = req.replica
        if r is not None and (req in r.running or req in r.queue):  # (a retry has left both: replica None)
            raise UserError(f"request {req.id} was submitted again while it is "
                            f"{'running' if req in r.running else 'queued'}: submit a request once, again only "
                            "after it finished, expired or was lost")
        code = self.check(req)  # (first: a request it raises on was never submitted)
        self.counts["submitted"] += 1
        if code is not None:
            d = reject(code)
        elif avoid:
            with self.state.withheld(avoid):
                d = self.router.route(req, now)
        else:
            d = self.router.route(req, now)
        if d.action == REJECT:
            self.counts["rejected"] += 1
            return d
        r = d.replica
        req.rtt_ms = d.rtt_ms
        if d.action == START:
            r._start(req, now)
            if self.state.prefix is not None:
                self.pin_prefix(req)
            self.counts["started"] += 1
        else:
            if r.status == COLD:
                if not self.state.begin_load(r, now, self.admission.cold_start_s(r.spec)):
                    self.counts["rejected"] += 1
                    return reject()
                self.counts["cold_loads"] += 1
                self.counts["router_loads"] += 1  # (a cold replica chosen for a request: no autoscaler's doing)
            r.queue.append(req)
            self.state.queued += 1
            req.replica, req.enqueued_at = r, now
            self._deadlines.append((now + self.admission.queue_timeout_s, req, now))
            self.counts["queued"] += 1
        return d

    def finish(self, req: Request, now: float) -> list[Request]:
        """A running request completed (or was cancelled); returns queued requests that start now."""
        r = req.replica
        if r is None or req not in r.running:  # (releasing its slot twice would free one it does not hold)
            raise UserError(f"request {req.id} is not running (never started, or already finished or cancelled): "
                            "finish() takes a request the plane started, once")
        if self._pins:
            self.unpin_prefix(req)
        r._release(req, now)
        if self._forgets:
            self.router.forget(req)
        return self.drain(r, now) if r.queue else []  # (nothing queued: drain would start nothing)

    def drain(self, r: Replica, now: float) -> list[Request]:
        """Start the requests of ``r``'s site queue in FIFO order: each head on ``r`` if it fits, else on the first
        other replica of the queue it fits (a new head may fit where the last one did not). Head-of-line
        blocking is deliberate: a head that fits nowhere holds the queue."""
        started = []
        queue = r.queue
        while queue:
            kv = queue[0].kv_tokens
            target = r if r.can_start(kv) else next(
                (o for o in queue.replicas if o is not r and o.can_start(kv)), None)
            if target is None:
                break
            req = queue.popleft()
            self.state.queued -= 1
            target._start(req, now)
            started.append(req)
        if self.state.prefix is not None:
            for req in started:  # after every reservation: cached blocks live in what is left free
                self.pin_prefix(req)
        self.counts["started"] += len(started)
        return started

    def cancel(self, req: Request, now: float) -> list[Request]:
        """Withdraw a request wherever it is (queued or running); returns requests that start in its place."""
        r = req.replica
        if r is None:
            return []
        if req in r.running:
            return self.finish(req, now)
        if req in r.queue:
            head = r.queue[0] is req
            r.queue.remove(req)
            self.state.queued -= 1
            if head and r.queue:  # the next head may fit where this one did not
                return self.drain(r, now)
        return []

    # ---------------------------------------------------------------- prefix index and adapter slots
    def pin_prefix(self, req: Request) -> int:
        """``req`` started on its replica: its cached prefix tokens (also set as ``req.cached_tokens``); its
        blocks stay pinned there until it finishes. A no-op (0) with prefix caching off or no ``hash_ids``."""
        index = self.state.prefix
        req.cached_tokens = 0
        if index is None:
            return 0
        r = req.replica
        req.cached_tokens = index.admit(r, req.hash_ids, req.prompt_tokens)
        if req.hash_ids:
            self._pins[req] = r
        return req.cached_tokens

    def prefix_hit(self, req: Request) -> int:
        """``req``'s prefill starts: its cached tokens looked up again (blocks computed since it started count
        now; also set as ``req.cached_tokens``)."""
        r = self._pins.get(req)
        if r is not None:
            req.cached_tokens = self.state.prefix.hit(r, req.hash_ids, req.prompt_tokens, req.cached_tokens)
        return req.cached_tokens

    def prefix_computed(self, req: Request) -> None:
        """``req``'s prefill ended: its prefix blocks hold KV now, later requests may hit them."""
        r = self._pins.get(req)
        if r is not None:
            self.state.prefix.computed(r, req.hash_ids)

    def unpin_prefix(self, req: Request) -> None:
        """``req`` stops running: its blocks stay cached, unpinned, in its replica's free KV space."""
        r = self._pins.pop(req, None)
        if r is not None:
            self.state.prefix.release(r, req.hash_ids, req.kv_tokens if req in r.running else 0)

    def acquire_adapter(self, req: Request, t: float) -> tuple[float, bool] | None:
        """``req`` (started) reaches its replica at ``t`` and needs its LoRA adapter: (when it can join its
        batch, whether its adapter had to be loaded), or None while every adapter slot there is in use (it is
        returned by a later :meth:`release_adapter`). Requests without an adapter, or LoRA off: (t, False)."""
        index = self.state.adapters
        if index is None or not req.adapter:
            return t, False
        return index.take(req.replica, req, t)

    def release_adapter(self, req: Request, now: float) -> list[tuple[Request, float, bool]]:
        """``req`` ended (or is retried): give back its adapter, or its place among the waiting. Returns the
        requests waiting on that replica that now hold their adapter: (request, join time, loaded)."""
        index = self.state.adapters
        return [] if index is None else index.give_back(req, now)

    def _drop_adapter(self, req: Request) -> None:
        if self.state.adapters is not None:
            self.state.adapters.forget(req)

    # ---------------------------------------------------------------- time-driven work
    def poll(self, now: float) -> tuple[list[Request], list[Request]]:
        """Finish loads that are due, run the autoscaler, expire queued requests past their timeout.

        Returns (requests that start now, requests dropped with 3007).
        """
        started: list[Request] = []
        due = [r for r in self.state.loading if r.ready_at <= now]
        for r in sorted(due, key=lambda r: r.id):
            self.state.set_ready(r)
            started += self.drain(r, now)
        if self.autoscaler is not None:
            self.autoscaler.tick(self, now)
        expired, new_heads = [], {}
        while self._deadlines and self._deadlines[0][0] <= now:
            _, req, at = self._deadlines.popleft()
            r = req.replica
            if req.enqueued_at == at and req.started_at < 0 and r is not None and req in r.queue:  # (this stay)
                if r.queue[0] is req:
                    new_heads[id(r.queue)] = r
                r.queue.remove(req)
                self.state.queued -= 1
                expired.append(req)
        for r in new_heads.values():  # a queue whose head left: the next head may fit where that one did not
            if r.queue:
                started += self.drain(r, now)
        self.counts["expired"] += len(expired)
        return started, expired

    def next_wakeup(self) -> float:
        """Earliest time :meth:`poll` has work (a load completing or a queue deadline); inf if none."""
        t = min((r.ready_at for r in self.state.loading), default=float("inf"))
        t = min(t, self._deadlines[0][0]) if self._deadlines else t
        if self.autoscaler is not None:
            t = min(t, self.autoscaler.next_tick)
        return t

    # ---------------------------------------------------------------- faults
    def set_node_up(self, node: int, up: bool, now: float) -> tuple[list[Request], list[Request]]:
        """Take a node down (or bring it back). Down: returns (running requests lost, queued requests evicted);
        the caller fails or resubmits them. Their state entries are already released. Back up: its resident
        replicas load their weights again (a cold start each; the failure took them with the node's memory)."""
        replicas = self.state.set_node_up(node, up)
        lost, evicted = [], []
        if up:
            for r in replicas:
                if r.status != COLD:
                    self.state.reload(r, now, self.admission.cold_start_s(r.spec))
                    self.counts["cold_loads"] += 1
            return lost, evicted
        for r in replicas:
            for req in list(r.running):
                self._pins.pop(req, None)  # the node's prefix index is dropped below
                self._drop_adapter(req)
                r._release(req, now)
                # not started any more: a retry that queues is held to the queue timeout like any other request
                req.replica, req.started_at = None, -1.0
                lost.append(req)
            # No one left to serve this site queue: no replica up and READY or loading (a cold one starts loading only
            # for a request routed to it, so queued requests would wait there until they expire).
            if not any(other.up and other.status != COLD for other in r.queue.replicas):
                while r.queue:
                    req = r.queue.popleft()
                    self.state.queued -= 1
                    req.replica = None
                    evicted.append(req)
        for part in (self.state.prefix, self.state.adapters):
            if part is not None:
                part.drop_node(node, replicas)
        return lost, evicted

    def set_site_up(self, site: int, up: bool, now: float) -> tuple[list[Request], list[Request]]:
        """All nodes of a site (a PoP or region) down or up."""
        lost, evicted = [], []
        for node in np.flatnonzero(self.state.node_site == site):
            a, b = self.set_node_up(int(node), up, now)
            lost += a
            evicted += b
        return lost, evicted

    # ---------------------------------------------------------------- reporting
    def snapshot(self) -> dict:
        """Counters and current occupancy, for progress displays and /metrics."""
        reps = self.state.replicas
        return {**self.counts, "replicas": len(reps),
                "ready": sum(r.status == READY for r in reps), "loading": sum(r.status == LOADING for r in reps),
                "cold": sum(r.status == COLD for r in reps), "running": sum(r.active for r in reps),
                "waiting": sum(len(q) for q in self.state.site_queues.values())}


__all__ = ["QUEUE", "REJECT", "START", "AdmissionConfig", "ControlPlane", "Decision", "Request"]
