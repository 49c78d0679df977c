"""Ordering helpers shared by placement and routing: the nearest few of many sites, exactly as a full sort."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np


def first_k_stable(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the column indices of the ``k`` smallest values in the order a stable full sort gives (ties: the
    lower column first), without sorting whole rows: the rows of a 3,000-site fleet are long."""
    n_cols = values.shape[1]
    if n_cols <= 4 * k:
        return np.argsort(values, axis=1, kind="stable")[:, :k]
    part = np.argpartition(values, k - 1, axis=1)[:, :k]  # the k smallest of each row, in no order
    cut = np.take_along_axis(values, part, axis=1).max(axis=1, keepdims=True)  # the k-th smallest value
    # Where no other value equals the cut, those k are the first k of a stable sort, whichever ties the partition
    # picked below the cut; rows with more values at the cut than places left (rare with real RTTs) choose by column.
    tied = np.flatnonzero(np.count_nonzero(values <= cut, axis=1) != k)
    if len(tied):
        part[tied] = _first_k_by_column(values[tied], cut[tied], k)
    cols = np.sort(part, axis=1)  # column order: the stable sort below then breaks ties by the lower column
    order = np.argsort(np.take_along_axis(values, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


def _first_k_by_column(values: np.ndarray, cut: np.ndarray, k: int) -> np.ndarray:
    """Per row, the columns of the values below ``cut`` and, of those equal to it, the lowest columns up to ``k``
    in all, in column order."""
    below = values < cut
    equal = values == cut
    need = k - below.sum(axis=1, keepdims=True)  # how many of the values equal to the cut make the first k
    chosen = below | (equal & (np.cumsum(equal, axis=1) <= need))
    return np.nonzero(chosen)[1].reshape(len(values), k)


def candidate_slots(sizes: np.ndarray, order: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``order`` (groups in visiting order), the first ``min(n, sizes.sum())`` members of the groups
    taken in that order, each group's members in turn: ``(slot, member)``, the position in ``order`` each comes
    from and its index among all members (group ``g``'s are ``sizes[:g].sum()`` onwards).

    Every group has a member, and each row names at least ``min(n, sizes.sum())`` of them."""
    rows, k = order.shape
    length = min(n, int(sizes.sum()))
    if (sizes == 1).all():  # one member per group (a large edge: one replica of a model per PoP): no search
        return np.broadcast_to(np.arange(length, dtype=np.int64), (rows, length)), order[:, :length]
    sz = sizes[order]
    end = np.cumsum(sz, axis=1)  # strictly increasing along each row
    # One sorted search for all rows at once: row r's ends are offset by r * stride, above every earlier row's.
    stride = int(sizes.sum()) + 1
    lift = np.arange(rows, dtype=np.int64)[:, None] * stride
    pos = np.arange(length, dtype=np.int64)[None, :]
    slot = np.searchsorted((end + lift).ravel(), (pos + lift).ravel(), side="right").reshape(rows, length)
    slot -= np.arange(rows, dtype=np.int64)[:, None] * k
    first = np.take_along_axis(end - sz, slot, axis=1)  # members of the row's groups before this slot's
    start = np.cumsum(sizes) - sizes
    member = start[np.take_along_axis(order, slot, axis=1)] + pos - first
    return slot, member


class SiteRtts:
    """The RTT of each candidate replica, read through its site: ``self[i] == site_rtt[pos[i]]``.

    A read-only list of floats for the routers (index, slice, iterate, ``len``, ``bisect``). A central deployment
    answers thousands of user cities, each with candidate lists of up to ``max_candidates`` replicas per model:
    one small view per list, sharing the city's site RTTs and the model's positions, instead of a list of floats
    as long as the candidates (tens of thousands of them, built while the simulation runs).
    """

    __slots__ = ("site_rtt", "pos", "end_limit", "end")

    def __init__(self, site_rtt: list[float], pos: list[int]):
        self.site_rtt, self.pos = site_rtt, pos
        # A router's memo: ``end`` is ``bisect_right(self, end_limit, 1, len(self))``, the end of a window that
        # starts at the nearest candidate (the values never change, nor does the limit a router asks for them)
        self.end_limit, self.end = math.nan, 0

    def __len__(self) -> int:
        return len(self.pos)

    def __getitem__(self, i):
        try:  # an index (a router reads one per request): no type test on that path
            return self.site_rtt[self.pos[i]]
        except TypeError:  # a slice: ``pos[i]`` is a list
            return [self.site_rtt[p] for p in self.pos[i]]

    def __iter__(self):
        return map(self.site_rtt.__getitem__, self.pos)

    def bisect_right(self, x: float, lo: int, hi: int) -> int:
        """``bisect.bisect_right(self, x, lo, hi)`` (the values are in ascending order), each probe a C call."""
        return bisect_right(self.pos, x, lo, hi, key=self.site_rtt.__getitem__)

    def __eq__(self, other) -> bool:
        try:
            return list(self) == list(other)
        except TypeError:
            return NotImplemented

    __hash__ = None  # mutable-looking sequence semantics, like list

    def __repr__(self) -> str:
        return f"SiteRtts({list(self)!r})"


class RttRow(array):
    """An ascending list of RTTs (ms) held as C doubles (``array("d")``): one block of memory per candidate list
    rather than a list of float objects, which a router reads a few of per request (an index, ``bisect``). At
    3,000 PoPs the precomputed lists hold about a million RTTs, and as floats their scattered objects made every
    routing decision slower. Indexing gives the same float values; it compares equal to a list of them (its slices
    and copies are plain arrays, which do not).
    """

    __slots__ = ()

    @classmethod
    def rows(cls, values: np.ndarray) -> list[RttRow]:
        """One row per row of the 2-D float64 array ``values``."""
        values = np.ascontiguousarray(values, dtype=np.float64)
        raw, width = values.tobytes(), values.shape[1] * values.itemsize
        return [cls("d", raw[i:i + width]) for i in range(0, len(raw), width)] if width else \
            [cls("d") for _ in range(len(values))]

    def __eq__(self, other) -> bool:
        try:
            return list(self) == list(other)
        except TypeError:
            return NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self) -> str:
        return f"RttRow({list(self)!r})"


def window_end(rtts, x: float, lo: int, hi: int) -> int:
    """The first index in ``[lo, hi)`` of the ascending RTT list ``rtts`` (a list, a :class:`RttRow` or a
    :class:`SiteRtts`) whose value is above ``x`` (``hi`` when none is)."""
    if type(rtts) is SiteRtts:
        return rtts.bisect_right(x, lo, hi)
    return bisect_right(rtts, x, lo, hi)
