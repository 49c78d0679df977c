"""GPU-seconds with work, counted per GPU: the union of the busy periods of the replica engines computing on it.

Two replicas on one GPU (an encoder beside a language model, or both halves of a disaggregated site's pool on
their own GPUs) are one GPU busy while either has work, not two: summing each replica's busy time would count the
overlap twice and can put a GPU type's busy share above 1. Engines report the start and end of each busy period
(:class:`sim.engine.ReplicaEngine` with its ``meter`` set); the meter keeps, per GPU, how many engines are busy on
it now, since when it has been busy, and its busy seconds so far. The sampler of ``capacity.utilisation_mean``
reads the same counts.
"""

from __future__ import annotations

import numpy as np


class GpuBusyMeter:
    """Busy time of every GPU of ``fleet`` (GPUs numbered node by node, in ``gpu_index`` order within a node)."""

    def __init__(self, fleet):
        nodes = fleet.nodes
        gpus = nodes.gpus.to_numpy(dtype=np.int64)
        self.offset = np.concatenate([[0], np.cumsum(gpus)]).astype(np.int64).tolist()
        self.gpu_type = np.repeat(nodes.gpu.to_numpy(dtype=object), gpus)
        n = self.offset[-1]
        # Plain lists: engines update them once per busy period, where numpy scalar access would cost more.
        self.active = [0] * n
        self.since = [0.0] * n
        self.busy = [0.0] * n
        # Engines bound here, and how many of them are busy now (a fleet-wide count the utilisation samples read
        # instead of every engine's flag: thousands at 3,000 PoPs).
        self.bound = 0
        self.engines_busy = 0
        # GPUs with at least one engine busy on them, and with more than one (what the GPU-busy samples count)
        self.gpus_busy = self.gpus_shared = 0

    @property
    def total(self) -> int:
        """How many GPUs the fleet has."""
        return self.offset[-1]

    def ids(self, replica) -> tuple[int, ...]:
        """The GPU numbers of ``replica``'s GPUs."""
        return tuple(self.offset[replica.node] + int(g) for g in replica.gpu_index)

    def bind(self, engine, replica) -> None:
        """Have ``engine`` (a ReplicaEngine computing for ``replica``) report its busy periods here."""
        engine.gpu_ids = self.ids(replica)
        engine.meter = self
        self.bound += 1

    def start(self, ids: tuple, t: float) -> None:
        """An engine on GPUs ``ids`` got work at ``t`` (``ReplicaEngine.join`` writes this out where it runs)."""
        self.engines_busy += 1
        active = self.active
        for g in ids:
            a = active[g]
            if not a:
                self.since[g] = t
                self.gpus_busy += 1
            elif a == 1:
                self.gpus_shared += 1
            active[g] = a + 1

    def stop(self, ids: tuple, t: float) -> None:
        """An engine on GPUs ``ids`` ran out of work (or its node failed) at ``t`` (``ReplicaEngine._schedule``
        writes this out where it runs)."""
        self.engines_busy -= 1
        active = self.active
        for g in ids:
            a = active[g] = active[g] - 1
            if not a:
                self.busy[g] += t - self.since[g]
                self.gpus_busy -= 1
            elif a == 1:
                self.gpus_shared -= 1

    def seconds(self, t: float) -> np.ndarray:
        """Busy seconds of each GPU up to ``t``."""
        busy = np.array(self.busy)
        on = np.array(self.active) > 0
        busy[on] += t - np.array(self.since)[on]
        return busy

    def counts(self) -> np.ndarray:
        """How many engines are busy on each GPU now."""
        return np.array(self.active, dtype=np.int64)
