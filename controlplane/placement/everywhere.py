"""``everywhere-fits``: every node gets one replica of every model that still fits, most demanded models first.

Small models end up on every node, big ones wherever room is left; no demand or capacity reasoning beyond the
order. The baseline that shows what memory alone buys. It packs under the problem's rules as every policy does
(a problem built with ``one_llm_per_gpu`` gets at most one language model per GPU, and on a fleet too small for
that may fail to place a big model at all); ``memory_only`` is what makes memory alone decide in a deployment:
``build_deployment`` builds its problem and control plane without ``one_llm_per_gpu`` whatever the deployment's
config says, so in the simulator its co-located language models each compute as if they had the GPU alone.
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
    """One replica per model per node while it fits, models in descending total demand, packed under the
    problem's rules (with ``one_llm_per_gpu``, at most one language model per GPU). Deployments place it on a
    problem without that rule, so there memory alone decides and language models share GPUs even where the
    deployment asks for one per GPU."""

    memory_only = True  # deployments drop one_llm_per_gpu for it (controlplane.deployment.build_deployment)

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
