"""Swap local search after greedy-demand's construction: give a replica's GPUs to another model when that pays.

Greedy adds one replica at a time and never revisits a choice, so the last GPUs go to whatever model gained most
per GB *then*; once every GPU is taken (one language model per GPU makes that the rule) no later gain can
correct an early choice. A *swap* takes the replica of model ``A`` off node ``n``, re-homes the demand it served
to the nearest other replicas of ``A`` with room (or leaves it unserved), puts a replica of model ``B`` on the
freed GPUs and pulls the demand that gains by moving there (greedy's own ``fill``, which refills the replicas it
drained in turn); GPUs left free (a two-GPU replica replaced by a one-GPU one) get the best-gaining replica that
fits. A model that needs more GPUs than the removed replica freed (tensor parallel) also takes the node's other
exclusive replicas off first, smallest first. A swap never takes a model's last replica.

Every swap runs on greedy's incremental routing state (no LP: an evaluation of the whole plan costs far more than
a swap), whose cost (rps x ms, unserved at the penalty) changes with every move; a swap that does not lower it is
undone move by move from a journal. Which swaps to try: each pass estimates, for every replica, the loss of
removing it (its demand re-homed to the next candidate site hosting the model) and, for every node and model, the
gain of a new replica there (greedy's gain), and tries the pairs with estimated gain above loss, best first.
Passes repeat until one accepts no swap, within fixed pass and trial limits: the result depends on the problem
alone, never on a clock or on a random draw. Passes after the first re-estimate only the nodes of the sites whose
offers the accepted swaps changed.

On the default scenario's edge problem (228 GPUs, one language model per GPU) greedy alone ends 5.9% above the
ILP's optimum, its language-model mix set by early choices; the search takes it to about 3% in about 0.3 s more.
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from controlplane.placement.greedy_routing import takes_all
from controlplane.placement.takers import running_sums

_EPS = 1e-9
_first, _second = itemgetter(0), itemgetter(1)
_UNKNOWN = object()  # a removal set not cached yet


class SwapSearch:
    """Improves the plan held by greedy's ``state`` (routing) and ``ledger`` (GPU memory) in place."""

    def __init__(self, net, state, ledger, *, max_passes: int = 20, max_trials: int = 4000,
                 min_gain: float = 1e-6):
        self.net, self.state, self.ledger = net, state, ledger
        state.track_pairs()
        self.max_passes, self.max_trials = max_passes, max_trials
        # A swap must lower the cost by this share of the total demand x 1 ms (float noise is not a gain).
        self.min_gain = min_gain * float(net.total_demand)
        self.nodes_at: list[list[int]] = [[] for _ in range(net.n_sites)]
        for n, s in enumerate(net.node_site.tolist()):
            self.nodes_at[s].append(n)
        # Each pair's (site, RTT) candidates as Python values, converted when a swap first re-homes the pair (a
        # whole-matrix tolist() is half a million rows at 3,000 PoPs, most never read); -1 pads the sites.
        self._cands: dict[int, list[tuple[int, float]]] = {}
        self.fitting = [np.flatnonzero(row).tolist() for row in net.fits]  # (numpy scalar reads: 0.3 s at 3,000 PoPs)
        self.bytes = net.bytes_per_gpu.tolist()
        self.tp = net.tp.tolist()
        self.exclusive = net.exclusive.tolist()
        self.trials = self.accepted = self.passes = 0
        self.replicas = [sum(row[m] for row in state.counts) for m in range(net.n_models)]
        self._ops: list = []
        self._sets: list[dict[tuple[int, int], tuple[int, ...] | None]] = [{} for _ in range(net.n_nodes)]
        # Removal sets by what a node holds (free bytes and language-model flags per GPU, its replicas in order):
        # nodes alike hold alike (34 kinds among 484 nodes at 3,000 PoPs). ``_holding_now``: per node, what it
        # holds during one estimate (no replica moves within one).
        self._sets_by_holding: dict[tuple, dict[tuple[int, int], tuple[int, ...] | None]] = {}
        self._holding_now: dict[int, tuple] = {}
        self._room_now: np.ndarray | None = None  # _has_room() during one estimate
        # Per pair and candidate, the (site, model) key as one index into a flat sites x models table (padding:
        # the table's extra last cell).
        pad = net.n_sites * net.n_models
        self._cand_key = np.where(net.cand_site >= 0, net.cand_site * net.n_models + net.pair_model[:, None], pad)

    # ------------------------------------------------------------------ moves with undo
    def _add(self, node: int, m: int) -> bool:
        gpus = self.ledger.add(node, m)
        if gpus is None:
            return False
        self._ops.append(("add", node, m, gpus))
        self.state.counts[node][m] += 1
        self.replicas[m] += 1
        self.state.fill(node)
        return True

    def _remove(self, node: int, m: int) -> None:
        st = self.state
        gpus = self.ledger.remove(node, m)
        self._ops.append(("remove", node, m, gpus))
        st.counts[node][m] -= 1
        self.replicas[m] -= 1
        excess = st.flow[node][m] - st.counts[node][m] * st.cap[node][m] * st.util
        if excess <= _EPS:
            return
        # Evict the farthest demand first (the nearest keeps its short trip), then re-home it.
        here = sorted((-entry[1], p) for p, entry in st.pairs_at[node][m].items())  # entry: served[p][node]
        evicted = []
        for _, p in here:
            if excess <= _EPS:
                break
            take = min(st.served[p][node][0], excess)
            st.move(p, node, -1, st.penalty, take)
            excess -= take
            evicted.append(p)
        for p in evicted:
            self._rehome(p)

    def _rehome(self, p: int) -> None:
        """Serve ``p``'s unserved demand at its nearest candidate sites with room."""
        st = self.state
        m = st.pair_model[p]
        counts = st.counts
        cands = self._cands.get(p)
        if cands is None:
            net = self.net
            cands = self._cands[p] = list(zip(net.cand_site[p].tolist(), net.cand_rtt[p].tolist(), strict=True))
        for s, r in cands:
            if s < 0:
                return
            for node in self.nodes_at[s]:
                if st.unserved[p] <= _EPS:
                    return
                if counts[node][m]:
                    room = st.available(node, m)
                    if room > _EPS:
                        st.move(p, -1, node, r, min(room, st.unserved[p]))

    def _undo(self) -> None:
        st = self.state
        for p, src, dst, amount, src_rtt in reversed(st.journal):
            st.move(p, dst, src, src_rtt, amount)
        for op, node, m, gpus in reversed(self._ops):
            if op == "add":
                self.ledger.remove(node, m, gpus)
                st.counts[node][m] -= 1
                self.replicas[m] -= 1
            else:
                self.ledger.seat(node, m, gpus)
                st.counts[node][m] += 1
                self.replicas[m] += 1

    # ------------------------------------------------------------------ estimates
    def _removal_losses(self, nodes: set[int]) -> dict[tuple[int, int], float]:
        """rps x ms lost by taking one replica of (node, model) off, its demand moved to the next site hosting
        the model (capacity of that site ignored, the penalty when there is none)."""
        st, counts, n_models = self.state, self.state.counts, self.net.n_models
        loss: dict[tuple[int, int], float] = {}
        # The served demand of ``nodes``: node by node, each model's pairs ascending (every sum below adds its
        # terms in that order). Only what is above the remaining replicas' capacity moves when a replica of
        # several goes.
        keys, sizes, shares, pairs, amounts, rtts = [], [], [], [], [], []
        for node in sorted(nodes):
            for m in range(n_models):
                at = st.pairs_at[node][m]
                if not at:
                    continue
                share = 1.0
                if counts[node][m] > 1:
                    over = st.flow[node][m] - (counts[node][m] - 1) * st.cap[node][m] * st.util
                    if over <= _EPS:
                        loss[node, m] = 0.0
                        continue
                    share = min(1.0, over / st.flow[node][m])
                keys.append((node, m))
                sizes.append(len(at))
                shares.append(share)
                ps = sorted(at)
                served = list(map(at.__getitem__, ps))  # served[p][node] is [rps, rtt]
                pairs.extend(ps)
                amounts.extend(map(_first, served))
                rtts.extend(map(_second, served))
        if not keys:
            return loss
        # Where each pair's demand would go: its first candidate site where a node other than this one hosts the
        # model with room (site rooms counted once: how many nodes, and the first of them).
        # Per key (site x n_models + model), and a last cell for the candidates' padding (never any room).
        hosts, hosted = np.nonzero(self._has_room())  # node by node, models ascending
        room_key = np.asarray(st.node_site)[hosts] * n_models + hosted
        room_count = np.bincount(room_key, minlength=self.net.n_sites * n_models + 1)
        room_first = np.full(len(room_count), -1)
        firsts, at_first = np.unique(room_key, return_index=True)  # each key's first node
        room_first[firsts] = hosts[at_first]
        entry_node = np.repeat(np.array([n for n, _ in keys], dtype=np.int64), sizes)[:, None]
        p = np.array(pairs, dtype=np.int64)
        at = self._cand_key[p]  # padding comes last, a key with no room
        n_room = room_count[at]
        other = (n_room > 1) | ((n_room == 1) & (room_first[at] != entry_node))
        first = other.argmax(axis=1)
        rows = np.arange(len(p))
        alt = np.where(other[rows, first], self.net.cand_rtt[p, first], st.penalty)
        amounts = np.array(amounts) * np.repeat(shares, sizes)  # the share of each key's demand that moves
        terms = amounts * np.maximum(alt - np.array(rtts), 0.0)
        ends = np.cumsum(sizes)
        # Each key's terms added one by one in order, as a Python loop adds them (a cumulative sum per key).
        totals = running_sums(terms, np.stack([ends - sizes, ends], axis=1)).tolist()
        loss.update(zip(keys, totals, strict=True))
        return loss

    def _has_room(self) -> np.ndarray:
        """Per node and model, whether the node hosts the model with room: ``counts and available() > _EPS``,
        the same float operations on whole arrays. Found once per estimate (no replica moves within one)."""
        if self._room_now is not None:
            return self._room_now
        st = self.state
        counts = np.array(st.counts)
        per = np.array(st.time_per_rps)
        by_replicas = counts * np.array(st.cap) * st.util - np.array(st.flow)
        by_time = np.divide(np.array(st.time_left)[:, None], per, out=np.zeros_like(per), where=per > 0)
        self._room_now = (counts > 0) & (np.where(by_time < by_replicas, by_time, by_replicas) > _EPS)
        return self._room_now

    def _candidates(self, nodes: set[int]) -> list[tuple[float, int, tuple[int, ...], int]]:
        """(-estimated gain, node, models removed, model added) of the swaps on ``nodes`` worth a trial, best
        first."""
        st, ledger = self.state, self.ledger
        self._holding_now, self._room_now = {}, None
        loss = self._removal_losses(nodes)
        has_room = self._has_room().tolist()
        gains: dict[tuple[int, int, float], float] = {}  # nodes of a site see the same offers
        whole: dict[tuple[int, int], tuple[float, float]] = {}  # per (site, b), rps and gain of all its offers
        out = []
        for node in sorted(nodes):
            held = ledger.held[node]
            site = st.node_site[node]
            flow, per_rps, cap = st.flow[node], st.time_per_rps[node], st.cap[node]
            # b has room here already: fill left no demand that would gain by coming (whatever a goes)
            wanted = [b for b in self.fitting[node] if not has_room[node][b]]
            # Per removal set (the same for most b): whether it takes a model's last replica, the GPU time it
            # frees and the loss it causes.
            of_removal: dict[tuple[int, ...], tuple[bool, float, float]] = {}
            for a in sorted({m for m, _ in held}):
                for b in wanted:
                    if b == a:
                        continue
                    removed = self._removal_set(node, a, b)
                    if removed is None:
                        continue
                    known = of_removal.get(removed)
                    if known is None:
                        if len(removed) == 1:  # the general case below, its sums of one term written out
                            known = (self.replicas[a] <= 1, st.time_left[node] + flow[a] * per_rps[a],
                                     loss.get((node, a), 0.0))
                        else:
                            known = (self._last_replica(removed),
                                     st.time_left[node] + sum(flow[m] * per_rps[m] for m in set(removed)),
                                     sum(loss.get((node, m), 0.0) for m in removed))
                        of_removal[removed] = known
                    last, freed_time, lost = known
                    if last:
                        continue
                    per = per_rps[b]
                    capacity = min(cap[b] * st.util, freed_time / per if per > 0 else 0.0)
                    # Most capacities take every offer: gain() would return the whole list's gain.
                    known = whole.get((site, b))
                    if known is None:
                        known = whole[site, b] = st.summed(node, b)
                    rps, gain = known
                    if not takes_all(capacity, rps):
                        key = (site, b, capacity)
                        gain = gains.get(key)
                        if gain is None:
                            gain = gains[key] = st.gain(node, b, capacity)
                    gain -= lost
                    if gain > self.min_gain:
                        out.append((-gain, node, removed, b))
        out.sort()
        return out

    def _last_replica(self, removed: tuple[int, ...]) -> bool:
        """Whether taking ``removed`` off would leave a model with no replica (its demand could not be served
        at all: greedy's first phase gave every model one, and a plan must keep it)."""
        for m in set(removed):  # (any() over a generator costs more than the test)
            if removed.count(m) >= self.replicas[m]:
                return True
        return False

    def _removal_set(self, node: int, a: int, b: int) -> tuple[int, ...] | None:
        """The replicas to take off ``node`` for one of ``b`` to fit: one of ``a``, then (``b`` exclusive)
        the node's other exclusive replicas, smallest first, until it fits; None when it cannot. Depends on
        what the node holds only: cached until that changes."""
        sets, pair = self._sets[node], (a, b)
        removed = sets.get(pair, _UNKNOWN)
        if removed is _UNKNOWN:
            holding = self._holding_now.get(node)
            if holding is None:
                ledger = self.ledger
                holding = self._holding_now[node] = (ledger.free[node].tobytes(), ledger.solo[node].tobytes(),
                                                     tuple(ledger.held[node]))
            alike = self._sets_by_holding.setdefault(holding, {})
            removed = alike.get(pair, _UNKNOWN)
            if removed is _UNKNOWN:
                removed = alike[pair] = self._compute_removal_set(node, a, b)
            sets[pair] = removed
        return removed

    def _compute_removal_set(self, node: int, a: int, b: int) -> tuple[int, ...] | None:
        ledger = self.ledger
        free = ledger.free[node].tolist()
        solo = ledger.solo[node].tolist()
        held = list(ledger.held[node])
        need, excl = self.bytes[b] - 1.0, self.exclusive[b]

        def take(m: int) -> None:
            i = max(i for i, (h, _) in enumerate(held) if h == m)
            _, gpus = held.pop(i)
            for g in gpus:
                free[g] += self.bytes[m]
                if self.exclusive[m]:
                    solo[g] = False

        def fits() -> bool:
            return sum(1 for f, s in zip(free, solo, strict=True) if f >= need and not (s and excl)) >= self.tp[b]

        take(a)
        removed = [a]
        if not fits():
            if not excl:
                return None
            for m in sorted((m for m, _ in held if self.exclusive[m] and m != b),
                            key=lambda m: (self.bytes[m], m)):
                take(m)
                removed.append(m)
                if fits():
                    break
            else:
                return None
        return tuple(removed)

    # ------------------------------------------------------------------ the search
    def _try(self, node: int, removed: tuple[int, ...], b: int) -> bool:
        st = self.state
        st.journal, self._ops = [], []
        before = st.cost
        for m in removed:
            self._remove(node, m)
        ok = self._add(node, b)
        if ok:
            self._top_up(node)
        accepted = ok and st.cost < before - self.min_gain
        if not accepted:
            self._undo()
        self._moved = {move[0] for move in st.journal}
        st.journal = None
        return accepted

    def _top_up(self, node: int) -> None:
        """Fill what the swap left free on ``node`` with the best-gaining replicas that fit."""
        st = self.state
        for _ in range(8):
            best, best_m = self.min_gain, -1
            for m in self.fitting[node]:
                if self.ledger.slot(node, m) is None:
                    continue
                capacity = st.marginal(node, m)
                if capacity > _EPS:
                    g = st.gain(node, m, capacity)
                    if g > best:
                        best, best_m = g, m
            if best_m < 0 or not self._add(node, best_m):
                return

    def run(self) -> None:
        # The first pass looks at every node; later ones at the nodes of the sites whose offers the accepted
        # swaps changed (the candidate sites of the demand they moved): elsewhere the estimates stand.
        nodes = set(range(self.net.n_nodes))
        for _ in range(self.max_passes):
            self.passes += 1
            touched: set[int] = set()
            sites: set[int] = set()
            for _, node, removed, b in self._candidates(nodes):
                if self.trials >= self.max_trials:
                    return
                if node in touched or self._last_replica(removed):
                    continue
                self.trials += 1
                if self._try(node, removed, b):
                    self._sets[node] = {}
                    self.accepted += 1
                    touched.add(node)
                    if self._moved:
                        sites.update(np.unique(self.net.cand_site[list(self._moved)]).tolist())
            if not touched:
                return
            sites.discard(-1)  # candidate padding
            nodes = {n for s in sorted(sites) for n in self.nodes_at[s]}
