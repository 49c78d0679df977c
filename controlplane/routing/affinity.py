"""``session-affinity``: keep a session on the replica that served it (its KV prefix is there), with a load gate."""

from __future__ import annotations

from controlplane.routing.base import QUEUE, ROUTERS, START, Decision, Router, SessionPins
from controlplane.state import READY, Request
from edgepop.registry import merge_forwarded


@ROUTERS.register("session-affinity", forward=("fallback", "nearest-with-capacity"))
class SessionAffinity(Router):
    """Sticky by session id (the ``x-session-affinity`` header); requests without one use ``fallback``.

    A pin is per (session, model): a session that calls several models (a chat model and an embedding model, say)
    keeps one replica for each, and a request never follows a pin to a replica of another model.

    Load gate: a session stays on its replica only while that replica can start it now, or its load (running +
    queued per slot) is below ``gate`` and its queue has room; otherwise the session is re-pinned via the fallback
    policy, so one popular session never swamps a node. A pin farther from the request's ingress than the
    fallback's ``max_rtt_ms`` (when it has one) is not followed either. At most ``max_sessions`` pins ((session, model)
    pairs) are remembered (LRU).
    """

    def __init__(self, state, rng=None, gate: float = 1.25, fallback: str = "nearest-with-capacity",
                 max_sessions: int = 1_000_000, fallback_options: dict | None = None, **options):
        super().__init__(state, rng)
        self.check_options(gate, max_sessions=max_sessions)
        self.gate, self.max_sessions = gate, max_sessions
        self.fallback = ROUTERS.create(fallback, state, rng,
                                       options=merge_forwarded(options, fallback_options, "fallback"))
        self.pins = SessionPins(max_sessions)
        self.sticky_hits = 0
        self.gated = 0

    @staticmethod
    def check_options(gate: float = 1.25, fallback: str = "nearest-with-capacity", max_sessions: int = 1_000_000,
                      fallback_options=None, **_fallback_options) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if not gate > 0:
            raise ValueError(f"gate must be positive (a load per slot), got {gate!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions!r}")

    def route(self, req: Request, now: float) -> Decision:
        if req.session is None:
            return self.fallback.route(req, now)
        key = (req.session, req.model)  # one session may call several models; each has its own replica
        r = self.pins.get(key)
        bound = getattr(self.fallback, "max_rtt_ms", None)  # the fallback's distance bound holds for pins too
        rtt = float(self.state.rtt[req.ingress, r.site]) if r is not None else 0.0
        if r is not None and r.up and r.status == READY and (bound is None or rtt <= bound):
            self.pins.move_to_end(key)
            if r.can_start(req.kv_tokens):
                self.sticky_hits += 1
                return Decision(START, r, rtt)
            if not req.reject_if_busy and r.load < self.gate and r.has_queue_room():
                self.sticky_hits += 1
                return Decision(QUEUE, r, rtt)
            self.gated += 1
        decision = self.fallback.route(req, now)
        if decision.replica is not None:
            self.pins.pin(key, decision.replica)
        return decision
