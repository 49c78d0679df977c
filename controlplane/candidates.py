"""Candidate lists: each model's replicas in the order a request from one ingress would try them.

A list is the model's replicas sorted by (RTT from the ingress, site index, replica id), cut to the nearest
``max_candidates`` unless the full list is asked for. Routers read one per request, so lists are cached per
(ingress, model, full) and built three ways, all giving the same lists:

* on demand (:meth:`CandidateLists.build`), the first time a request asks;
* for many ingresses of a model at once (:meth:`CandidateLists.precompute`): the gateway's every ingress PoP,
  one partial sort of every row per set of sites (models on the same sites share it);
* for the (ingress, model) pairs a workload names (:meth:`CandidateLists.precompute_pairs`, the simulator's, before
  its run): an edge deployment's ingress PoPs (by :meth:`precompute` for models on many sites), or the user cities
  a central deployment answers directly, tens of thousands of pairs over a handful of sites.

A model held at a few sites has few site orders: its lists are shared per order, each ingress's RTTs read through
its site row (:class:`controlplane.ordering.SiteRtts`) rather than copied per list. The lists :meth:`precompute`
cuts from sorted rows hold their RTTs as C doubles (:class:`controlplane.ordering.RttRow`), one block per
ingress, not a float object per candidate, where they are many (:data:`RTT_ROWS_FROM`).
"""

from __future__ import annotations

import operator

import numpy as np

from controlplane.ordering import RttRow, SiteRtts, candidate_slots, first_k_stable
from edgepop.memory import collector_paused

FEW_SITES = 24  # up to this many sites, lists are shared per site order; beyond, each is cut from its own row
# From this many RTTs in the lists of one site layout (ingresses x candidates: about 200,000 at 3,000 PoPs, 20,000 at
# 300) they are kept as RttRows: a million float objects made every routing decision read scattered memory, while
# at a few hundred PoPs they stay in the CPU's caches and a list reads faster (an RttRow makes a float per read).
RTT_ROWS_FROM = 100_000


class CandidateLists:
    """The candidate-list cache of one :class:`controlplane.state.ClusterState` (its ``rtt``, ``by_model`` and
    ``max_candidates``); the state reads :attr:`cache` directly on the hot path and calls :meth:`build` on a
    miss."""

    def __init__(self, state):
        self.state = state
        self.cache: dict[tuple[int, str, bool], tuple[list, list[float]]] = {}
        # The same (not full) lists by model, then indexed by ingress row (None: not built yet): a router's hot path
        # reads one with a list index instead of hashing a key tuple into a dict of tens of thousands of pairs (a
        # central deployment's user cities), whose scattered keys make most lookups miss the CPU's caches.
        self.near: dict[str, list] = {}
        # (model, full, site order) -> (candidates, the site position of each): a model on a few sites (a central
        # deployment) has few site orders but thousands of ingress cities, each a candidate-list miss.
        self._by_order: dict[tuple, tuple[list, list[int]]] = {}
        # ingress -> (its RTT row as floats, the site order by RTT): shared by the models that every site holds
        # (a central deployment: thousands of ingress cities, each a miss once per model otherwise)
        self._rows: dict[int, tuple[list[float], tuple[int, ...]]] = {}
        self._groups: dict[str, tuple] = {}  # model -> (its sites ascending, its replicas per site in id order)

    def replica_added(self, model: str) -> None:
        self.cache.clear()
        self.near.clear()
        self._by_order.clear()
        self._groups.pop(model, None)

    def rtt_changed(self) -> None:
        self.cache.clear()
        self.near.clear()
        self._rows.clear()

    def build(self, ingress: int, model: str, full: bool) -> tuple[list, list[float]]:
        """The list of ``(ingress, model, full)``, built and cached (a cache miss of ``ClusterState.candidates``)."""
        hit = self._nearest_replicas(ingress, model, full)
        self._store(ingress, model, full, hit)
        return hit

    def _store(self, ingress: int, model: str, full: bool, hit: tuple) -> None:
        """Cache ``hit``, the list of ``(ingress, model, full)``, and the not full ones in :attr:`near` too."""
        self.cache[(ingress, model, full)] = hit
        if full:
            return
        try:
            row = operator.index(ingress)  # (a numpy integer: its row)
        except TypeError:
            return
        rows = self.state.rtt.shape[0]
        if 0 <= row < rows:  # (a row of the matrix, as the plane checks)
            near = self.near.get(model)
            if near is None:
                near = self.near[model] = [None] * rows
            near[row] = hit

    def _nearest_replicas(self, ingress: int, model: str, full: bool) -> tuple[list, list[float]]:
        # Replicas are grouped by site: order the model's sites by (RTT, site index), then take each site's
        # replicas in id order, which is exactly the (RTT, site, replica) order of all its replicas.
        rtt = self.state.rtt
        sites, members = self._site_groups(model)
        # (sites are distinct and ascending: as many as the columns are all of them, a plain row view)
        every_site = len(sites) == rtt.shape[1]
        if len(sites) > FEW_SITES:
            rt = rtt[ingress] if every_site else rtt[ingress, sites]
            n = len(sites) if full or self.state.max_candidates is None else self.state.max_candidates
            order = first_k_stable(rt[None, :], min(n, len(sites)))[0].tolist()  # ties: the lower site first
            return self._take(model, members, order, rt.tolist(), full)
        # a stable sort by RTT (ties keep the lower site first); the replicas in that order are cached per order
        row = self._rows.get(ingress) if every_site else None
        if row is None:
            rl = (rtt[ingress] if every_site else rtt[ingress, sites]).tolist()
            row = (rl, tuple(sorted(range(len(rl)), key=rl.__getitem__)))
            if every_site:
                self._rows[ingress] = row
        rl, order = row
        return self._shared(model, members, full, rl, order)

    def _shared(self, model: str, members, full: bool, rl: list[float], order: tuple) -> tuple[list, SiteRtts]:
        """The list for site order ``order`` (shared by every ingress with that order), RTTs read from ``rl``."""
        key = (model, full, order)
        hit = self._by_order.get(key)
        if hit is None:
            hit = self._by_order[key] = self._take(model, members, order, range(len(rl)), full)
        return hit[0], SiteRtts(rl, hit[1])

    def _site_groups(self, model: str) -> tuple[np.ndarray, list[list]]:
        groups = self._groups.get(model)
        if groups is None:
            by_site: dict[int, list] = {}
            for r in self.state.by_model.get(model, []):
                by_site.setdefault(r.site, []).append(r)
            sites = np.array(sorted(by_site), dtype=np.int64)
            groups = self._groups[model] = (sites, [by_site[s] for s in sites.tolist()])
        return groups

    def _take(self, model: str, members, order, rl, full: bool) -> tuple[list, list]:
        """The replicas of the sites in ``order``, site by site, up to the candidate count (``rl[i]``: the RTT of
        site ``i``; :func:`controlplane.ordering.candidate_slots` is the same for many rows at once)."""
        state = self.state
        n = len(state.by_model.get(model, ())) if full or state.max_candidates is None else state.max_candidates
        cands: list = []
        rtts: list = []
        for i in order:
            group = members[i]
            cands += group
            rtts += [rl[i]] * len(group)
            if len(cands) >= n:
                break
        return (cands[:n], rtts[:n]) if len(cands) > n else (cands, rtts)

    def precompute(self, ingresses=None, models=None) -> None:
        """Build the lists of ``ingresses`` x ``models`` (default: all) up front, so that every routing decision is
        a cached lookup (one sort of every ingress row at once per set of sites; the lists are cut from the sorted rows
        as arrays, not site by site: 3,000 ingress PoPs make tens of thousands of lists)."""
        rows = (np.arange(self.state.rtt.shape[0]) if ingresses is None
                else np.asarray(list(ingresses), dtype=np.int64))
        self._precompute({m: rows for m in list(self.state.by_model if models is None else models)})

    def _precompute(self, rows_of: dict[str, np.ndarray]) -> None:
        """The lists of each model's ingress rows (``rows_of``). The cyclic collector is off meanwhile: those lists
        hold millions of references it would walk and free none of (at 3,000 PoPs its passes took about 0.1 s of
        0.55 s)."""
        # Models on the same sites with as many replicas at each (at a big edge: most of them) share one
        # ordering of the rows, of all the rows any of them asks for: only the replicas differ.
        layouts: dict[tuple[bytes, bytes], list[str]] = {}
        for m in rows_of:
            sites, members = self._site_groups(m)
            if len(sites):
                sizes = np.array([len(g) for g in members], dtype=np.int64)
                layouts.setdefault((sites.tobytes(), sizes.tobytes()), []).append(m)
        with collector_paused():
            for models in layouts.values():
                self._precompute_layout(models, rows_of)

    def _precompute_layout(self, models: list[str], rows_of: dict[str, np.ndarray]) -> None:
        state = self.state
        sites, members = self._site_groups(models[0])
        sizes = np.array([len(g) for g in members], dtype=np.int64)
        n = len(state.by_model[models[0]]) if state.max_candidates is None else state.max_candidates
        union = np.unique(np.concatenate([rows_of[m] for m in models]))
        rt = state.rtt[np.ix_(union, sites)]
        # every site holds a replica: the first max_candidates sites always hold enough of them
        k = len(sites) if state.max_candidates is None else min(len(sites), state.max_candidates)
        order = first_k_stable(rt, k)
        slot, replica = candidate_slots(sizes, order, n)
        # the RTT lists are the same for these models too: one list per ingress, shared (read-only)
        rtts = np.take_along_axis(np.take_along_axis(rt, order, axis=1), slot, axis=1)
        rtts = RttRow.rows(rtts) if rtts.size >= RTT_ROWS_FROM else rtts.tolist()
        for m in models:
            rows = rows_of[m]
            at = np.searchsorted(union, rows)
            _, members = self._site_groups(m)
            flat = np.empty(sum(len(g) for g in members), dtype=object)
            for i, r in enumerate(r for g in members for r in g):
                flat[i] = r
            cands = flat[replica[at]].tolist()
            for ingress, c, i in zip(rows.tolist(), cands, at.tolist(), strict=True):
                key = (ingress, m, False)
                if key not in self.cache:
                    self._store(ingress, m, False, (c, rtts[i]))

    def precompute_pairs(self, ingresses, codes, names) -> None:
        """Build the (not full) lists of the pairs ``(ingresses[i], names[codes[i]])`` up front: those a workload
        will ask for, however many ingresses the deployment could answer (models as codes into ``names``: a
        workload's model column is millions of repeats of a few strings). Models on up to :data:`FEW_SITES` sites take
        the shared lists :meth:`build` makes (one stable sort of every row at once), the others
        :meth:`precompute`'s."""
        state = self.state
        ingresses = np.asarray(ingresses, dtype=np.int64)
        codes = np.asarray(codes, dtype=np.int64)
        n_rows = state.rtt.shape[0]
        pairs = np.unique(codes * n_rows + ingresses)  # by model, then ingress
        if not len(pairs):
            return
        code, row = np.divmod(pairs, n_rows)
        bounds = np.flatnonzero(np.diff(code)) + 1
        many: dict[str, np.ndarray] = {}  # models on many sites: their missing rows, built together below
        for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(pairs)], strict=True):
            m = str(names[code[start]])
            rows = row[start:stop]
            sites, members = self._site_groups(m)
            if not len(sites):
                continue
            if len(sites) > FEW_SITES:
                missing = [i for i in rows.tolist() if (i, m, False) not in self.cache]
                if missing:
                    many[m] = np.array(missing, dtype=np.int64)
                continue
            every_site = len(sites) == state.rtt.shape[1]
            sub = state.rtt[rows] if every_site else state.rtt[np.ix_(rows, sites)]
            # numpy's stable argsort orders ties as the stable ``sorted`` of :meth:`_nearest_replicas` does
            orders = np.argsort(sub, axis=1, kind="stable").tolist()
            for ingress, rl, order in zip(rows.tolist(), sub.tolist(), orders, strict=True):
                if (ingress, m, False) in self.cache:
                    continue
                shared = self._rows.get(ingress) if every_site else None
                if shared is None:
                    shared = (rl, tuple(order))
                    if every_site:
                        self._rows[ingress] = shared
                self._store(ingress, m, False, self._shared(m, members, False, *shared))
        if many:
            self._precompute(many)
