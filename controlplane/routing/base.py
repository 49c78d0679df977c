"""Routing interface, decisions and the policy registry.

A router looks at one request and the cluster state and returns a :class:`Decision`; it does not change state
(the :class:`controlplane.plane.ControlPlane` applies the decision). Policies register in :data:`ROUTERS` and are
picked by name (import :mod:`controlplane.routing`, which registers the built-in ones)::

    router = make_router("p2c", state, rng=np.random.default_rng(1), k=4)
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from controlplane.outcomes import Code
from controlplane.state import COLD, LOADING, READY, ClusterState, Replica, Request
from edgepop.registry import Registry

START, QUEUE, REJECT = "start", "queue", "reject"


@dataclass(slots=True)
class Decision:
    """Where a request goes: START on a replica now, QUEUE on it, or REJECT with a Workers AI code."""

    action: str
    replica: Replica | None = None
    rtt_ms: float = 0.0
    code: int | None = None
    cold: bool = False  # the replica must load its weights first


def reject(code: int = Code.OUT_OF_CAPACITY) -> Decision:
    return Decision(REJECT, code=int(code))


class Router:
    """Base class: subclasses implement :meth:`route`. ``state`` is shared with the control plane."""

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
            full, full_rtts = self.state.candidates(req.ingress, req.model, full=True)
            d = self._nearest(req, full, full_rtts, max_rtt_ms)
        return d

    def _nearest(self, req: Request, cands: list[Replica], rtts: list[float], max_rtt_ms) -> Decision:
        if max_rtt_ms is not None:
            n = bisect_right(rtts, max_rtt_ms)
            cands, rtts = cands[:n], rtts[:n]
        kv = req.kv_tokens
        stats = cands[0].stats if cands else None
        if stats is None or stats.free > 0:  # a saturated model skips the scan (saturation is when it matters)
            for r, d in zip(cands, rtts, strict=True):
                if r.can_start(kv):
                    return Decision(START, r, d)
        if stats is None or stats.cold > 0:
            for r, d in zip(cands, rtts, strict=True):
                if r.up and r.status in (COLD, LOADING) and r.active + len(r.queue) < r.slots and (
                        r.status == LOADING or self.state.fits_back(r)):
                    return Decision(QUEUE, r, d, cold=True)
        if req.reject_if_busy:
            return reject()
        for r, d in zip(cands, rtts, strict=True):
            if r.status == READY and r.has_queue_room():
                return Decision(QUEUE, r, d)
        return reject()


# The registry of routing policies; the built-in ones register when ``controlplane.routing`` is imported.
ROUTERS = Registry("routing policy", skip=2)


def router_names() -> list[str]:
    return ROUTERS.names()


def make_router(name: str, state: ClusterState, rng: np.random.Generator | None = None, **options) -> Router:
    """Instantiate the routing policy ``name`` with its options (unknown names or options: one clear error)."""
    return ROUTERS.create(name, state, rng, options=options)
