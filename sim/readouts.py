"""What a run hands back and how it is checked: the per-request frame, the utilisation samples (and their
sampler), the GPU busy time, and the every-request-ends-exactly-once invariant.

A mixin of :class:`sim.simulator.Simulation` (it reads the simulation's per-request arrays, its samples, engines
and GPU meter).
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter

import pandas as pd

from sim.engine import ReplicaEngine
from sim.request_frame import OUT_NONE, request_frame


class ConservationError(RuntimeError):
    """The every-request-ends-exactly-once invariant was violated (a simulator bug, never a user error)."""


class BusyEngines:
    """How many of a simulation's engines (``engines``: replica id -> engine, only ever added to) have work now.

    Engines that report their busy periods to ``meter`` (:class:`sim.gpu_busy.GpuBusyMeter`) are counted by its
    running total, not one flag per engine (thousands at 3,000 PoPs, read at every sample); the others by their
    own ``busy_since``. When the meter also counts engines that are not in ``engines`` (a disaggregated replica's
    halves, bound one by one), every engine's flag is read, as :meth:`count_plain` does."""

    def __init__(self, engines: dict, meter):
        self.engines, self.meter = engines, meter
        self.seen = 0  # engines looked at so far (a dict keeps insertion order)
        self.metered = 0  # of those, the ones bound to the meter
        self.others: list = []  # the rest, read by their flag

    def count(self) -> int:
        engines, meter = self.engines, self.meter
        if len(engines) != self.seen:
            for eng in islice(engines.values(), self.seen, None):
                if isinstance(eng, ReplicaEngine) and eng.meter is meter:
                    self.metered += 1
                else:
                    self.others.append(eng)
            self.seen = len(engines)
        if self.metered != meter.bound:
            return self.count_plain()
        return meter.engines_busy + len(self.others) - list(map(_since, self.others)).count(-1.0)

    def count_plain(self) -> int:
        """The same count read from every engine's ``busy_since``."""
        return len(self.engines) - list(map(_since, self.engines.values())).count(-1.0)


_since = attrgetter("busy_since")


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
        reps = state.replicas
        busy_engines = BusyEngines(self.engines, self.gpu_meter)
        while True:
            # The control plane's running totals, not a pass over every replica and queue (thousands of each at
            # 3,000 PoPs): slots count READY, up replicas only (a failed node's serve none).
            running, waiting, slots = state.totals()
            self.samples.append((env.now, running, waiting, slots, busy_engines.count(), len(reps)))
            yield env.timeout(self.sample_s)

    def check_conservation(self) -> None:
        """Raise :class:`ConservationError` unless every request ended (ok, rejected or failed)."""
        never = self.outcome.count(OUT_NONE)
        if never or self.remaining != 0:
            raise ConservationError(f"{never} requests never ended")
