"""``greedy-demand``: add the replica with the best latency gain per GB it uses up, until nothing fits or gains.

What a replica uses up is its memory; under ``one_llm_per_gpu`` a language model's replica uses up its whole GPUs
(no other language model may compute there), so it is charged their memory, not its own.

The gain of a new replica of model ``m`` on node ``n`` (site ``s``) is the reduction of the evaluator's objective
when the replica takes demand up to its capacity: pairs that list ``s`` among their candidate sites offer their
unserved demand (worth ``unserved_penalty_ms - rtt``) and demand served farther away (worth the RTT saved), best
first. Accepted moves free capacity elsewhere, which is refilled the same way. Gains only shrink as replicas are
added (demand gets closer, memory and GPU time get used), so a lazy priority queue re-scores only the top entry.
Once nothing fits or gains, a swap search (:mod:`controlplane.placement.local_search`) revisits the choices on the
same routing state. The final plan is scored by the shared evaluator, which re-routes demand optimally.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from controlplane.placement.base import PLACEMENTS, PlacementPolicy, PlacementProblem
from controlplane.placement.local_search import SwapSearch
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement
from controlplane.placement.takers import initial_offers, takers_of
from edgepop.errors import UserError

_EPS = 1e-9


class _Routing:
    """Greedy's own bookkeeping: where each pair's demand is served and what each node has left.

    Hot loops run on plain Python lists (numpy scalar indexing would dominate the run time).
    """

    def __init__(self, net):
        self.net = net
        self.penalty = float(net.problem.unserved_penalty_ms)
        self.util = float(net.util)
        self.unserved = net.pair_demand.astype(float).tolist()
        # served[p]: node -> [rps, rtt ms from the pair's ingress to that node's site]
        self.served: list[dict[int, list[float]]] = [{} for _ in range(len(net.pair_demand))]
        # pairs_at[node][m]: the pairs of model m with some demand served on node (the keys of served[p])
        self.pairs_at: list[list[set[int]]] = [[set() for _ in range(net.n_models)] for _ in range(net.n_nodes)]
        # worst[p]: the highest per-rps cost any of p's demand pays now (penalty while some is unserved).
        self.worst = [self.penalty] * len(net.pair_demand)
        self.counts = [[0] * net.n_models for _ in range(net.n_nodes)]
        self.flow = [[0.0] * net.n_models for _ in range(net.n_nodes)]
        self.cap = net.cap.tolist()
        self.time_per_rps = net.gpu_time_per_rps.tolist()
        self.time_left = (net.util * net.node_gpus.astype(float)).tolist()
        self.node_site = net.node_site.tolist()
        self.pair_model = net.pair_model.tolist()
        # rps x ms of the current routing (unserved at the penalty): the objective times total demand.
        self.cost = self.penalty * float(net.pair_demand.sum())
        # While not None, every move is appended as (pair, src, dst, rps, src rtt) so that it can be undone.
        self.journal: list | None = None
        # Per (site, model), the takers still able to offer while demand only moves closer; None once it may
        # move away again (the swap search, which takes replicas off, sets it).
        self.live: dict[tuple[int, int], dict[int, float]] | None = {}
        # Offers cached per (site, model). A move of pair p marks p stale in the offers of p's candidate sites
        # only, the only ones that read p's state (``keys_of[p]``); the next read re-derives p's entries.
        self._offers: dict[tuple[int, int], list] = {}
        self._stale: dict[tuple[int, int], set[int]] = {}
        self._sums: dict[tuple[int, int], tuple[list, float, float]] = {}  # (offers, their rps, their gain)
        self.takers, self.keys_of = takers_of(net)
        # The stale sets a move of p marks, one per key p lists, held per pair (a move marks a dozen of them and
        # moves run ~10^5 times). A key's set is emptied whenever its offers are computed afresh, so marks made
        # before then never count.
        for key in self.takers:
            self._stale[key] = set()
        self._stale_of = [[self._stale[key] for key in keys] for keys in self.keys_of]
        self._initial_offers()

    def _initial_offers(self) -> None:
        """Every key's offers and live takers before any demand is served, as :meth:`_fresh_offers` would find
        them, from one sort for all keys (:func:`~controlplane.placement.takers.initial_offers`)."""
        self._offers, self.live = initial_offers(self.net, self.penalty, self.takers)

    def available(self, node: int, m: int, extra: int = 0) -> float:
        """Demand (rps) ``node`` could still take for ``m`` with ``extra`` more replicas."""
        by_replicas = (self.counts[node][m] + extra) * self.cap[node][m] * self.util - self.flow[node][m]
        per = self.time_per_rps[node][m]
        by_time = self.time_left[node] / per if per > 0 else 0.0
        return max(0.0, min(by_replicas, by_time))

    def marginal(self, node: int, m: int) -> float:
        """Demand (rps) one more replica of ``m`` would let ``node`` take: ``available(node, m, extra=1) -
        available(node, m)`` with the shared GPU-time bound read once (greedy asks this ~10^5 times)."""
        count, c, f = self.counts[node][m], self.cap[node][m], self.flow[node][m]
        per = self.time_per_rps[node][m]
        by_time = self.time_left[node] / per if per > 0 else 0.0
        more = max(0.0, min((count + 1) * c * self.util - f, by_time))
        return more - max(0.0, min(count * c * self.util - f, by_time))

    def offers(self, node: int, m: int) -> list[tuple[float, int, int, float]]:
        """Demand that would gain by moving to ``node``: (-gain ms per rps, pair, from node or -1, rps), best first.

        The same for every node of a site, and unchanged until a move of a pair that lists the site: cached per
        (site, model). Lists are replaced, never changed in place: a caller may move demand while it reads one."""
        return self._offers_at((self.node_site[node], m))

    def _offers_at(self, key: tuple[int, int]) -> list[tuple[float, int, int, float]]:
        """:meth:`offers` of a (site, model) key (callers that hold the key already)."""
        hit = self._offers.get(key)
        if hit is None:
            hit = self._offers[key] = self._fresh_offers(key)
            self._stale.setdefault(key, set()).clear()
        else:
            stale = self._stale[key]
            if stale:
                every = self.takers[key]
                rows = every if self.live is None else self.live.get(key, every)
                # A moved pair the key's rows left out never offers here again (its demand only moves closer
                # while they are kept): its entries, none, cannot have changed.
                moved = stale if rows is every else stale.intersection(rows)
                if not moved:
                    pass
                elif rows is not every:
                    # Construction: keep the others' entries (sorted), re-derive the moved pairs' and merge; a
                    # moved pair that offers nothing here now never will (see _fresh_offers): dropped from rows.
                    still: dict[int, float] = {}
                    hit = self._offers[key] = self._compute_offers([(p, rows[p]) for p in moved],
                                                                   [e for e in hit if e[1] not in moved], still)
                    if len(still) < len(moved):
                        for p in moved.difference(still):
                            del rows[p]
                elif 3 * len(moved) > len(rows):
                    hit = self._offers[key] = self._fresh_offers(key)
                else:  # keep the others' entries (sorted), re-derive the moved pairs' and merge
                    hit = self._offers[key] = self._compute_offers(((p, every[p]) for p in moved),
                                                                   [e for e in hit if e[1] not in moved], {})
                stale.clear()
        return hit

    def _fresh_offers(self, key: tuple[int, int]) -> list[tuple[float, int, int, float]]:
        """The offers of ``key`` from all its takers. While demand only moves closer (greedy's construction,
        :attr:`live` not None), a taker whose demand is all at least as close as the site never offers again:
        it is dropped from the key's rows for good."""
        every = self.takers.get(key, {})
        if self.live is None:
            return self._compute_offers(every.items(), [], {})
        rows = self.live.get(key)
        live: dict[int, float] = {}
        out = self._compute_offers((every if rows is None else rows).items(), [], live)
        self.live[key] = live
        return out

    def _compute_offers(self, takers, out: list, live: dict) -> list[tuple[float, int, int, float]]:
        # Entries carry the negated gain so that a plain tuple sort gives best first, ties by pair then source:
        # the same list however it was assembled. ``live`` collects the takers that may offer.
        penalty, unserved, served, worst, eps = self.penalty, self.unserved, self.served, self.worst, _EPS
        append = out.append
        for p, r in takers:
            if worst[p] - r <= eps:
                continue  # all of p's demand is already at least this close
            live[p] = r
            if unserved[p] > eps:
                append((r - penalty, p, -1, unserved[p]))
            for other, (amount, rtt) in served[p].items():
                if rtt - r > eps:
                    append((r - rtt, p, other, amount))
        out.sort()
        return out

    def gain(self, node: int, m: int, capacity: float) -> float:
        """rps x ms the best offers to ``node`` save within ``capacity`` rps."""
        key = (self.node_site[node], m)
        offers = self._offers_at(key)
        sums = self._sums.get(key)
        if sums is None or sums[0] is not offers:
            # Most calls can take every offer, and half of them read a list already summed: the whole list's
            # rps and gain, added in list order (the loop below adds the same terms in the same order).
            rps = total = 0.0
            for neg_gain, _, _, amount in offers:
                total -= neg_gain * amount
                rps += amount
            sums = self._sums[key] = (offers, rps, total)
        # Offers are above _EPS rps each, so with this much room the loop below would take each one whole (the
        # margin covers the rounding of its running subtraction).
        if capacity >= sums[1] + 1e-9 * capacity + 1e-6:
            return sums[2]
        total = 0.0
        for neg_gain, _, _, amount in offers:
            if capacity <= _EPS:
                break
            take = capacity if capacity < amount else amount  # min(amount, capacity) without the call
            total -= neg_gain * take
            capacity -= take
        return total

    def move(self, p: int, src: int, dst: int, dst_rtt: float, amount: float) -> None:
        """Move ``amount`` rps of pair ``p`` from node ``src`` to node ``dst`` (-1: unserved, at the penalty)."""
        for marks in self._stale_of[p]:
            marks.add(p)
        m = self.pair_model[p]
        served, unserved = self.served[p], self.unserved
        if src < 0:
            src_rtt = self.penalty
            unserved[p] -= amount
        else:
            entry = served[src]
            src_rtt = entry[1]
            entry[0] -= amount
            if entry[0] <= _EPS:
                del served[src]
                self.pairs_at[src][m].discard(p)
            self.flow[src][m] -= amount
            self.time_left[src] += amount * self.time_per_rps[src][m]
        if dst < 0:
            dst_rtt = self.penalty
            unserved[p] += amount
        else:
            entry = served.get(dst)
            if entry is None:
                entry = served[dst] = [0.0, dst_rtt]
                self.pairs_at[dst][m].add(p)
            entry[0] += amount
            self.flow[dst][m] += amount
            self.time_left[dst] -= amount * self.time_per_rps[dst][m]
        self.cost += amount * (dst_rtt - src_rtt)
        if self.journal is not None:
            self.journal.append((p, src, dst, amount, src_rtt))
        if unserved[p] > _EPS:
            self.worst[p] = self.penalty
        else:
            worst = 0.0
            for entry in served.values():  # a pair is served at one or two nodes: no generator for max()
                if entry[1] > worst:
                    worst = entry[1]
            self.worst[p] = worst

    def fill(self, node: int, max_steps: int = 20_000) -> set[int]:
        """Move the best offers onto ``node``'s replicas up to their free capacity, then refill the nodes that
        freed capacity, and so on. Returns the nodes whose GPU time was freed (their gains may have grown)."""
        queue, steps, freed = [node], 0, set()
        # Nodes queued and not refilled since: a refill takes all it can, so a node queued several times over
        # has nothing more to take at its later turns unless capacity was freed on it again (which re-adds it).
        pending = {node}
        while queue and steps < max_steps:
            target = queue.pop()
            steps += 1
            if target not in pending:
                continue
            pending.discard(target)
            site = self.node_site[target]
            for model, count in enumerate(self.counts[target]):
                if not count:
                    continue
                capacity = self.available(target, model)
                if capacity <= _EPS:
                    continue  # the loop below would stop at its first offer
                key = (site, model)
                rtt = self.takers.get(key)  # each taker's RTT to the site (the RTT matrix's own values)
                for _, p, src, amount in self._offers_at(key):
                    if capacity <= _EPS:
                        break
                    take = min(amount, capacity)
                    self.move(p, src, target, rtt[p], take)
                    capacity -= take
                    if src >= 0:
                        queue.append(src)
                        pending.add(src)
                        freed.add(src)
        return freed


@PLACEMENTS.register("greedy-demand")
@dataclass
class GreedyDemand(PlacementPolicy):
    """Options: ``min_gain_ms_per_gb``: stop when the best replica improves the objective by less than this
    (ms per request, per GB of replica memory). ``swap_passes`` / ``swap_trials``: limits of the swap search that
    improves the constructed plan (:mod:`controlplane.placement.local_search`; 0 passes: none)."""

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
        net = problem.network().in_planning_units()
        state = _Routing(net)
        ledger = GpuLedger(net)
        gb = (net.replica_bytes / 1e9).tolist()
        # What a replica uses up, in GB: its memory; but a replica that computes alone on its GPUs (one language
        # model per GPU) uses up those whole GPUs, whatever its size: charged by memory, small language models
        # would crowd out the bigger ones the demand needs, one GPU each all the same.
        gpu_gb = (net.gpu_limit / 1e9).tolist()
        exclusive, tp = net.exclusive.tolist(), net.tp.tolist()
        scale = 1.0 / net.total_demand

        def cost(node: int, m: int) -> float:
            return tp[m] * gpu_gb[node] if exclusive[m] else gb[m]

        def priority(node: int, m: int) -> float:
            capacity = state.marginal(node, m)
            return state.gain(node, m, capacity) * scale / cost(node, m) if capacity > _EPS else 0.0

        # Lazy greedy: entries hold upper bounds of their gain; ``version`` retires superseded entries.
        heap, version = [], {}

        def push(node: int, m: int, value: float) -> None:
            version[node, m] = version.get((node, m), 0) + 1
            heapq.heappush(heap, (-value, node, m, version[node, m]))

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
            push(int(n), int(m), priority(int(n), int(m)))
        while heap:
            _, node, m, v = heapq.heappop(heap)
            if version[node, m] != v:
                continue  # superseded
            fits = room[node].get(m)
            if fits is None:
                fits = room[node][m] = ledger.slot(node, m) is not None
            if not fits:
                continue  # no room (memory on a node only shrinks)
            value = priority(node, m)
            if value < self.min_gain_ms_per_gb:
                continue  # dormant until GPU time frees on this node (then it is re-queued)
            if heap and value < -heap[0][0]:
                push(node, m, value)  # the bound was stale: re-queue with the fresh score
                continue
            freed = accept(node, m)
            push(node, m, value)
            # GPU time freed on other nodes can raise the gains there: re-queue them as unknown (+inf). (Keeping
            # the entries whose marginal capacity did not grow would be as valid a bound, and breaks ties between
            # identical nodes of a site differently: another plan of the same cost.)
            for other in freed - {node}:
                for model in fitting[other]:
                    push(other, model, np.inf)
        solver = {"replicas_considered": int(net.fits.sum())}
        if self.swap_passes > 0:
            before = state.cost * scale
            search = SwapSearch(net, state, ledger, max_passes=self.swap_passes, max_trials=self.swap_trials)
            search.run()
            placed = ledger.placements()
            solver.update(swap_trials=search.trials, swaps=search.accepted, swap_passes=search.passes,
                          routed_ms_before_swaps=round(before, 6), routed_ms=round(state.cost * scale, 6))
        return Placement(problem, problem.fleet, self.name, placed, solver=solver)
