"""Routing interface, decisions and the policy registry.

A router looks at one request and the cluster state and returns a :class:`Decision`; it does not change state
(the :class:`controlplane.plane.ControlPlane` applies the decision). Policies register in :data:`ROUTERS` and are
picked by name (import :mod:`controlplane.routing`, which registers the built-in ones)::

    router = make_router("p2c", state, rng=np.random.default_rng(1), k=4)
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from controlplane.outcomes import Code
from controlplane.state import COLD, LOADING, READY, ClusterState, Replica, Request
from edgepop.registry import Registry

START, QUEUE, REJECT = "start", "queue", "reject"
FREE_SCAN_MAX = 128  # spill-over: scan the replicas with free slots when there are at most this many


@dataclass(slots=True)
class Decision:
    """Where a request goes: START on a replica now, QUEUE on it, or REJECT with a Workers AI code."""

    action: str
    replica: Replica | None = None
    rtt_ms: float = 0.0
    code: int | None = None
    cold: bool = False  # the replica must load its weights first


def reject(code: int = Code.OUT_OF_CAPACITY) -> Decision:
    """A decision to reject the request with Workers AI error ``code`` (default: out of capacity)."""
    return Decision(REJECT, code=int(code))


class SessionPins(OrderedDict):
    """Replicas pinned per (session, model), least recently used first; past ``max_sessions`` the oldest goes."""

    def __init__(self, max_sessions: int):
        super().__init__()
        self.max_sessions = max_sessions

    def pin(self, key, replica) -> None:
        self[key] = replica
        self.move_to_end(key)
        if len(self) > self.max_sessions:
            self.popitem(last=False)


class Router:
    """Base class: subclasses implement :meth:`route`. ``state`` is shared with the control plane.

    The contract (docs/routing.md): :meth:`route` returns a :class:`Decision` the control plane can apply as given:

    * START: ``replica`` is one of ``state.replicas``, of the request's model, up and READY, and can start the
      request now (``replica.can_start(req.kv_tokens)``);
    * QUEUE: ``replica`` is one of ``state.replicas``, of the request's model (it may be COLD, and then loads for
      the request, or LOADING);
    * REJECT: no replica (``code``: a Workers AI code, or None for 3040);

    and for START and QUEUE, ``rtt_ms`` is ``state.rtt[req.ingress, replica.site]``. A router whose class is
    defined outside :mod:`controlplane.routing` is checked against it on every decision
    (:mod:`controlplane.routing.checked`); the shipped ones are tested to keep it.
    """

    name = "?"

    def __init__(self, state: ClusterState, rng: np.random.Generator | None = None):
        self.state = state
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def route(self, req: Request, now: float) -> Decision:  # pragma: no cover - interface
        raise NotImplementedError

    def forget(self, req: Request) -> None:
        """Called when a request ends (for policies that keep per-session state)."""

    # Shared building blocks -----------------------------------------------------------------------------
    def nearest_with_capacity(self, req: Request, cands: list[Replica], rtts: list[float],
                              max_rtt_ms: float | None = None) -> Decision:
        """The card's default: the nearest replica that can start now; else a cold replica that can be loaded;
        else queue on the nearest with queue room (unless rejectIfBusy); else 3040.

        ``cands`` may be the truncated nearest list; when nothing in it can start the request, the rule is
        applied again to the full list, so spillover reaches every replica (``max_rtt_ms`` bounds the distance).
        """
        d = self._nearest(req, cands, rtts, max_rtt_ms)
        if d.action != START and len(cands) < len(self.state.by_model.get(req.model, ())):
            start = self._nearest_free(req, max_rtt_ms)  # the nearest replica anywhere that can start it
            if start is not None:
                return start
            full, full_rtts = self.state.candidates(req.ingress, req.model, full=True)
            d = self._nearest(req, full, full_rtts, max_rtt_ms, skip_start=True)
        return d

    def _nearest_free(self, req: Request, max_rtt_ms) -> Decision | None:
        """START on the replica with a free slot that comes first in (RTT, site, replica) order, if any can take
        ``req``: a scan of the replicas with free slots only, however many replicas the model has."""
        reps = self.state.by_model.get(req.model)
        stats = reps[0].stats if reps else None
        if stats is None or not stats.free_set:
            return None
        if len(stats.free_set) > FREE_SCAN_MAX:  # many free replicas: the sorted list finds one in a few steps
            full, full_rtts = self.state.candidates(req.ingress, req.model, full=True)
            d = self._nearest(req, full, full_rtts, max_rtt_ms)
            return d if d.action == START else None
        row, kv, best, best_key = self.state.rtt[req.ingress], req.kv_tokens, None, None
        for r in stats.free_set:
            if r.can_start(kv):
                key = (float(row[r.site]), r.site, r.id)
                if best_key is None or key < best_key:
                    best, best_key = r, key
        if best is None or (max_rtt_ms is not None and best_key[0] > max_rtt_ms):
            return None
        return Decision(START, best, best_key[0])

    def _nearest(self, req: Request, cands: list[Replica], rtts: list[float], max_rtt_ms,
                 skip_start: bool = False) -> Decision:
        if max_rtt_ms is not None:
            n = bisect_right(rtts, max_rtt_ms)
            cands, rtts = cands[:n], rtts[:n]
        kv = req.kv_tokens
        stats = cands[0].stats if cands else None
        if not skip_start and (stats is None or stats.free > 0):  # a saturated model skips the scan (saturation is when it matters)
            for r, d in zip(cands, rtts, strict=True):
                if r.can_start(kv):
                    return Decision(START, r, d)
        if req.reject_if_busy:
            return reject()  # nothing warm can start it now; a cold load is a wait too
        if stats is None or stats.cold > 0:
            # A cold or loading replica takes waiting requests up to its slots (they start when it is ready), within
            # the site queue's limit like any wait.
            for r, d in zip(cands, rtts, strict=True):
                if r.status in (COLD, LOADING) and r.active + len(r.queue) < r.slots and r.has_queue_room() and (
                        r.status == LOADING or self.state.fits_back(r)):
                    return Decision(QUEUE, r, d, cold=True)
        if stats is not None and stats.full_at == stats.room_epoch:
            return reject()  # no queue of the model has had room since a scan of all its replicas found none
        for r, d in zip(cands, rtts, strict=True):
            # r.has_queue_room(), inlined: with every slot busy this scans every replica of the model before a
            # rejection, and the two calls per replica were most of the decision's time
            if r.status == READY and r.up and len(q := r.queue) < r.queue_limit * len(q.replicas):
                return Decision(QUEUE, r, d)
        if stats is not None and len(cands) == len(self.state.by_model.get(req.model, ())):
            stats.full_at = stats.room_epoch  # every replica scanned (none cut by max_rtt_ms): no room anywhere
        return reject()


# The registry of routing policies; the built-in ones register when ``controlplane.routing`` is imported.
ROUTERS = Registry("routing policy", skip=2)


def drawing_routers(router: Router) -> list[Router]:
    """``router`` and the routers it wraps (a fallback, a base), depth first, that draw from the seeded RNG."""
    out, todo, seen = [], [router], set()
    while todo:
        r = todo.pop(0)
        if id(r) in seen:
            continue
        seen.add(id(r))
        if hasattr(r, "draws"):
            out.append(r)
        todo[:0] = [v for v in vars(r).values() if isinstance(v, Router)]
    return out


def router_draws(router: Router) -> list[int]:
    """How many times each drawing router in ``router`` has drawn (a live gateway reports it, so that a simulated
    mirror built from the same seed can start where the live router is; see :func:`advance_draws`)."""
    return [r.draws for r in drawing_routers(router)]


def advance_draws(router: Router, draws: list[int]) -> None:
    """Make ``router``'s drawing routers draw until each has drawn ``draws`` times (a fresh router on the same
    seed then draws next what the live one does; exact with one drawing router, since several share one RNG)."""
    routers = drawing_routers(router)
    if len(draws) != len(routers):
        raise ValueError(f"draw counts {draws} do not match the router's {len(routers)} drawing router(s)")
    for r, n in zip(routers, draws, strict=True):
        if n < r.draws:
            raise ValueError(f"cannot go back to draw {n}: the router has drawn {r.draws} times")
        r.skip(n - r.draws)


def router_names() -> list[str]:
    """The names of the registered routing policies."""
    return ROUTERS.names()


def make_router(name: str, state: ClusterState, rng: np.random.Generator | None = None, **options) -> Router:
    """Instantiate the routing policy ``name`` with its options (unknown names or options: one clear error)."""
    return ROUTERS.create(name, state, rng, options=options)
