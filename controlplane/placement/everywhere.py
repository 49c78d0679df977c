"""``everywhere-fits``: every node gets one replica of every model that still fits, most demanded models first.

Small models end up on every node, big ones wherever room is left; no demand or capacity reasoning beyond the
order. The baseline that shows what memory alone buys (so it ignores ``one_llm_per_gpu``: in the simulator its
co-located language models each compute as if they had the GPU alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.placement.base import PLACEMENTS, PlacementPolicy, PlacementProblem
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement


@PLACEMENTS.register("everywhere-fits")
@dataclass
class EverywhereFits(PlacementPolicy):
    """One replica per model per node while it fits, models in descending total demand. Memory alone decides
    (language models share GPUs under it even where a deployment asks for one per GPU)."""

    memory_only = True

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        net = problem.network()
        ledger = GpuLedger(net)
        demand = problem.demand.to_numpy().sum(axis=0)
        order = np.argsort(-demand, kind="stable")
        placed = []
        for node in range(net.n_nodes):
            for m in order:
                if net.fits[node, m]:
                    gpus = ledger.add(node, int(m))
                    if gpus is not None:
                        placed.append((node, int(m), gpus))
        return Placement(problem, problem.fleet, self.name, placed)
