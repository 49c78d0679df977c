"""The edge's gains over central with 95% intervals, and the crossovers: where (prompt size, continent, load) it loses.

Both deployments served the same arrivals, so gains are paired. Intervals come from a **paired block bootstrap
over requests**: the run's arrival span is cut into ``BLOCKS`` equal-time blocks, each resample weights every
block by a Poisson(1) draw (the same weight for a request in both deployments), and a percentile is taken with
those weights (numpy's linear one, as the point estimates'); the interval is the 2.5th-97.5th percentile of the
resampled gains. Blocks of time, not single requests, carry the weights because queueing correlates requests that
arrive close together; arrivals too uneven in time for that (most blocks empty) get blocks of equal request counts
in arrival order. The resampling generator is seeded from the scenario's seed, so the intervals are reproducible.

A gain is the relative reduction ``100 x (central - edge) / central``: positive means the edge is better.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

BLOCKS = 50
RESAMPLES = 500
MARKS = 128  # positions where quantiles() finds every resample's cumulative weight at once
SEGMENT = 32  # quantiles() searches by bisection down to this many positions, then sums their weights in turn
PROMPT_BINS = (("<=256", 0, 256), ("257-1k", 257, 1024), ("1k-4k", 1025, 4096), ("4k-16k", 4097, 16384),
               (">16k", 16385, np.inf))
LOAD_LEVELS = ("low", "mid", "high")
MIN_BIN = 30  # fewer requests than this in a bin: no figure (an interval over a handful says nothing)
METHOD = (f"paired block bootstrap over requests ({BLOCKS} equal-time blocks, {RESAMPLES} resamples, "
          "Poisson weights); percentile interval")
# Arrivals too uneven in time for equal-time blocks (a trace sent all at once, or a lone early request): fewer than
# this share of the blocks would hold any request, and a resample of a handful of blocks says nothing.
MIN_FILLED_SHARE = 0.5
METHOD_BY_COUNT = METHOD.replace("equal-time blocks", "blocks of equal request counts in arrival order, the "
                                 "arrivals being too uneven in time for equal-time blocks")


class Bootstrap:
    """Resampling weights per time block, shared by every figure of one run (so they are paired)."""

    def __init__(self, arrival_s: np.ndarray, seed: int, blocks: int = BLOCKS, resamples: int = RESAMPLES):
        arrival = np.asarray(arrival_s, dtype=float)
        lo, hi = (float(arrival.min()), float(arrival.max())) if arrival.size else (0.0, 1.0)
        width = max(hi - lo, 1e-9) / blocks
        self.block = np.minimum(((arrival - lo) / width).astype(int), blocks - 1)
        self.method = METHOD
        filled = np.unique(self.block).size
        if arrival.size >= blocks and filled < MIN_FILLED_SHARE * blocks:
            # Blocks of consecutive arrivals, equally many each: every block holds requests, which still arrive
            # close together within one.
            rank = np.empty(arrival.size, dtype=np.int64)
            rank[np.argsort(arrival, kind="stable")] = np.arange(arrival.size)
            self.block = rank * blocks // arrival.size
            self.method = METHOD_BY_COUNT
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xB00]))
        self.weights = rng.poisson(1.0, size=(resamples, blocks)).astype(float)

    def quantiles(self, values: np.ndarray, mask: np.ndarray, qs, order: np.ndarray | None = None) -> np.ndarray:
        """(resamples, len(qs)) weighted quantiles of ``values[mask]``; NaN when empty. ``order``: optionally,
        ``np.argsort(values, kind="stable")``, for a caller that asks about many subsets of one column (its
        subsets' own stable sorts are its restrictions to them).

        A resample counts each request as many times as its block's weight, and its quantile is numpy's default
        (linear interpolation) over that multiset, the definition of the point estimates, so a figure and its
        interval are of one statistic (with unit weights it is ``np.percentile`` itself). The multiset's k-th
        value (from 0) is the first value, in sorted order, at which the cumulative weight exceeds k. The
        cumulative weight at a position is the sum over blocks of the block's weight times how many of its
        requests come up to there: found at ``MARKS`` checkpoints for every resample at once, then by a binary
        search between two of them down to ``SEGMENT`` positions, whose running sum gives the answer, without the
        (resamples x requests) running sums. Weights are small integers: every sum is exact."""
        keep = mask & np.isfinite(values)
        n_res, n_blocks = self.weights.shape
        out = np.full((n_res, len(qs)), np.nan)
        if not keep.any():
            return out
        if order is None:
            idx = np.flatnonzero(keep)
            order = idx[np.argsort(values[idx], kind="stable")]
        else:
            order = order[keep[order]]
        v, blk = values[order], self.block[order]
        n = v.size
        counts = np.bincount(blk, minlength=n_blocks)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # Sorted positions of each block's requests, the blocks laid end to end with offsets that keep the whole
        # array ascending: one searchsorted answers "how many of block b up to position i" for every (i, b).
        offsets = np.arange(n_blocks, dtype=np.int64) * (n + 1)
        # (sorted as the smallest integers that hold a block number: numpy sorts those stably by radix)
        by_block = np.argsort(blk.astype(np.min_scalar_type(n_blocks)), kind="stable") + np.repeat(offsets, counts)
        total = self.weights @ counts.astype(float)
        live = total > 0
        w = self.weights[live]
        # Checkpoints narrow each search first: the cumulative weight of every resample at every checkpoint is
        # one product of the weights with the blocks' counts there (exact, small integers), and the answer lies
        # after the last checkpoint below the target and at or before the first one reaching it.
        # (numpy's own sum of products, not a BLAS product: BLAS threads spin against each other on a busy host)
        marks = np.arange(n, dtype=np.int64) if n <= MARKS else np.linspace(0, n - 1, MARKS).astype(np.int64)
        upto_marks = np.searchsorted(by_block, marks[:, None] + offsets[None, :], side="right") - starts
        at_marks = np.einsum("rb,kb->rk", w, upto_marks.astype(float), optimize=False)

        rows = np.arange(len(w))
        step = np.arange(SEGMENT)

        def first_reaching(target: np.ndarray) -> np.ndarray:
            """Per live resample, the first sorted position whose cumulative weight is at least ``target``."""
            first = (at_marks >= target[:, None]).argmax(axis=1)  # reached at the last mark at the latest
            hi = marks[first]
            lo = np.where(first > 0, marks[np.maximum(first - 1, 0)] + 1, 0)
            # A binary search (every resample at once) until the answer lies in at most SEGMENT positions...
            while (hi - lo).max() >= SEGMENT:
                mid = (lo + hi) // 2
                upto = np.searchsorted(by_block, mid[:, None] + offsets[None, :], side="right") - starts
                reached = (w * upto).sum(axis=1) >= target
                hi = np.where(reached, mid, hi)
                lo = np.where(reached, lo, mid + 1)
            # ...then the running sum of the block weights of those positions, from the weight before them.
            upto = np.searchsorted(by_block, lo[:, None] - 1 + offsets[None, :], side="right") - starts
            pos = np.minimum(lo[:, None] + step, n - 1)  # (past hi only after the answer, which is at most hi)
            run = (w * upto).sum(axis=1)[:, None] + np.cumsum(w[rows[:, None], blk[pos]], axis=1)
            return lo + (run >= target[:, None]).argmax(axis=1)

        size = total[live]
        for j, q in enumerate(np.asarray(qs, dtype=float)):
            h = (size - 1.0) * q  # numpy's virtual index into the sorted multiset
            k = np.floor(h)
            t = h - k
            a = v[first_reaching(k + 1.0)]
            b = v[first_reaching(np.minimum(k + 2.0, size))]
            # numpy's linear interpolation, written as it writes it (so unit weights give its values exactly)
            out[live, j] = np.where(t >= 0.5, b - (b - a) * (1.0 - t), a + (b - a) * t)
        return out

    def share(self, hit: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(resamples,) weighted share of ``hit`` among ``mask``."""
        counts_hit = np.bincount(self.block[mask & hit], minlength=self.weights.shape[1])
        counts = np.bincount(self.block[mask], minlength=self.weights.shape[1])
        num, den = self.weights @ counts_hit, self.weights @ counts
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, np.nan)


def reduction(edge, central):
    """Percentage by which ``edge`` is below ``central`` (positive: the edge is better); NaN where central
    is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * (np.asarray(central) - np.asarray(edge)) / np.asarray(central)


def interval(samples) -> list | None:
    """The 95% percentile interval of bootstrap ``samples`` (finite ones), rounded; None under 10 samples."""
    s = np.asarray(samples, dtype=float)
    s = s[np.isfinite(s)]
    if s.size < 10:
        return None
    lo, hi = np.percentile(s, [2.5, 97.5])
    return [round(float(lo), 2), round(float(hi), 2)]


def _point(values, mask, q):
    v = values[mask & np.isfinite(values)]
    return float(np.percentile(v, 100 * q)) if v.size else np.nan


def _r(v, digits=2):
    return None if v is None or not np.isfinite(v) else round(float(v), digits)


class Paired:
    """The two deployments' request frames, aligned request by request, and the shared bootstrap."""

    def __init__(self, edge: pd.DataFrame, central: pd.DataFrame, seed: int):
        if not np.array_equal(edge.request_id.to_numpy(), central.request_id.to_numpy()):
            central = central.set_index("request_id").loc[edge.request_id.to_numpy()].reset_index()
        self.e, self.c = edge.reset_index(drop=True), central.reset_index(drop=True)
        # When each user sent the request: the same on both sides (a batch row the night policy held keeps its
        # send time in arrival_s, the hold in held_s; the earlier side is taken should a frame carry its release).
        # Blocks and load windows are of the users' clock (held rows at their release put every other request in
        # block 0).
        self.arrival = np.minimum(self.e.arrival_s.to_numpy(dtype=float), self.c.arrival_s.to_numpy(dtype=float))
        self.boot = Bootstrap(self.arrival, seed)
        batch = self.e.batch.to_numpy(dtype=bool) if "batch" in self.e else np.zeros(len(self.e), bool)
        # compared as columns: string columns read to_numpy() would make a Python str per row
        gen = (self.e.task == "text-generation").to_numpy(dtype=bool)
        self.gen, self.one_shot = gen & ~batch, ~gen & ~batch
        self.ok_e = (self.e.outcome == "ok").to_numpy(dtype=bool)
        self.ok_c = (self.c.outcome == "ok").to_numpy(dtype=bool)
        self._columns: dict = {}  # (side, column) -> (values, stable sort order)

    def _column(self, side: str, col: str) -> tuple[np.ndarray, np.ndarray]:
        """A side's column as floats and its stable sort order, found once (every group's figure reads them)."""
        got = self._columns.get((side, col))
        if got is None:
            values = getattr(self, side)[col].to_numpy(dtype=float)
            got = self._columns[side, col] = (values, np.argsort(values, kind="stable"))
        return got

    def quantile_gain(self, col: str, subset: np.ndarray, qs=(0.5,)) -> dict:
        """Point reductions and intervals at quantiles ``qs`` of ``col`` over ``subset`` (ok requests each side)."""
        (ve, oe), (vc, oc) = self._column("e", col), self._column("c", col)
        me, mc = subset & self.ok_e, subset & self.ok_c
        be, bc = self.boot.quantiles(ve, me, qs, oe), self.boot.quantiles(vc, mc, qs, oc)
        out = {}
        for j, q in enumerate(qs):
            pe, pc = _point(ve, me, q), _point(vc, mc, q)
            key = f"p{int(round(q * 100))}"
            out[key] = {"edge": _r(pe), "central": _r(pc), "reduction_pct": _r(reduction(pe, pc)),
                        "ci95": interval(reduction(be[:, j], bc[:, j]))}
        return out


def _few(n_e: int, n_c: int) -> str | None:
    """Why a headline figure gets no interval (fewer than MIN_BIN requests on a side, as the bins), or None."""
    if min(n_e, n_c) >= MIN_BIN:
        return None
    return f"fewer than {MIN_BIN} requests on a side (edge {n_e:,}, central {n_c:,})"


def headline_gains(p: Paired, slo_met_e: np.ndarray, slo_met_c: np.ndarray) -> tuple[dict, dict]:
    """``gains.ci95`` (the headline reductions' intervals, plus the SLO attainment difference's), and the E2E
    p50 point reductions of generation and one-shot tasks, which are computed on the way. A figure over fewer
    than MIN_BIN requests on a side gets a null interval, its reason in ``ci95.no_interval``."""
    out, why = {}, {}

    def put(key, gain, subset, q="p50"):
        reason = _few(int((subset & p.ok_e).sum()), int((subset & p.ok_c).sum()))  # (the ok requests of each side)
        out[key] = None if reason else gain[q]["ci95"]
        if reason:
            why[key] = reason

    ttft = p.quantile_gain("ttft_ms", p.gen, (0.5, 0.95, 0.99))
    for k in ("p50", "p95", "p99"):
        put(f"ttft_ms_{k}_reduction_pct", ttft, p.gen, k)
    put("tpot_ms_p50_reduction_pct", p.quantile_gain("tpot_ms", p.gen), p.gen)
    masks = {"generation": p.gen, "one_shot": p.one_shot}
    e2e = {k: p.quantile_gain("e2e_ms", m) for k, m in masks.items()}
    for k, v in e2e.items():
        put(f"e2e_ms_{k}_p50_reduction_pct", v, masks[k])
    put("network_rtt_ms_p50_reduction_pct", p.quantile_gain("network_rtt_ms", p.gen | p.one_shot), p.gen | p.one_shot)
    everyone = np.ones(len(p.e), bool)
    d = p.boot.share(slo_met_e, everyone) - p.boot.share(slo_met_c, everyone)
    reason = _few(len(p.e), len(p.c))
    iv = None if reason else interval(d * 1e4)
    out["slo_attainment_delta"] = None if iv is None else [round(x / 1e4, 4) for x in iv]
    if reason:
        why["slo_attainment_delta"] = reason
    out["method"] = p.boot.method
    if why:
        out["no_interval"] = why
    return out, {f"e2e_ms_{k}_p50_reduction_pct": v["p50"]["reduction_pct"] for k, v in e2e.items()}


def _groups(p: Paired, keys: np.ndarray, names) -> dict:
    out = {}
    for name in names:
        sel = p.gen & (keys == name)
        n = int((sel & p.ok_e & p.ok_c).sum())
        if n < MIN_BIN:
            out[str(name)] = {"requests": n}
            continue
        g = p.quantile_gain("ttft_ms", sel, (0.5, 0.95))
        out[str(name)] = {"requests": n,
                          "edge_ttft_p50_ms": g["p50"]["edge"], "central_ttft_p50_ms": g["p50"]["central"],
                          "ttft_p50_reduction_pct": g["p50"]["reduction_pct"], "ttft_p50_ci95": g["p50"]["ci95"],
                          "edge_ttft_p95_ms": g["p95"]["edge"], "central_ttft_p95_ms": g["p95"]["central"],
                          "ttft_p95_reduction_pct": g["p95"]["reduction_pct"], "ttft_p95_ci95": g["p95"]["ci95"]}
    return out


def prompt_bin(tokens: np.ndarray) -> np.ndarray:
    """The ``PROMPT_BINS`` name of each prompt size in ``tokens``."""
    out = np.empty(len(tokens), dtype=object)
    for name, lo, hi in PROMPT_BINS:
        out[(tokens >= lo) & (tokens <= hi)] = name
    return out


def load_level(arrival_s: np.ndarray, window_s: float) -> np.ndarray:
    """Per request, the tercile (low / mid / high) of the total arrival rate in its window: the arrivals' span cut
    into equal windows of about ``window_s`` (equal, so that counts compare as rates: a short last window read
    as a low load whatever its rate)."""
    arrival = np.asarray(arrival_s, dtype=float)
    if arrival.size == 0:
        return np.empty(0, dtype=object)
    offset = arrival - arrival.min()
    span = float(offset.max())
    n = max(1, round(span / max(window_s, 1e-9)))
    win = np.minimum((offset / max(span / n, 1e-9)).astype(int), n - 1)  # (the last arrival ends the last window)
    rate = np.bincount(win, minlength=n)
    per_request = rate[win].astype(float)
    lo, hi = np.quantile(rate[rate > 0], [1 / 3, 2 / 3])
    # LOAD_LEVELS by position: one shared str each, not a new str per request
    return np.array(LOAD_LEVELS, dtype=object)[np.where(per_request <= lo, 0, np.where(per_request <= hi, 1, 2))]


def crossovers(p: Paired, window_s: float) -> dict:
    """``gains.by_prompt_tokens``, ``gains.by_continent`` and ``gains.by_load`` (text generation TTFT)."""
    tokens = p.e.prompt_tokens.to_numpy()
    codes, names = pd.factorize(p.e.user_continent)  # shared strs: to_numpy() would make one per request
    conts = np.append(np.asarray(names, dtype=object), None)[codes]
    return {"by_prompt_tokens": _groups(p, prompt_bin(tokens), [b[0] for b in PROMPT_BINS]),
            "by_continent": _groups(p, conts, sorted(set(conts[p.gen]))),
            "by_load": _groups(p, load_level(p.arrival, window_s), LOAD_LEVELS)}


LABELS = {"by_prompt_tokens": "prompts of {} tokens", "by_continent": "users in {}", "by_load": "{} load"}
# Every headline figure with an interval (the report's table), with how its value reads: a reduction in % or, for
# SLO attainment, a difference of shares.
HEADLINE_LOSSES = (("ttft_ms_p50_reduction_pct", "TTFT p50"), ("ttft_ms_p95_reduction_pct", "TTFT p95"),
                   ("ttft_ms_p99_reduction_pct", "TTFT p99"), ("tpot_ms_p50_reduction_pct", "TPOT p50"),
                   ("e2e_ms_generation_p50_reduction_pct", "E2E p50 (generation)"),
                   ("e2e_ms_one_shot_p50_reduction_pct", "E2E p50 (one-shot)"),
                   ("network_rtt_ms_p50_reduction_pct", "network RTT p50"), ("slo_attainment_delta", "SLO attainment"))


def losses(gains: dict) -> list[tuple[float, str]]:
    """Where the edge is worse with its whole 95% interval below zero, as (reduction %, text): the headline
    metrics first, then the crossover bins from the largest loss."""
    top, bins = [], []
    ci = gains.get("ci95", {})
    for key, label in HEADLINE_LOSSES:
        iv, v = ci.get(key), gains.get(key)
        if iv is not None and v is not None and iv[1] < 0:
            if key == "slo_attainment_delta":  # a difference of shares, not a reduction in %
                top.append((100 * v, f"{label} overall {v:+.4f} [{iv[0]:+.4f}, {iv[1]:+.4f}]"))
            else:
                top.append((v, f"{label} overall {v:+.1f}% [{iv[0]:+.1f}, {iv[1]:+.1f}]"))
    for group, fmt in LABELS.items():
        for name, b in gains.get(group, {}).items():
            for q in ("p50", "p95"):
                iv, v = b.get(f"ttft_{q}_ci95"), b.get(f"ttft_{q}_reduction_pct")
                if iv is not None and v is not None and iv[1] < 0:
                    bins.append((v, f"TTFT {q} for {fmt.format(name)} {v:+.1f}% [{iv[0]:+.1f}, {iv[1]:+.1f}]"))
    return top + sorted(bins, key=lambda x: x[0])


def loss_sentence(gains: dict, most: int = 6) -> str:
    """The headline's line on where the edge loses (or that it loses nowhere in this run), the largest first."""
    found = losses(gains)
    if not found:
        # A figure without an interval (too few requests) shows no loss either way: the sentence says how many.
        ci = gains.get("ci95", {})
        without = sum(ci.get(key) is None for key, _ in HEADLINE_LOSSES)
        binned = any(b.get(f"ttft_{q}_ci95") is not None for group in LABELS
                     for b in gains.get(group, {}).values() for q in ("p50", "p95"))
        if not without:
            return ("the edge loses nowhere in this run: no headline figure and no prompt-size, continent or load "
                    "bin has its 95% interval below zero")
        if without == len(HEADLINE_LOSSES) and not binned:
            return ("no loss can be shown in this run: no headline figure and no prompt-size, continent or load bin "
                    "has a 95% interval (too few requests)")
        n = len(HEADLINE_LOSSES) - without
        return (f"the edge loses nowhere in this run among the figures with an interval: of the {n} headline "
                f"figure{'' if n == 1 else 's'} with one ({without} had none) and the prompt-size, "
                "continent and load bins with one, none has its 95% interval below zero")
    more = f"; {len(found) - most} more in summary.json gains" if len(found) > most else ""
    return "edge loses: " + "; ".join(text for _, text in found[:most]) + more
