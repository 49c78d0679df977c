"""``nearest-with-capacity``: the Workers AI default -- lowest RTT among replicas with a free slot, spilling over."""

from __future__ import annotations

from controlplane.routing.base import ROUTERS, Decision, Router
from controlplane.state import Request


@ROUTERS.register("nearest-with-capacity")
class NearestWithCapacity(Router):
    """Lowest-RTT replica that can start now; spill to the next nearest; queue or reject (3040) when all are full.

    ``max_rtt_ms`` optionally bounds how far a request may travel (beyond it, it queues or is rejected).
    """

    def __init__(self, state, rng=None, max_rtt_ms: float | None = None):
        super().__init__(state, rng)
        self.check_options(max_rtt_ms)
        self.max_rtt_ms = max_rtt_ms

    @staticmethod
    def check_options(max_rtt_ms: float | None = None) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if max_rtt_ms is not None and not max_rtt_ms >= 0:  # a negative bound would refuse every request
            raise ValueError(f"max_rtt_ms must be >= 0 ms (or left out: no bound), got {max_rtt_ms!r}")

    def route(self, req: Request, now: float) -> Decision:
        cands, rtts = self.state.candidates(req.ingress, req.model)
        return self.nearest_with_capacity(req, cands, rtts, self.max_rtt_ms)
