"""``latency-load``: minimise RTT + predicted queue wait + prefill time over the k nearest replicas."""

from __future__ import annotations

from controlplane.routing.base import QUEUE, ROUTERS, START, Decision, Router
from controlplane.state import COLD, LOADING, Request


@ROUTERS.register("latency-load")
class LatencyLoad(Router):
    """Score each of the ``k`` nearest replicas by the time to first token it would give, and take the best.

    score = RTT + predicted wait + prefill(prompt). The wait is 0 with a free slot; otherwise the queue ahead
    (plus this request) drains at ``slots`` requests per typical request time per replica sharing the site queue.
    Cold replicas add their load time. Estimates come from the replica's perf figures (filled in by the control
    plane from its PerfModel); a replica without them can only take the request if it can start it now (its wait
    cannot be predicted), and a tie goes to starting now. Nothing chosen: nearest-with-capacity decides.
    """

    def __init__(self, state, rng=None, k: int = 16, cold_start_s: float = 15.0):
        super().__init__(state, rng)
        self.check_options(k, cold_start_s)
        self.k, self.cold_start_ms = k, cold_start_s * 1e3

    @staticmethod
    def check_options(k: int = 16, cold_start_s: float = 15.0) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k!r}")
        if not cold_start_s >= 0:
            raise ValueError(f"cold_start_s must be >= 0, got {cold_start_s!r}")

    def route(self, req: Request, now: float) -> Decision:
        cands, rtts = self.state.candidates(req.ingress, req.model)
        kv, best, best_score, best_start = req.kv_tokens, -1, float("inf"), False
        seen = 0
        for i, r in enumerate(cands):
            if not r.up:
                continue
            seen += 1
            if seen > self.k:
                break
            start = r.can_start(kv)
            if start:
                wait = 0.0
            elif req.reject_if_busy or not r.has_queue_room() or not r.est_request_ms:
                continue  # (without a service-time estimate a wait cannot be predicted: only starts compete)
            else:
                wait = (len(r.queue) + 1) * r.est_request_ms / (r.slots * len(r.queue.replicas))
                if r.status == LOADING:
                    wait += max(0.0, (r.ready_at - now) * 1e3)
                elif r.status == COLD:
                    if not self.state.fits_back(r):
                        continue
                    wait += self.cold_start_ms
            score = rtts[i] + wait + r.est_prefill_a + r.est_prefill_b * req.prompt_tokens
            if score < best_score or (score == best_score and start and not best_start):
                best, best_score, best_start = i, score, start
        if best < 0:
            return self.nearest_with_capacity(req, cands, rtts)
        r = cands[best]
        return Decision(START if best_start else QUEUE, r, rtts[best], cold=r.status != "ready")
