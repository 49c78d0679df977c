"""greedy-demand's takers, the demand pairs that list a (site, model) key's site among their candidates (keys
numbered site x n_models + model): per pair, the stale marks of the keys it lists; and each key's offers (and their
sums) before any demand is served, sorted and summed with numpy for all keys at once (half a million (pair, site)
rows at 3,000 PoPs, which a Python scan per key would take most of a second to read), each key's entries built
when first needed (:func:`first_entries`)."""

from __future__ import annotations

from itertools import repeat

import numpy as np

_EPS = 1e-9  # greedy's own


def stale_marks(net) -> tuple[dict[int, dict], list[list[dict]], list[list[float]]]:
    """An empty dict per key some pair lists (a key's stale marks); per pair, the marks of the keys it lists and
    its RTTs to their sites, in candidate order, so nearest first (one gather for all pairs). A pair whose RTTs
    are the previous pair's (the same ingress: 3 pairs in 4 at 3,000 PoPs) shares its list (never changed)."""
    site, n_models = net.cand_site, net.n_models
    valid = site >= 0
    code = (site * n_models + net.pair_model[:, None])[valid]
    table = np.empty(net.n_sites * n_models, dtype=object)
    by_key = {}
    for key in np.flatnonzero(np.bincount(code, minlength=len(table))).tolist():
        table[key] = by_key[key] = {}
    marks = table[code].tolist()
    ends = np.cumsum(valid.sum(axis=1)).tolist()
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    rtt = np.where(valid, net.cand_rtt, np.nan)  # (nan: padding, equal to nothing, so never shared)
    fresh = np.r_[True, ~(rtt[1:] == rtt[:-1]).all(axis=1)] if len(rtt) else np.zeros(0, dtype=bool)
    rtts = net.cand_rtt[fresh][valid[fresh]].tolist()
    fresh_ends = np.cumsum(valid[fresh].sum(axis=1)).tolist()
    own = [rtts[a:b] for a, b in zip([0, *fresh_ends[:-1]], fresh_ends, strict=True)]
    return by_key, [marks[a:b] for a, b in bounds], [own[i] for i in (np.cumsum(fresh) - 1).tolist()]


def pair_ids(n_pairs: int) -> np.ndarray:
    """The pair numbers 0..n_pairs-1 as one Python int each, in an object array: indexing it and calling tolist()
    hands out the same int objects again, where tolist() on an int array makes a new one per row (half a million
    at 3,000 PoPs, more memory for every later lookup to walk through)."""
    return np.arange(n_pairs).astype(object)


def _by_code(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """The stable argsort of ``codes`` (all below ``n_codes``): a radix sort as 16-bit numbers where they fit
    (3.5x faster than the general stable sort on half a million codes)."""
    return np.argsort(codes.astype(np.uint16) if n_codes <= 1 << 16 else codes, kind="stable")


def _groups(codes: np.ndarray) -> list[tuple[int, tuple[int, int]]]:
    """(key, (start, end)) of each run of equal keys in ``codes``."""
    if not len(codes):
        return []
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    bounds = np.r_[starts, len(codes)].tolist()
    return [(key, (bounds[i], bounds[i + 1])) for i, key in enumerate(codes[starts].tolist())]


class FirstOffers:
    """A key's offers while all demand is unserved, not built yet: rows ``start:end`` of :func:`initial_offers`'
    arrays (most of them are gone by the key's first re-derivation: built then, only the rest are)."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end


def initial_offers(net, penalty: float, keys, demand: list[float], ids: np.ndarray) -> tuple[dict, dict, tuple]:
    """Per key of ``keys``, its offers while all demand is unserved: what a scan of its takers gives
    (``GreedyRouting``'s entries), entries (rtt - penalty, pair, -1, demand, rtt) sorted as tuples, from the takers
    whose RTT is under the penalty (by more than its tolerance), as a :class:`FirstOffers` (an empty list where
    there are none); per key with offers, (their rps, the rps x ms they save), added in list order as
    ``GreedyRouting.summed`` adds them; and the arrays the entries' fields come from, in entry order (negated
    gain, pair, rps, rtt: :func:`first_entries`). ``demand``: each pair's rps, whose float objects the entries
    share; ``ids``: :func:`pair_ids`."""
    offers: dict = {}
    sums: dict = {}
    fields: tuple = ()
    valid = net.cand_site >= 0
    code = (net.cand_site * net.n_models + net.pair_model[:, None])[valid]
    if len(code):
        pairs = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)[valid]
        rtt = net.cand_rtt[valid]
        amount = net.pair_demand.astype(float)[pairs]
        live = penalty - rtt > _EPS  # the scan's test, worst[p] - r > _EPS, with worst[p] the penalty
        neg = rtt - penalty  # the entries' first field, computed as the scan computes it
        rows = np.flatnonzero(live & (amount > _EPS))  # pair by pair
        rows = rows[np.argsort(neg[rows], kind="stable")]
        offer = rows[_by_code(code[rows], net.n_sites * net.n_models)]  # by key, then the scan's order (neg, pair)
        fields = (neg[offer], ids[pairs[offer]], np.array(demand, dtype=object)[pairs[offer]], rtt[offer])
        groups = _groups(code[offer])
        for key, (a, b) in groups:
            offers[key] = FirstOffers(a, b)
        # summed's loop: rps += amount and total -= neg * amount, the same float operations in the same order
        bounds = np.array([ab for _, ab in groups]).reshape(-1, 2)
        rps = running_sums(amount[offer], bounds).tolist()
        total = running_sums(-(neg[offer] * amount[offer]), bounds).tolist()
        sums = {key: (rps[i], total[i]) for i, (key, _) in enumerate(groups)}
    for key in keys:  # keys whose takers offer nothing yet: an empty list, as the scan gives
        offers.setdefault(key, [])
    return offers, sums, fields


def first_entries(fields: tuple, first: FirstOffers, skip: dict | None) -> list:
    """The entries of ``first`` (rows of ``fields``, from :func:`initial_offers`), in order, but those of the pairs
    in ``skip``: the same tuples the scan would give."""
    a, b = first.start, first.end
    neg, pair, demand, rtt = fields
    ps = pair[a:b].tolist()
    if not skip:
        return list(zip(neg[a:b].tolist(), ps, repeat(-1), demand[a:b].tolist(), rtt[a:b].tolist()))
    keep = [i for i, p in enumerate(ps) if p not in skip]
    if not keep:
        return []
    ns, ds, rs = neg[a:b].tolist(), demand[a:b].tolist(), rtt[a:b].tolist()
    return [(ns[i], ps[i], -1, ds[i], rs[i]) for i in keep]


def running_sums(values: np.ndarray, bounds: np.ndarray, long: int = 256) -> np.ndarray:
    """Per (start, end) of ``bounds`` (none empty), its values added one by one from 0.0 in order, as a Python
    loop adds them (np.sum adds pairwise): the groups up to ``long`` values one column at a time, each group's
    j-th value added to its running total at step j (longest groups first, so the groups still adding are a
    prefix); longer ones (a few) by np.cumsum, which adds in order."""
    out = np.empty(len(bounds))
    lengths = bounds[:, 1] - bounds[:, 0]
    for g in np.flatnonzero(lengths > long).tolist():
        out[g] = np.cumsum(values[bounds[g, 0]:bounds[g, 1]])[-1]
    short = np.flatnonzero(lengths <= long)
    if len(short):
        order = short[np.argsort(-lengths[short], kind="stable")]
        starts, sizes = bounds[order, 0], lengths[order]
        total = np.zeros(len(order))
        # adding at step j: the groups longer than j
        for j, n in enumerate(np.searchsorted(-sizes, -np.arange(1, sizes[0] + 1), side="right").tolist()):
            total[:n] += values[starts[:n] + j]
        out[order] = total
    return out
