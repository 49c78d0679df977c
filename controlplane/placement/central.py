"""``central``: the same GPUs moved into a few cloud regions, replicas sized to the demand each region attracts.

The fleet is :func:`controlplane.fleet.central_fleet` of the problem's fleet (same nodes, each moved to its
nearest baseline region). Every (ingress, model) pair's demand is assigned to its nearest region able to host the
model; each region then adds replicas of each model (largest per-GPU footprint first, so big models pack first)
until their planned capacity (``utilisation_cap`` x rate, limited by the GPU time left on the node) covers that
demand, choosing the node type with the highest rate for the model among nodes where the replica still fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.fleet import central_fleet
from controlplane.placement.base import PLACEMENTS, PlacementPolicy, PlacementProblem
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement


@PLACEMENTS.register("central")
@dataclass
class Central(PlacementPolicy):
    """Options: ``baseline``: a named region set (``us-east``, ``big3``, ``global-6``) or comma-separated ids;
    ``scale``: central's GPU budget relative to the problem's fleet (1.0 = the same GPUs, 0.5 = half the nodes)."""

    baseline: str = "big3"
    scale: float = 1.0

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        regions = [r.strip() for r in self.baseline.split(",")] if "," in self.baseline else self.baseline
        fleet = central_fleet(problem.topo, regions, like=problem.fleet, scale=self.scale)
        net = problem.network(fleet)
        nearest = net.cand_site[:, 0]
        need = np.zeros((net.n_sites, net.n_models))
        np.add.at(need, (nearest, net.pair_model), net.pair_demand)
        ledger = GpuLedger(net)
        time_left = net.util * net.node_gpus.astype(float)
        order = sorted(range(net.n_models), key=lambda m: (-net.bytes_per_gpu[m], -net.tp[m], m))
        placed = []
        left_need = need.copy()
        for site in range(net.n_sites):
            members = np.flatnonzero(net.node_site == site)
            # First one replica of every model the region is asked for, so that a region short of capacity
            # still serves every model (at higher utilisation) instead of spending it all on the first ones.
            for m in order:
                if left_need[site, m] > 1e-9:
                    self._add(net, ledger, members, m, time_left, left_need[site], placed)
            for m in order:
                while left_need[site, m] > 1e-9:
                    if not self._add(net, ledger, members, m, time_left, left_need[site], placed):
                        break  # region full for this model: the rest is unserved (the evaluator says how much)
        return Placement(problem, fleet, self.name, placed, solver={"baseline": self.baseline})

    def _add(self, net, ledger, members, m, time_left, need_row, placed) -> bool:
        """One more replica of model ``m`` in the region; False when no node can take it."""
        node = self._best_node(net, ledger, members, m, time_left)
        if node < 0:
            return False
        rate = min(net.cap[node, m] * net.util, time_left[node] / net.gpu_time_per_rps[node, m])
        take = min(rate, need_row[m])
        placed.append((node, m, ledger.add(node, m)))
        time_left[node] -= take * net.gpu_time_per_rps[node, m]
        need_row[m] -= take
        return True


    @staticmethod
    def _best_node(net, ledger: GpuLedger, members: np.ndarray, m: int, time_left: np.ndarray) -> int:
        """The node with the highest rate for ``m`` that has GPU time left and room; ties: most time left."""
        best, key = -1, None
        for node in members:
            if not net.fits[node, m] or time_left[node] <= 1e-9:
                continue
            k = (net.cap[node, m], time_left[node] / net.node_gpus[node], -node)
            if key is not None and k <= key:
                continue
            if ledger.slot(int(node), m) is not None:
                best, key = int(node), k
        return best
