"""``least-ttft``: the replica that would give the earliest first token, counting the prompts already sent to it.

A replica with a free batch slot can start a request at once in the control plane's books, but a prompt that
reaches it while it prefills others waits for them: with long prompts of a big model, a replica that serves its
city alone makes the unlucky ones wait hundreds of milliseconds while a replica one PoP away idles
(docs/frontier.md, "Slower replicas"). ``nearest-balanced`` and ``latency-load`` count sequences, not that
backlog. This router keeps its own account of it: per replica, when the prefills it has routed there should be
done (each one starting when its request arrives, half its RTT after the decision, or when the earlier ones end,
and taking the replica's linear prefill estimate from the service-time model). Each replica that can start the
request now gets a predicted first token, RTT + backlog + own prefill, in RTT order until a replica's RTT plus the
least prefill any replica of the model could take is past the window of the earliest so far (no later one could
enter it). Of those within ``window_ms`` of the earliest it takes the least expected work (as ``nearest-balanced``
weighs it; ties: the earlier first token, then the nearer). When none can start it, nearest-with-capacity decides.

The account is the router's estimate, not the engine's state: prompts prefilled together cost less than one after
another, decode steps interleave, and a request the control plane queues or loses is not taken back.
``prefill_estimate_scale`` multiplies every prefill estimate it uses, to measure what a router that mispredicts
costs (0.69: a router that believes prefill 1.45x faster than it is). Without the control plane's service-time
estimates every backlog is 0 and the rule is nearest-balanced's window on the nearest replica that can start it.
"""

from __future__ import annotations

import math

from controlplane.routing.base import ROUTERS, START, Decision, Router
from controlplane.state import Request


@ROUTERS.register("least-ttft")
class LeastTTFT(Router):
    """Predicted first token = RTT + prefill backlog (this router's account) + own prefill, for every replica that
    can start the request and could come within ``window_ms`` of the earliest; the least expected work within
    ``window_ms`` of the earliest; else nearest-with-capacity."""

    def __init__(self, state, rng=None, window_ms: float = 10.0, prefill_estimate_scale: float = 1.0):
        super().__init__(state, rng)
        self.check_options(window_ms, prefill_estimate_scale)
        self.window_ms = float(window_ms)
        self.scale = float(prefill_estimate_scale)
        self._done_at: dict[int, float] = {}  # replica id -> when the prefills routed to it should be done (s)
        # model -> (its replica count, the distinct (a, b) prefill estimates among them): replicas are only ever
        # added, each with its estimates before any request is routed (ControlPlane.add_replica)
        self._estimates: dict[str, tuple[int, tuple]] = {}

    @staticmethod
    def check_options(window_ms: float = 10.0, prefill_estimate_scale: float = 1.0) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if not (isinstance(window_ms, int | float) and math.isfinite(window_ms) and 0 <= window_ms <= 1000):
            raise ValueError(f"window_ms must be in [0, 1000] ms, got {window_ms!r}")
        if not (isinstance(prefill_estimate_scale, int | float) and 0 < prefill_estimate_scale <= 100):
            raise ValueError(f"prefill_estimate_scale must be in (0, 100], got {prefill_estimate_scale!r}")

    def route(self, req: Request, now: float) -> Decision:
        state = self.state
        cands, rtts = state.candidates(req.ingress, req.model)
        # (the least prefill any replica could take bounds the scan; read once, for the rescan too)
        floor = self._least_prefill(req.model, req.prompt_tokens)
        scored, whole = self._scored(req, now, cands, rtts, floor)
        if not whole and len(cands) < len(state.by_model.get(req.model, ())):
            # the truncated list ended before the window did: the replicas past it may hold the best
            cands, rtts = state.candidates(req.ingress, req.model, full=True)
            scored, _ = self._scored(req, now, cands, rtts, floor)
        if not scored:
            return self.nearest_with_capacity(req, cands, rtts)
        # Within window_ms of the earliest predicted first token, the least expected work (as nearest-balanced
        # weighs it; ties: the earlier first token, then the nearer): a first-token rule alone sends every request
        # to a site's fastest GPU type until its batch is full while the others idle, and TPOT pays for it.
        limit = min(scored)[0] + self.window_ms
        best, best_key, start = -1, None, 0.0
        for score, i, at in scored:
            if score <= limit:
                r = cands[i]
                key = ((r.active + 1) * (r.est_request_ms or 1.0), score, i)
                if best < 0 or key < best_key:
                    best, best_key, start = i, key, at
        r = cands[best]
        own = self.scale * (r.est_prefill_a + r.est_prefill_b * req.prompt_tokens)
        self._done_at[r.id] = start + (own if own > 0.0 else 0.0) / 1e3
        return Decision(START, r, rtts[best])

    def _least_prefill(self, model: str, tokens: int) -> float:
        """The least prefill estimate (ms, this router's scale, at least 0) of ``tokens`` on any replica of
        ``model``."""
        replicas = self.state.by_model.get(model, ())
        known = self._estimates.get(model)
        if known is None or known[0] != len(replicas):
            known = self._estimates[model] = (len(replicas), tuple({(r.est_prefill_a, r.est_prefill_b)
                                                                      for r in replicas}))
        least = math.inf
        for a, b in known[1]:  # (a few GPU types: no generator for min())
            own = a + b * tokens
            if own < least:
                least = own
        least = least * self.scale if known[1] else 0.0
        return least if least > 0.0 else 0.0

    def _scored(self, req: Request, now: float, cands, rtts, floor: float) -> tuple[list, bool]:
        """(predicted first token ms, index, when its prefill would start) of each replica in ``cands`` that can
        start ``req`` and comes within the window of the best found before it, in RTT order up to the first whose
        RTT alone is past that window (no later one can enter it: a prediction is at least the RTT); and whether that
        bound, not the list's end, ended it."""
        kv, tokens, done_at, window, scale = req.kv_charge, req.prompt_tokens, self._done_at, self.window_ms, self.scale
        if kv < 0:
            kv = req.prompt_tokens + req.output_tokens  # req.kv_tokens, inlined (as nearest-balanced does)
        stats = cands[0].stats if cands else None
        if stats is not None and stats.free <= 0:
            return [], True  # a saturated model: no replica can start it
        # r.can_start(kv), inlined: free_set holds exactly the up, READY replicas with a free slot
        free = stats.free_set if stats is not None else None
        # ``floor``, the least own prefill any replica of the model could take: a candidate's prediction is at least
        # its RTT plus this, so the scan ends once that is past the window (a long prompt's would otherwise run on
        # over every replica whose RTT alone is within its own prefill of the best).
        scored, limit, get = [], math.inf, done_at.get
        for i, r in enumerate(cands):
            rtt = rtts[i]
            if rtt + floor > limit:
                return scored, True
            if (r not in free if free is not None else not r.can_start(kv)) or r.kv_used + kv > r.kv_capacity:
                continue
            half = rtt / 2
            start = get(r.id, 0.0)
            wait = (start - now) * 1e3 - half  # the backlog left when the prompt arrives, if any
            own = scale * (r.est_prefill_a + r.est_prefill_b * tokens)
            score = rtt + (wait if wait > 0.0 else 0.0) + (own if own > 0.0 else 0.0)
            if score > limit:
                continue  # outside the window of one found already: the window only narrows
            scored.append((score, i, start if wait > 0.0 else now + half / 1e3))
            if score + window < limit:
                limit = score + window
        return scored, False
