"""greedy-demand's takers: per (site, model) key, the demand pairs that list the site among their candidates, and
each key's offers before any demand is served, built with numpy for all keys at once (half a million (pair, site)
rows at 3,000 PoPs, which a Python scan per key would take most of a second to read)."""

from __future__ import annotations

from collections import defaultdict
from itertools import repeat

import numpy as np

_EPS = 1e-9  # greedy's own


def takers_of(net) -> tuple[dict[tuple[int, int], dict[int, float]], list[list[tuple[int, int]]]]:
    """Per (site, model), its takers: the pairs listing the site, pair -> RTT to it (pairs ascending); per pair,
    the keys it lists, in candidate order. Grouped by one stable sort (33,000 pairs x 16 sites at 3,000 PoPs)."""
    site, n_models = net.cand_site, net.n_models
    valid = site >= 0
    code = (site * n_models + net.pair_model[:, None])[valid]  # row-major: pair by pair, candidates in order
    if not len(code):
        return defaultdict(dict), [[] for _ in range(site.shape[0])]
    pairs = np.broadcast_to(np.arange(site.shape[0])[:, None], site.shape)[valid]
    order = np.argsort(code, kind="stable")  # by key, pairs ascending within a key
    sorted_code = code[order]
    starts = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]])
    bounds = np.r_[starts, len(order)].tolist()
    ps, rs = pairs[order].tolist(), net.cand_rtt[valid][order].tolist()
    codes_at = sorted_code[starts].tolist()
    keys = [divmod(c, n_models) for c in codes_at]
    takers: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for i, key in enumerate(keys):
        takers[key] = dict(zip(ps[bounds[i]:bounds[i + 1]], rs[bounds[i]:bounds[i + 1]], strict=True))
    key_at = dict(zip(codes_at, keys, strict=True))
    per_pair = np.cumsum(valid.sum(axis=1)).tolist()
    codes = [key_at[c] for c in code.tolist()]
    keys_of = [codes[a:b] for a, b in zip([0, *per_pair[:-1]], per_pair, strict=True)]
    return takers, keys_of


def _groups(codes: np.ndarray, n_models: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(key, (start, end)) of each run of equal codes (site x n_models + model) in ``codes``."""
    if not len(codes):
        return []
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    bounds = np.r_[starts, len(codes)].tolist()
    keys = [divmod(c, n_models) for c in codes[starts].tolist()]
    return [(key, (bounds[i], bounds[i + 1])) for i, key in enumerate(keys)]


def initial_offers(net, penalty: float, takers: dict) -> tuple[dict, dict]:
    """Per key of ``takers``, (its offers, its live takers) while all demand is unserved: what greedy's scan
    (``_Routing._compute_offers``) gives, entries (rtt - penalty, pair, -1, demand) sorted as tuples, and the takers
    whose RTT is under the penalty (by more than its tolerance), in pair order."""
    offers: dict = {}
    live_rows: dict = {}
    valid = net.cand_site >= 0
    code = (net.cand_site * net.n_models + net.pair_model[:, None])[valid]
    if len(code):
        pairs = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)[valid]
        rtt = net.cand_rtt[valid]
        demand = net.pair_demand.astype(float)[pairs]
        live = penalty - rtt > _EPS  # the scan's test, worst[p] - r > _EPS, with worst[p] the penalty
        neg = rtt - penalty  # the entries' first field, computed as the scan computes it
        rows = np.flatnonzero(live)
        rows = rows[np.lexsort((pairs[rows], neg[rows], code[rows]))]  # by key, then the scan's tuple order
        offer = rows[demand[rows] > _EPS]
        ns, ps, ds = neg[offer].tolist(), pairs[offer].tolist(), demand[offer].tolist()
        for key, (a, b) in _groups(code[offer], net.n_models):
            offers[key] = list(zip(ns[a:b], ps[a:b], repeat(-1), ds[a:b]))
        if live.all():
            for key, every in takers.items():
                live_rows[key] = dict(every)
        else:
            rows.sort()  # (rows run pair by pair) then by key, stably: pair order within each key
            rows = rows[np.argsort(code[rows], kind="stable")]
            for key, (a, b) in _groups(code[rows], net.n_models):
                live_rows[key] = dict(zip(pairs[rows[a:b]].tolist(), rtt[rows[a:b]].tolist(), strict=True))
    for key in takers:  # keys whose takers offer nothing yet: an empty list and no live taker, as the scan gives
        offers.setdefault(key, [])
        live_rows.setdefault(key, {})
    return offers, live_rows
