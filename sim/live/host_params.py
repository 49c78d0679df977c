"""The live host's figures, read off a measured profile table: what :mod:`sim.live.host_model` runs on.

:class:`HostParams` reads a table's host rows (``host_share`` and the event loop's and client's cores beside it,
``host_share_merge``, ``iter_gap``, ``kv_copy``, ``kv_merge``, ``kv_trim``, ``gw_*``); :func:`fit_merge` reads the
merge rows as a fixed cost and two per-position rates (the trim rows as a fixed cost and one);
:func:`fit_host_share` and :func:`share_slowdown` are the cores-and-lock model of threads sharing one process's
cores and interpreter lock;
:func:`require_host_rows` refuses a table that lacks what the model needs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from edgepop.errors import UserError

GW_PARTS = ("http_in", "prepare", "admission", "dispatch", "piece", "piece_cpu", "tail", "http_out")


def fit_host_share(k: np.ndarray, slowdown: np.ndarray, max_cores: float, loop: np.ndarray | None = None,
                   client: np.ndarray | None = None) -> tuple[float, float]:
    """(cores, lock) of :func:`share_slowdown` closest (in log) to the measured slowdowns of ``k`` engines.

    ``loop`` and ``client``: the cores the gateway's event loop and the measuring client kept busy while each k was
    measured. They ran beside the engines (the loop holding the interpreter lock, the client in its own process),
    so they count as that many more busy threads; without them the fit reads their share as fewer cores. ``k[0]``
    is 1: the slowdowns are ratios to it."""
    loop = np.zeros(len(k)) if loop is None else np.asarray(loop, dtype=float)
    client = np.zeros(len(k)) if client is None else np.asarray(client, dtype=float)
    threads = np.asarray(k, dtype=float) + loop + client
    best = (np.inf, max_cores, 0.0)
    for cores in np.arange(0.5, max_cores + 1e-9, 0.05):
        for lock in np.arange(0.0, 2.0001, 0.01):
            model = np.array([share_slowdown(t, n * lock + u, cores, lock)
                              for t, n, u in zip(threads, k, loop, strict=True)])
            model = model / model[0]  # the measured slowdowns are ratios to k = 1
            err = float(np.sum((np.log(model) - np.log(slowdown)) ** 2))
            if err < best[0] - 1e-12:
                best = (err, float(cores), float(lock))
    return best[1], best[2]


def fit_merge(tokens: np.ndarray, pad_tokens: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """(fixed ms, ms per position written, ms per position padded first) closest in least squares to measured
    merges, none negative (the best of the fits over every subset of the three terms whose terms are all >= 0)."""
    x = np.c_[np.ones(len(ms)), tokens, pad_tokens]
    best, coef = np.inf, np.zeros(3)
    for use in ((0, 1, 2), (1, 2), (0, 1), (1,), (0, 2), (2,), (0,)):
        c = np.linalg.lstsq(x[:, use], ms, rcond=None)[0]
        err = float(np.sum((x[:, use] @ c - ms) ** 2))
        if (c >= 0).all() and err < best - 1e-12:
            best, coef = err, np.zeros(3)
            coef[list(use)] = c
    return coef


def share_slowdown(threads: float, lock_demand: float, cores: float, lock: float) -> float:
    """How much slower than alone each busy thread runs: ``threads`` busy threads need ``threads / cores`` of
    the cores and ``lock_demand`` of the interpreter lock (each engine ``lock`` of its time, the event loop all
    of it); the scarcer one sets the pace. Relative to one engine alone (which the profile's times already are).
    """
    alone = max(1.0, 1.0 / cores, lock)
    return max(1.0, threads / cores, lock_demand) / alone


# How the engines' pace is read off the host_share rows: the rows themselves, or the cores-and-lock fit alone (kept
# to compare the two readings on the same cells).
SHARE_READINGS = ("measured", "fitted")

# Rows the live-host model cannot do without: a table lacking one would model that part of the host as free (0 ms).
# (``iter_gap`` may be missing: an engine timed alone, ``--engine-profile alone``, has no loop between iterations.)
HOST_ROWS = {"host_share": "host_share", "kv_copy": "kv_copy", "gw_*": "gw_"}


def missing_host_rows(table: pd.DataFrame) -> list[str]:
    """The host-model row groups (:data:`HOST_ROWS`) that ``table`` has none of."""
    phases = pd.Series(table["phase"] if "phase" in table else [], dtype=object).astype(str)
    return [name for name, start in HOST_ROWS.items()
            if not (phases == start).any() and not (start.endswith("_") and phases.str.startswith(start).any())]


def require_host_rows(table: pd.DataFrame, source, engines: int = 2) -> None:
    """A one-line error when ``table`` (from ``source``, a path or a phrase) lacks host-model rows. ``engines``:
    the replicas of the replayed model sharing the host; with one, there is no sharing to measure (a served
    profile has no ``host_share`` rows then) and none is asked for."""
    missing = missing_host_rows(table)
    if engines < 2:
        missing = [name for name in missing if name != "host_share"]
    if missing:
        raise UserError(f"{source}: no {', '.join(missing)} rows, which the live-host model needs (a table of "
                        "`edgepop replay --profile-source host`, the default, has them); or pass --host-model off")


class HostParams:
    """The host-model figures of one profile table (``host_share``, ``host_share_merge``, ``kv_copy``,
    ``kv_merge``, ``kv_trim`` and ``gw_*`` rows).

    ``host_share`` rows give the slowdown of k engines decoding at once. The engines' pace is read off them
    directly (:meth:`slowdown`); :func:`fit_host_share` reads them as the cores this process gets and the share
    of an engine's time it holds the interpreter lock, for what the rows do not measure: the event loop's pace
    beside the engines, and more engines than were measured. (The two-figure fit alone could not follow the
    measured curve: on two cores the step of 4 engines at once is 2.2-2.6x that of one, more than the 2x that
    sharing two cores explains, and the fit, splitting the difference, read k = 2 9-16% and k = 4 2-14% too fast.)"""

    def __init__(self, table: pd.DataFrame, max_batch: int = 32, kv_budget_tokens: int = 32768,
                 max_cores: float = 2.0, share: str = "measured"):
        if share not in SHARE_READINGS:
            raise UserError(f"host share reading: unknown {share!r} (known: {', '.join(SHARE_READINGS)})")
        self.max_batch, self.kv_budget = int(max_batch), int(kv_budget_tokens)
        reading, share = share, table[table.phase == "host_share"].groupby("batch_size").ms.median().sort_index()
        self.cores, self.lock, self.max_cores = float(max_cores), 0.0, float(max_cores)
        self._share = None  # (k, measured slowdown of k engines at once, ratio to k = 1)
        if len(share) > 1 and 1 in share.index:
            share = share.loc[1:]
            if reading == "measured":
                self._share = (share.index.to_numpy(float), share.to_numpy() / share.loc[1])
            beside = {name: table[table.phase == f"host_share_{name}"].groupby("batch_size").ms.median()
                      .reindex(share.index).fillna(0.0).to_numpy() / 1e3 for name in ("loop", "client")}
            self.cores, self.lock = fit_host_share(share.index.to_numpy(float), share.to_numpy() / share.loc[1],
                                                   max_cores, beside["loop"], beside["client"])
        merge_share = table[table.phase == "host_share_merge"].groupby("batch_size").ms.median().sort_index()
        self._copy_share = None  # (k, a merge's slowdown with k engines busy, ratio to k = 1)
        if len(merge_share) > 1 and 1 in merge_share.index:
            merge_share = merge_share.loc[1:]
            self._copy_share = (merge_share.index.to_numpy(float), merge_share.to_numpy() / merge_share.loc[1])
        gap = table[table.phase == "iter_gap"].groupby("batch_size").ms.mean().sort_index()
        self._gap = (gap.index.to_numpy(float), gap.to_numpy(float)) if len(gap) else None
        copy = table[table.phase == "kv_copy"].groupby("tokens").ms.median().sort_index()
        self._copy = (copy.index.to_numpy(float), copy.to_numpy(float)) if len(copy) else None
        trim = table[table.phase == "kv_trim"]
        self._trim = fit_merge(trim.tokens.to_numpy(float), np.zeros(len(trim)), trim.ms.to_numpy(float)) \
            if len(trim) else None
        merge = table[table.phase == "kv_merge"]
        self._merge = fit_merge(merge.tokens.to_numpy(float), merge.context.to_numpy(float),
                                merge.ms.to_numpy(float)) if len(merge) else None
        self.gw: dict[str, float] = {}
        self._prepare = None
        for part in GW_PARTS:
            rows = table[table.phase == f"gw_{part}"]
            self.gw[part] = float(rows.ms.median()) if len(rows) else 0.0
            if part == "prepare" and rows.tokens.nunique() > 1:
                g = rows.groupby("tokens").ms.median().sort_index()
                self._prepare = (g.index.to_numpy(float), g.to_numpy(float))

    def iter_gap_ms(self, batch: int) -> float:
        """The engine loop's time between two iterations of a ``batch``-row batch (interpolated in the measured
        batch sizes, the nearest one outside them; one measured size: that figure for every batch)."""
        if self._gap is None:
            return 0.0
        return float(np.interp(batch, *self._gap))

    def slowdown(self, engines: int, loops: int = 0) -> float:
        """Per-thread slowdown with ``engines`` engine threads and ``loops`` event-loop threads busy.

        Engines alone (``loops`` 0, the engines' own pace: their measured steps include the loop's work on their
        pieces) take the measured ``host_share`` ratio for that many engines; past the largest k measured, that
        ratio grown as the fit grows; never faster than ``engines`` sharing the host's cores allows (rows measured
        on another host, or by a loaded client, can say less). The event loop's pace (``loops`` > 0) is the fitted
        model's."""
        if engines + loops <= 1:
            return 1.0
        if loops == 0 and self._share is not None:
            return max(self._along(self._share, engines), share_slowdown(engines, 0.0, self.max_cores, 0.0), 1.0)
        return self._fitted(engines, loops)

    def _along(self, curve: tuple[np.ndarray, np.ndarray], engines: int) -> float:
        """A measured slowdown curve (k, ratio to k = 1) at ``engines``: interpolated in k; past the largest k
        measured, its last ratio grown as the cores-and-lock fit grows."""
        ks, ratios = curve
        if engines <= ks[-1]:
            return float(np.interp(engines, ks, ratios))
        return float(ratios[-1]) * self._fitted(engines, 0) / self._fitted(int(ks[-1]), 0)

    def copy_slowdown(self, engines: int) -> float:
        """Slowdown of a KV merge or trim with ``engines`` engine threads busy (its own included): the measured
        ``host_share_merge`` ratio (interpolated in k; past the largest k measured, grown as the fit grows; never
        below 1): a copy between the engine's compute calls need not slow down as a decode step does (measured on
        the 2-core VM: 1.15-2.4x at k = 2-4 against 1.5-2.9x). Without those rows, an engine's :meth:`slowdown`."""
        if self._copy_share is None:
            return self.slowdown(engines)
        if engines <= 1:
            return 1.0
        return max(self._along(self._copy_share, engines), 1.0)

    def _fitted(self, engines: int, loops: int) -> float:
        if engines + loops <= 1:
            return 1.0
        return share_slowdown(engines + loops, engines * self.lock + loops, self.cores, self.lock)

    def copy_ms(self, mib: float) -> float:
        """Copying ``mib`` MiB of KV arrays (piecewise linear in the measured sizes, proportional below them)."""
        if self._copy is None or mib <= 0:
            return 0.0
        xs, ys = self._copy
        if mib <= xs[0] or len(xs) == 1:
            return float(ys[0] * mib / xs[0])
        if mib <= xs[-1]:
            return float(np.interp(mib, xs, ys))
        return float(ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (mib - xs[-1]))

    def merge_ms(self, tokens: float, pad_tokens: float) -> float | None:
        """Merging joiners' KV into a running batch's: ``tokens`` positions written, ``pad_tokens`` of them first
        padded in a copy of their own (the fit of the ``kv_merge`` rows); None without such rows."""
        if self._merge is None:
            return None
        return float(self._merge @ np.array([1.0, tokens, pad_tokens]))

    def trim_ms(self, tokens: float) -> float | None:
        """Copying the rows that stay out of the batch's arrays when others leave: ``tokens`` positions written
        (the fit of the ``kv_trim`` rows); None without such rows."""
        if self._trim is None:
            return None
        return float(self._trim @ np.array([1.0, tokens, 0.0]))

    def prepare_ms(self, prompt_tokens: int) -> float:
        if self._prepare is None:
            return self.gw["prepare"]
        return float(np.interp(prompt_tokens, *self._prepare))

    def front_ms(self, prompt_tokens: int) -> float:
        """Client send -> the control plane decides, less the injected delay: HTTP in, prepare, admission."""
        return self.gw["http_in"] + self.prepare_ms(prompt_tokens) + self.gw["admission"]
