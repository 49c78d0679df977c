"""``greedy-demand``: add the replica with the best latency gain per GB it uses up, until nothing fits or gains.

What a replica uses up is its memory; under ``one_llm_per_gpu`` a language model's replica uses up its whole GPUs
(no other language model may compute there), so it is charged their memory, not its own.

The gain of a new replica of model ``m`` on node ``n`` (site ``s``) is the reduction of the evaluator's objective
when the replica takes demand up to its capacity: pairs that list ``s`` among their candidate sites offer their
unserved demand (worth ``unserved_penalty_ms - rtt``) and demand served farther away (worth the RTT saved), best
first. Accepted moves free capacity elsewhere, which is refilled the same way. Gains only shrink as replicas are
added (demand gets closer, memory and GPU time get used), so a lazy priority queue re-scores only the top entry.
Where demand is served, and the offers to each site, are kept move by move in
:mod:`controlplane.placement.greedy_routing`. Once nothing fits or gains, a swap search
(:mod:`controlplane.placement.local_search`) revisits the choices on the same routing state. The final plan is
scored by the shared evaluator, which re-routes demand optimally.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from controlplane.placement.base import PLACEMENTS, PlacementPolicy, PlacementProblem
from controlplane.placement.greedy_routing import GreedyRouting
from controlplane.placement.local_search import SwapSearch
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement
from edgepop.errors import UserError
from edgepop.memory import collector_paused

_EPS = 1e-9


class _LazyQueue:
    """Greedy's (node, model) entries by an upper bound of their score, highest first (ties: lower node, then
    model); ``version`` retires superseded entries. An entry is keyed node x n_models + model, in (node, model)
    order: the heap's ties break the same way.

    Entries of unknown score (models of a node whose GPU time was freed: their gains may have grown) come out before
    all others, in (node, model) order, as entries queued at +inf would; each but the last is re-scored and
    re-queued at once (an entry at +inf is next), so only the last is weighed against the queue."""

    def __init__(self, n_nodes: int, n_models: int):
        self.n_models = n_models
        self.heap: list[tuple[float, int, int]] = []
        self.version = [0] * (n_nodes * n_models)
        self.unknown: list[tuple[int, int]] = []  # last first

    def push(self, node: int, m: int, value: float) -> None:
        key = node * self.n_models + m
        version = self.version[key] = self.version[key] + 1
        heapq.heappush(self.heap, (-value, key, version))

    def push_unknown(self, entries: list[tuple[int, int]]) -> None:
        self.unknown = sorted(entries, reverse=True)
        version, n_models = self.version, self.n_models
        for node, m in self.unknown:
            version[node * n_models + m] += 1

    def pop(self) -> tuple[int, int, bool] | None:
        """The next entry: (node, model, whether to weigh its fresh score against :meth:`best`); None when empty."""
        if self.unknown:
            node, m = self.unknown.pop()
            return node, m, not self.unknown
        heap, version = self.heap, self.version
        while heap:
            _, key, v = heapq.heappop(heap)
            if version[key] == v:
                node, m = divmod(key, self.n_models)
                return node, m, True
        return None

    def best(self) -> float:
        """The highest bound queued (-inf when none is)."""
        return -self.heap[0][0] if self.heap else -math.inf


@PLACEMENTS.register("greedy-demand")
@dataclass
class GreedyDemand(PlacementPolicy):
    """Options: ``min_gain_ms_per_gb``: stop when the best replica improves the objective by no more than this
    (ms per request, per GB of replica memory; at 0, replicas that gain nothing are not placed).
    ``swap_passes`` / ``swap_trials``: limits of the swap search that improves the constructed plan
    (:mod:`controlplane.placement.local_search`; 0 passes: none)."""

    min_gain_ms_per_gb: float = 1e-7
    swap_passes: int = 20
    swap_trials: int = 4000
    cacheable = True

    @staticmethod
    def check_options(min_gain_ms_per_gb: float = 1e-7, swap_passes: int = 20, swap_trials: int = 4000) -> None:
        """The options' values (the registry calls it when a scenario is read; :meth:`place` again)."""
        for name, value in (("min_gain_ms_per_gb", min_gain_ms_per_gb), ("swap_passes", swap_passes),
                            ("swap_trials", swap_trials)):
            if not value >= 0:  # a negative or NaN threshold would place replicas that gain nothing, up to every slot
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        try:
            self.check_options(self.min_gain_ms_per_gb, self.swap_passes, self.swap_trials)
        except ValueError as exc:
            raise UserError(f"greedy-demand option {exc}") from None
        # Greedy builds and drops ~10^6 small acyclic objects (offers, heap entries): the cyclic collector's
        # passes over them and everything else alive free nothing (13-15% of the run at 3,000 PoPs).
        with collector_paused():
            return self._place(problem)

    def _place(self, problem: PlacementProblem) -> Placement:
        net = problem.network().in_planning_units()
        state = GreedyRouting(net)
        ledger = GpuLedger(net)
        gb = (net.replica_bytes / 1e9).tolist()
        # What a replica uses up, in GB: its memory; but a replica that computes alone on its GPUs (one language
        # model per GPU) uses up those whole GPUs, whatever its size: charged by memory, small language models
        # would crowd out the bigger ones the demand needs, one GPU each all the same.
        gpu_gb = (net.gpu_limit / 1e9).tolist()
        exclusive, tp = net.exclusive.tolist(), net.tp.tolist()
        scale = 1.0 / net.total_demand

        cost = [[tp[m] * gpu_gb[node] if exclusive[m] else gb[m] for m in range(net.n_models)]
                for node in range(net.n_nodes)]

        def priority(node: int, m: int) -> float:
            capacity = state.marginal(node, m)
            return state.gain(node, m, capacity) * scale / cost[node][m] if capacity > _EPS else 0.0

        queue = _LazyQueue(net.n_nodes, net.n_models)
        fitting = [np.flatnonzero(row).tolist() for row in net.fits]
        placed = []

        # Whether a replica of m still fits on node (ledger.slot is not None), known until the node takes one:
        # the heap pops ~10^5 entries and the ledger changes only at accepts.
        room: list[dict[int, bool]] = [{} for _ in range(net.n_nodes)]

        def accept(node: int, m: int) -> set[int]:
            room[node].clear()
            placed.append((node, m, ledger.add(node, m)))
            state.counts[node][m] += 1
            return state.fill(node)

        # Every demanded model first gets one replica (hardest to fit first, where it gains most): a plan
        # that leaves a model out cannot serve it at all, however well it serves the rest.
        for m in sorted(range(net.n_models), key=lambda m: (-net.bytes_per_gpu[m], -net.tp[m], m)):
            nodes = [n for n in np.flatnonzero(net.fits[:, m]).tolist() if ledger.slot(n, m) is not None]
            if nodes:
                accept(max(nodes, key=lambda n: (priority(n, m), -n)), m)
        for n, m in zip(*np.nonzero(net.fits), strict=True):
            queue.push(int(n), int(m), priority(int(n), int(m)))
        while (entry := queue.pop()) is not None:
            node, m, weigh = entry
            fits = room[node].get(m)
            if fits is None:
                fits = room[node][m] = ledger.slot(node, m) is not None
            if not fits:
                continue  # no room (memory on a node only shrinks)
            value = priority(node, m)
            if value <= self.min_gain_ms_per_gb:
                continue  # dormant until GPU time frees on this node (then it is re-scored)
            if not weigh or value < queue.best():
                queue.push(node, m, value)  # the bound was stale: re-queue with the fresh score
                continue
            freed = accept(node, m)
            queue.push(node, m, value)
            # GPU time freed on other nodes can raise the gains there: their models' scores become unknown.
            # (Keeping the entries whose marginal capacity did not grow would be as valid a bound, and breaks ties
            # between identical nodes of a site differently: another plan of the same cost.)
            queue.push_unknown([(other, model) for other in freed - {node} for model in fitting[other]])
        solver = {"replicas_considered": int(net.fits.sum())}
        if self.swap_passes > 0:
            before = state.cost * scale
            search = SwapSearch(net, state, ledger, max_passes=self.swap_passes, max_trials=self.swap_trials)
            search.run()
            placed = ledger.placements()
            solver.update(swap_trials=search.trials, swaps=search.accepted, swap_passes=search.passes,
                          routed_ms_before_swaps=round(before, 6), routed_ms=round(state.cost * scale, 6))
        return Placement(problem, problem.fleet, self.name, placed, solver=solver)
