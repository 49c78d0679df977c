"""What a run hands back and how it is checked: the per-request frame, the utilisation samples (and their
sampler), the GPU busy time, and the every-request-ends-exactly-once invariant.

A mixin of :class:`sim.simulator.Simulation` (it reads the simulation's per-request arrays, its samples, engines
and GPU meter).
"""

from __future__ import annotations

from operator import attrgetter

import pandas as pd

from sim.request_frame import OUT_NONE, request_frame


class ConservationError(RuntimeError):
    """The every-request-ends-exactly-once invariant was violated (a simulator bug, never a user error)."""


class Readouts:
    """The results of a :class:`sim.simulator.Simulation`, read after (or during) its run."""

    def frame(self) -> pd.DataFrame:
        """One row per request with the latency decomposition at the client (ms)."""
        frame = request_frame(self)
        return frame if self.techniques is None else self.techniques.amend(self, frame)

    def utilisation_frame(self) -> pd.DataFrame:
        cols = ["t_s", "running", "waiting", "ready_slots", "busy_replicas", "replicas"]
        df = pd.DataFrame(self.samples, columns=cols)
        df["slot_utilisation"] = df.running / df.ready_slots.clip(lower=1)
        df["deployment"] = self.dep.name
        return df

    def gpu_busy_seconds_by_type(self) -> dict[str, float]:
        """GPU-seconds during which a GPU had work, per GPU type: per GPU, the union of the busy periods of the
        replicas computing on it (:mod:`sim.gpu_busy`). An engine that does not report its periods (the live-host
        model) counts its own busy time on each of its replica's GPUs."""
        now = self.env.now
        meter = self.gpu_meter
        seconds = meter.seconds(now)
        out: dict[str, float] = {}
        for gpu, s in zip(meter.gpu_type.tolist(), seconds.tolist(), strict=True):
            if s > 0:
                out[gpu] = out.get(gpu, 0.0) + s
        reps = {r.id: r for r in self.plane.state.replicas}
        for i, e in self.engines.items():
            if getattr(e, "meter", None) is None:
                r = reps[i]
                out[r.gpu] = out.get(r.gpu, 0.0) + e.busy_until(now) * r.spec.tensor_parallel
        return out

    def gpu_busy_seconds(self) -> float:
        """GPU-seconds during which a GPU had work (see :meth:`gpu_busy_seconds_by_type`)."""
        return float(sum(self.gpu_busy_seconds_by_type().values()))

    def _sampler(self):
        """A SimPy process: one utilisation sample every ``sample_s`` simulated seconds."""
        env = self.env
        state = self.plane.state
        reps, since = state.replicas, attrgetter("busy_since")
        while True:
            # The control plane's running totals, not a pass over every replica and queue (thousands of each at
            # 3,000 PoPs): slots count READY, up replicas only (a failed node's serve none).
            running, waiting, slots = state.totals()
            busy = len(self.engines) - list(map(since, self.engines.values())).count(-1.0)
            self.samples.append((env.now, running, waiting, slots, busy, len(reps)))
            yield env.timeout(self.sample_s)

    def check_conservation(self) -> None:
        """Raise :class:`ConservationError` unless every request ended (ok, rejected or failed)."""
        never = self.outcome.count(OUT_NONE)
        if never or self.remaining != 0:
            raise ConservationError(f"{never} requests never ended")
