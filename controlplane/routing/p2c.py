"""``p2c``: power of two choices among the k nearest replicas (load balancing with locality)."""

from __future__ import annotations

from controlplane.routing.base import ROUTERS, START, Decision, Router
from controlplane.state import READY, Request


@ROUTERS.register("p2c")
class PowerOfTwoChoices(Router):
    """Sample two of the ``k`` nearest ready replicas (seeded RNG) and take the less loaded; ties go to the nearer.

    If the pick is full, the request spills to the nearest of the k that can start, and otherwise falls back to
    nearest-with-capacity over all replicas (cold load, queue, or 3040).
    """

    def __init__(self, state, rng=None, k: int = 4):
        super().__init__(state, rng)
        self.check_options(k)
        self.k = k
        self._u: list[float] = []
        self.draws = 0  # pairs drawn: a live gateway reports it, the simulated mirror skips as many

    @staticmethod
    def check_options(k: int = 4) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if k < 2:
            raise ValueError(f"k must be at least 2, got {k!r}")

    def _two(self, n: int) -> tuple[int, int]:
        """Two distinct indices below n from the seeded RNG (uniforms drawn in blocks: numpy calls cost ~us)."""
        if len(self._u) < 2:
            self._u = self.rng.random(4096).tolist()
        self.draws += 1
        a = int(self._u.pop() * n)
        b = int(self._u.pop() * (n - 1))
        return a, b + (b >= a)

    def skip(self, n: int) -> None:
        """Draw ``n`` pairs and drop them (a pair takes two uniforms whatever the candidates' count)."""
        for _ in range(n):
            self._two(2)

    def route(self, req: Request, now: float) -> Decision:
        cands, rtts = self.state.candidates(req.ingress, req.model)
        near = []
        for i, c in enumerate(cands):
            if c.up and c.status == READY:
                near.append(i)
                if len(near) == self.k:
                    break
        if len(near) >= 2:
            a, b = self._two(len(near))
            i, j = near[min(a, b)], near[max(a, b)]  # i is the nearer of the two
            pick = i if cands[i].load <= cands[j].load else j
            r = cands[pick]
            if r.can_start(req.kv_tokens):
                return Decision(START, r, rtts[pick])
            for n in near:  # the pick is full: spill within the k nearest first
                if cands[n].can_start(req.kv_tokens):
                    return Decision(START, cands[n], rtts[n])
        return self.nearest_with_capacity(req, cands, rtts)
