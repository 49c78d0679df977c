"""``prefix-aware``: send a request where the longest prefix of its prompt is already cached, within a load gate."""

from __future__ import annotations

from controlplane.routing.base import ROUTERS, Decision, Router, SessionPins
from controlplane.routing.prefer import GATED, PICKED, pick_preferred
from controlplane.state import Request

SESSION_BONUS = 0.5  # less than one token: a pin breaks ties between equal prefixes and wins when none is cached


@ROUTERS.register("prefix-aware")
class PrefixAware(Router):
    """Prefer, among the ``k`` nearest ready replicas, the one whose prefix cache holds the most of the prompt
    (``ClusterState.prefix``, matched on the request's ``hash_ids``).

    Session affinity feeds it: the replica that ran a session's previous turn gets a small bonus, so turns stay
    together even when their blocks were evicted or the request carries no hashes. Imbalance gate: if the pick's
    load exceeds the least-loaded candidate's by more than ``max_imbalance`` (load = running + queued per slot),
    the request takes the best balanced candidate instead (nearest first), and with no preference anywhere the
    base nearest-with-capacity choice. With prefix caching off it is
    nearest-with-capacity plus session pins.
    """

    def __init__(self, state, rng=None, k: int = 8, max_imbalance: float = 0.25, session_affinity: bool = True,
                 max_sessions: int = 1_000_000):
        super().__init__(state, rng)
        self.check_options(k, max_imbalance, max_sessions=max_sessions)
        self.k, self.max_imbalance = k, max_imbalance
        self.session_affinity, self.max_sessions = session_affinity, max_sessions
        self.pins = SessionPins(max_sessions)
        self.counts = {"prefix_picked": 0, "gated": 0, "base": 0}

    @staticmethod
    def check_options(k: int = 8, max_imbalance: float = 0.25, session_affinity: bool = True,
                      max_sessions: int = 1_000_000) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if k < 1 or not max_imbalance >= 0:
            raise ValueError(f"k must be at least 1 and max_imbalance >= 0, got k={k!r}, max_imbalance="
                             f"{max_imbalance!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions!r}")

    def route(self, req: Request, now: float) -> Decision:
        cands, rtts = self.state.candidates(req.ingress, req.model)
        caches = self.state.prefix
        # (pinned per session and model: a session's call to another model must not move its chat's replica)
        key = (req.session, req.model)
        pin = self.pins.get(key) if self.session_affinity and req.session is not None else None
        hashes, prompt = req.hash_ids, req.prompt_tokens

        def score(r) -> float:
            s = caches.match(r, hashes, prompt) if caches is not None and hashes else 0
            return s + SESSION_BONUS if r is pin else float(s)

        d, why = pick_preferred(req, cands, rtts, score, self.k, self.max_imbalance)
        self.counts[{PICKED: "prefix_picked", GATED: "gated"}.get(why, "base")] += 1
        if d is None:
            d = self.nearest_with_capacity(req, cands, rtts)
        if req.session is not None and self.session_affinity and d.replica is not None:
            self.pins.pin(key, d.replica)
        return d
