"""greedy-demand's routing state: where each demand pair is served, what each node has left, and per (site,
model) key the offers a new replica there would take, kept up to date move by move.

A pair's *offers* to a site at RTT ``r`` are its unserved demand (worth ``unserved_penalty_ms - r`` per rps) and its
demand served farther than ``r`` (worth the RTT saved), as (-gain ms per rps, pair, from node or -1, rps, ``r``)
tuples, best first: the same list for every node of the site. A pair has offers at a site only while its worst
RTT (the penalty while some of its demand is unserved) is farther, by more than a tolerance; so a move of a pair
marks it stale only at those of its candidate sites nearer than its worst RTT before or after the move (the other
keys' lists had none of its entries and get none), with its RTT there, or None where it has none left. The next
read of a stale key keeps the others' entries, re-derives the moved pairs' and merges. A key's first offers (all
demand unserved) are built at the first read that needs its entries, not just their sums: 70% of them are gone by
then at 3,000 PoPs. The swap search (:mod:`controlplane.placement.local_search`) works on the same state.
"""

from __future__ import annotations

from controlplane.placement.takers import FirstOffers, first_entries, initial_offers, pair_ids, stale_marks

_EPS = 1e-9
_NO_OFFERS: list = []  # the offers of a key no pair lists (never changed: offer lists are replaced, not changed)


def takes_all(capacity: float, rps: float) -> bool:
    """Whether :meth:`GreedyRouting.gain`'s loop, given ``capacity`` rps, takes whole each of offers adding up to
    ``rps`` (so that it returns their whole gain): offers are above _EPS rps each, and the margin covers the
    rounding of the loop's running subtraction."""
    return capacity >= rps + 1e-9 * capacity + 1e-6


class GreedyRouting:
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
        # pairs_at[node][m]: the pairs of model m with some demand served on node, each with its entry of
        # served[p] (served[p][node]); kept once track_pairs() is called (the swap search reads it, greedy's
        # construction does not).
        self.pairs_at: list[list[dict[int, list[float]]]] | None = None
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
        # (site, model) keys are numbered site x n_models + model; key_base[node]: its site's number x n_models.
        self.key_base = [s * net.n_models for s in self.node_site]
        # Offers cached per key (a FirstOffers until the first read that needs them), and per key its stale pairs,
        # each with its RTT to the site or None (see move): the next read re-derives their entries.
        self._offers: dict[int, list | FirstOffers] = {}
        self._sums: dict[int, tuple[list | FirstOffers, float, float]] = {}  # (offers, their rps, their gain)
        self._first: tuple = ()  # the first offers' fields (takers.initial_offers)
        self._ids = pair_ids(len(net.pair_demand))
        # Per pair, the stale marks of each key it lists and its RTT there, nearest first (a move marks up to a
        # dozen of them and moves run ~10^5 times). A key's marks are emptied whenever its offers are re-derived.
        self._stale, self._marks_of, self._rtts_of = stale_marks(net)
        # Per pair, the marks of the keys it lists nearer than the penalty (by more than _EPS): where it has
        # offers while some of its demand is unserved, a prefix of its candidates (most often all of them).
        live = ((self.penalty - net.cand_rtt > _EPS) & (net.cand_site >= 0)).sum(axis=1).tolist()
        self._live_of = [marks if n == len(marks) else marks[:n]
                         for marks, n in zip(self._marks_of, live, strict=True)]
        self._initial_offers()

    def track_pairs(self) -> None:
        """Keep :attr:`pairs_at` from now on (built from where demand is served now)."""
        self.pairs_at = [[{} for _ in range(self.net.n_models)] for _ in range(self.net.n_nodes)]
        for p, served in enumerate(self.served):
            for node, entry in served.items():
                self.pairs_at[node][self.pair_model[p]][p] = entry

    def _initial_offers(self) -> None:
        """Every key's offers before any demand is served, from one sort for all keys (entries built when first
        needed), and their sums (:func:`~controlplane.placement.takers.initial_offers`)."""
        self._offers, sums, self._first = initial_offers(self.net, self.penalty, self._stale, self.unserved,
                                                          self._ids)
        for key, (rps, total) in sums.items():  # summed() would add the same (a cold Python loop over 10^5 offers)
            self._sums[key] = (self._offers[key], rps, total)

    def available(self, node: int, m: int, extra: int = 0) -> float:
        """Demand (rps) ``node`` could still take for ``m`` with ``extra`` more replicas."""
        by_replicas = (self.counts[node][m] + extra) * self.cap[node][m] * self.util - self.flow[node][m]
        per = self.time_per_rps[node][m]
        by_time = self.time_left[node] / per if per > 0 else 0.0
        room = by_time if by_time < by_replicas else by_replicas  # max(0.0, min(...)) without the calls
        return room if room > 0.0 else 0.0

    def marginal(self, node: int, m: int) -> float:
        """Demand (rps) one more replica of ``m`` would let ``node`` take: ``available(node, m, extra=1) -
        available(node, m)`` with the shared GPU-time bound read once (greedy asks this ~10^5 times)."""
        count, c, f = self.counts[node][m], self.cap[node][m], self.flow[node][m]
        per = self.time_per_rps[node][m]
        by_time = self.time_left[node] / per if per > 0 else 0.0
        more, now = (count + 1) * c * self.util - f, count * c * self.util - f
        # max(0.0, min(x, by_time)) of each, without the calls
        more = by_time if by_time < more else more
        now = by_time if by_time < now else now
        return (more if more > 0.0 else 0.0) - (now if now > 0.0 else 0.0)

    def offers(self, node: int, m: int) -> list[tuple[float, int, int, float, float]]:
        """Demand that would gain by moving to ``node``: (-gain ms per rps, pair, from node or -1, rps, the pair's RTT
        to ``node``), best first.

        The same for every node of a site, and unchanged until a move of a pair that lists the site: cached per
        (site, model). Lists are replaced, never changed in place: a caller may move demand while it reads one."""
        return self._offers_at(self.key_base[node] + m)

    def _offers_at(self, key: int) -> list[tuple[float, int, int, float, float]]:
        """:meth:`offers` of a key (callers that hold the key already)."""
        stale = self._stale.get(key)
        if not stale:
            offers = self._offers.get(key, _NO_OFFERS)
            if type(offers) is FirstOffers:
                offers = self._offers[key] = first_entries(self._first, offers, None)
                _, rps, total = self._sums[key]  # found with them
                self._sums[key] = (offers, rps, total)
            return offers
        # Keep the others' entries (sorted), re-derive the moved pairs' from their state now and merge. A pair's
        # entries: its unserved demand and its demand served farther than r, none once all is as close as r.
        penalty, unserved, served, eps = self.penalty, self.unserved, self.served, _EPS
        old = self._offers[key]
        if type(old) is FirstOffers:
            out = first_entries(self._first, old, stale)
        else:
            out = [e for e in old if e[1] not in stale]
        append = out.append
        for p, r in stale.items():
            if r is None:
                continue  # all of p's demand is at least this close (see move)
            if unserved[p] > eps:
                append((r - penalty, p, -1, unserved[p], r))
            for other, (amount, rtt) in served[p].items():
                if rtt - r > eps:
                    append((r - rtt, p, other, amount, r))
        # The negated gain first: a plain tuple sort gives best first, ties by pair then source (each (pair,
        # source) once: the last fields never compare), the same list however it was assembled.
        out.sort()
        self._offers[key] = out
        stale.clear()
        return out

    def summed(self, node: int, m: int) -> tuple[float, float]:
        """(rps, rps x ms saved) of all the offers to ``node``: the whole list's sums, cached with it."""
        key = self.key_base[node] + m
        sums = self._sums.get(key)
        if sums is not None and sums[0] is self._offers.get(key) and not self._stale.get(key):
            # The key's offers are those summed (first offers' sums are found with them: their entries need
            # not be built), and no move has marked them stale since.
            return sums[1], sums[2]
        offers = self._offers_at(key)
        sums = self._sums.get(key)
        if sums is None or sums[0] is not offers:
            # Most gains take every offer, and half of them read a list already summed: the whole list's rps and
            # gain, added in list order (gain's loop adds the same terms in the same order).
            rps = total = 0.0
            for neg_gain, _, _, amount, _ in offers:
                total -= neg_gain * amount
                rps += amount
            sums = self._sums[key] = (offers, rps, total)
        return sums[1], sums[2]

    def gain(self, node: int, m: int, capacity: float) -> float:
        """rps x ms the best offers to ``node`` save within ``capacity`` rps."""
        rps, whole = self.summed(node, m)
        if capacity >= rps + 1e-9 * capacity + 1e-6:  # takes_all(capacity, rps), written out (~10^5 calls)
            return whole
        total = 0.0
        for neg_gain, _, _, amount, _ in self._offers_at(self.key_base[node] + m):
            if capacity <= _EPS:
                break
            take = capacity if capacity < amount else amount  # min(amount, capacity) without the call
            total -= neg_gain * take
            capacity -= take
        return total

    def move(self, p: int, src: int, dst: int, dst_rtt: float, amount: float) -> None:
        """Move ``amount`` rps of pair ``p`` from node ``src`` to node ``dst`` (-1: unserved, at the penalty)."""
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
                if self.pairs_at is not None:
                    del self.pairs_at[src][m][p]
            self.flow[src][m] -= amount
            self.time_left[src] += amount * self.time_per_rps[src][m]
        if dst < 0:
            dst_rtt = self.penalty
            unserved[p] += amount
        else:
            entry = served.get(dst)
            if entry is None:
                entry = served[dst] = [0.0, dst_rtt]
                if self.pairs_at is not None:
                    self.pairs_at[dst][m][p] = entry
            entry[0] += amount
            self.flow[dst][m] += amount
            self.time_left[dst] -= amount * self.time_per_rps[dst][m]
        self.cost += amount * (dst_rtt - src_rtt)
        if self.journal is not None:
            self.journal.append((p, src, dst, amount, src_rtt))
        before = self.worst[p]
        penalty = self.penalty
        if unserved[p] > _EPS:
            worst = self.worst[p] = penalty
        else:
            worst = 0.0
            for entry in served.values():  # a pair is served at one or two nodes: no generator for max()
                if entry[1] > worst:
                    worst = entry[1]
            self.worst[p] = worst
        # p has offers at a site only while its worst RTT is farther (by more than _EPS): only the keys nearer than
        # the worse of its old and new worst can have seen them change. Candidates run nearest first: those nearer
        # than the new worst get the RTT, to re-derive p's entries at the next read; those nearer only than the old
        # one get None (p has none there now, and until its next move, which marks again where that changes).
        if before == penalty and worst <= penalty:
            # The usual case (p was unserved in part): the keys nearer than the old worst are those nearer
            # than the penalty, a prefix known in advance, so no RTT need be compared to mark them None; the
            # few nearer than the new worst are then marked again with their RTT (the same marks in the end).
            live = self._live_of[p]
            if worst != penalty:
                for marks in live:
                    marks[p] = None
            for marks, r in zip(live, self._rtts_of[p], strict=False):  # (live: a prefix of the candidates)
                if worst - r <= _EPS:
                    return
                marks[p] = r
            return
        walk = zip(self._marks_of[p], self._rtts_of[p], strict=True)
        for marks, r in walk:
            if worst - r <= _EPS:
                break
            marks[p] = r
        else:
            return
        if before - r > _EPS:
            marks[p] = None
            for marks, r in walk:  # (the same iterator: the candidates after the first one not marked above)
                if before - r <= _EPS:
                    break
                marks[p] = None

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
            base = self.key_base[target]
            for model, count in enumerate(self.counts[target]):
                if not count:
                    continue
                capacity = self.available(target, model)
                if capacity <= _EPS:
                    continue  # the loop below would stop at its first offer
                for _, p, src, amount, rtt in self._offers_at(base + model):
                    if capacity <= _EPS:
                        break
                    take = capacity if capacity < amount else amount  # min(amount, capacity) without the call
                    self.move(p, src, target, rtt, take)
                    capacity -= take
                    if src >= 0:
                        queue.append(src)
                        pending.add(src)
                        freed.add(src)
        return freed
