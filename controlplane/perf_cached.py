"""A memoising front for any PerfModel: the simulator asks for the same few shapes millions of times. The live
gateway reads its models through it too, so a scenario served live estimates with the numbers it was simulated with.

Prefill time is tabulated per (model, GPU) on a geometric grid of token counts and interpolated linearly (the
grid's neighbours are 4% apart, where prefill time is smooth: the error is far below the model's own). A table's
points are computed when first read: a run reads a few dozen of a table's 160 (its capacity estimates two or
three), and a small run spent a tenth of its time filling whole tables. Decode
step times are memoised per (model, GPU, batch, context) (the replica engines quantise the context to 64-token
buckets themselves).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

GRID_POINTS = 160


class CachedPerf:
    """Wraps ``perf`` (same interface); exact at grid points, linear in between."""

    def __init__(self, perf, max_tokens: int = 1 << 18):
        self.perf = perf
        grid = np.unique(np.round(np.geomspace(1.0, max_tokens, GRID_POINTS)))
        self.grid = [0.0, *(float(g) for g in grid)]
        self._prefill: dict = {}
        self._decode: dict = {}

    def _table(self, spec, gpu) -> list:
        """The (model, GPU)'s table: the time at 1 token, then at each grid point from the second; None where not
        computed yet (:meth:`_point` computes it)."""
        key = (spec.id, gpu)
        t = self._prefill.get(key)
        if t is None:
            t = self._prefill[key] = [None] * len(self.grid)
        return t

    def _point(self, spec, gpu, table: list, i: int) -> float:
        """``table[i]``, computed and kept if it was not yet (each point always gets the same value: the model is
        pure)."""
        ms = table[i]
        if ms is None:
            ms = table[i] = self.perf.prefill_ms(spec, gpu, 1 if i == 0 else self.grid[i])
        return ms

    def prefill_ms(self, spec, gpu, tokens) -> float:
        return self.prefill_fn(spec, gpu)(tokens)

    def prefill_fn(self, spec, gpu):
        """``tokens -> prefill ms`` for one (model, GPU): what a replica engine calls on every prefill."""
        if spec.unit == "audio-minute":
            # A speech encoder pays per started window: a step function of the clip's length, which a linear
            # table would smooth. Clips come in whole seconds, so the exact times are few: memoised as they are.
            memo, perf = self._prefill.setdefault((spec.id, gpu, "exact"), {}), self.perf

            def exact(minutes) -> float:
                ms = memo.get(minutes)
                if ms is None:
                    ms = memo[minutes] = perf.prefill_ms(spec, gpu, minutes)
                return ms

            return exact
        table, grid, perf, point = self._table(spec, gpu), self.grid, self.perf, self._point
        last = len(grid) - 1

        def prefill(tokens) -> float:
            x = float(tokens)
            i = bisect_right(grid, x) - 1
            if i <= 0:
                j = 0 if x <= 1.0 else 1
                return point(spec, gpu, table, j)
            if i >= last:
                return perf.prefill_ms(spec, gpu, tokens)
            a, b = table[i], table[i + 1]
            if a is None or b is None:
                a, b = point(spec, gpu, table, i), point(spec, gpu, table, i + 1)
            x0, x1 = grid[i], grid[i + 1]
            return a + (b - a) * (x - x0) / (x1 - x0)

        return prefill

    def decode_step_ms(self, spec, gpu, batch, context) -> float:
        # Keyed by the exact context: the replica engines ask at their 64-token buckets' midpoints (a few hundred
        # keys), the control plane's estimates at a few typical lengths. A key per bucket would hand every later
        # caller the value of whichever context asked first, so a deployment's results would depend on what ran
        # before it in the process.
        key = (spec.id, gpu, int(batch), float(context))
        ms = self._decode.get(key)
        if ms is None:
            ms = self.perf.decode_step_ms(spec, gpu, batch, context)
            self._decode[key] = ms
        return ms

    def __getattr__(self, name):  # everything else (breakdowns, capacity helpers) goes to the wrapped model
        if name == "perf":  # not set yet (a copy or an unpickling in progress): no wrapped model to ask
            raise AttributeError(name)
        return getattr(self.perf, name)
