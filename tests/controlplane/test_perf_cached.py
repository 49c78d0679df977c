"""The simulator's memoising service-time front: exact where it tabulates, and a plain object to copy and pickle."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline
from controlplane.perf_cached import CachedPerf
from topology import Topology

L8 = "@cf/meta/llama-3.1-8b-instruct"


def _roofline() -> Roofline:
    return Roofline.from_topology(Topology.load())


def test_exact_at_grid_points_and_between_neighbours_in_between():
    perf, spec = _roofline(), default_catalog()[L8]
    cached = CachedPerf(perf)
    for i in (1, 40, 100, len(cached.grid) - 2):
        t = cached.grid[i]
        assert cached.prefill_ms(spec, "H100", t) == pytest.approx(perf.prefill_ms(spec, "H100", t), rel=1e-12)
    lo, hi = cached.grid[120], cached.grid[121]
    mid = cached.prefill_ms(spec, "H100", (lo + hi) / 2)
    assert min(perf.prefill_ms(spec, "H100", lo), perf.prefill_ms(spec, "H100", hi)) <= mid
    assert mid <= max(perf.prefill_ms(spec, "H100", lo), perf.prefill_ms(spec, "H100", hi))
    assert cached.decode_step_ms(spec, "H100", 4, 640) == perf.decode_step_ms(spec, "H100", 4, 640)


def test_a_prefill_time_does_not_depend_on_what_was_asked_before():
    """A table's points are computed when first read: whichever lengths are asked first, every answer is the one
    a table computed whole gives (linear between its two grid neighbours), and a few lookups compute a few points."""
    perf, spec = _roofline(), default_catalog()[L8]
    lengths = [1, 0.5, 3, 17.5, 100, 512, 513, 4096, 70_000, 300_000]
    whole = CachedPerf(perf)
    table = [perf.prefill_ms(spec, "H100", 1), *(perf.prefill_ms(spec, "H100", g) for g in whole.grid[1:])]

    def from_whole(tokens):
        i = max(0, min(int(np.searchsorted(whole.grid, tokens, side="right")) - 1, len(table) - 1))
        if i == 0:
            return table[0] if tokens <= 1.0 else table[1]
        if i == len(table) - 1:
            return perf.prefill_ms(spec, "H100", tokens)
        x0, x1 = whole.grid[i], whole.grid[i + 1]
        return table[i] + (table[i + 1] - table[i]) * (tokens - x0) / (x1 - x0)

    for order in (lengths, lengths[::-1]):
        cached = CachedPerf(perf)
        got = {t: cached.prefill_ms(spec, "H100", t) for t in order}
        assert got == {t: from_whole(t) for t in lengths}
        computed = sum(ms is not None for ms in cached._table(spec, "H100"))
        assert 2 <= computed <= 2 * len(lengths) < len(table)


def test_a_decode_time_does_not_depend_on_what_was_asked_before():
    """Two contexts of one 64-token bucket each get their own time, whichever is asked first: a value per bucket
    handed every later caller the first asker's, so the central run's results depended on whether the edge ran
    before it in the process."""
    perf, spec = _roofline(), default_catalog()[L8]
    a, b = CachedPerf(perf), CachedPerf(perf)
    first_600 = a.decode_step_ms(spec, "H100", 8, 600.0), a.decode_step_ms(spec, "H100", 8, 608.0)
    first_608 = b.decode_step_ms(spec, "H100", 8, 608.0), b.decode_step_ms(spec, "H100", 8, 600.0)
    assert first_600 == first_608[::-1]
    assert first_600 == (perf.decode_step_ms(spec, "H100", 8, 600.0), perf.decode_step_ms(spec, "H100", 8, 608.0))


def test_copies_and_pickles_delegate_like_the_original():
    """Attribute lookups fall through to the wrapped model; a copy or an unpickled object must not recurse while
    its own attributes are not set yet (it did, without end)."""
    perf, spec = _roofline(), default_catalog()[L8]
    cached = CachedPerf(perf)
    cached.prefill_ms(spec, "H100", 512)
    for other in (copy.copy(cached), copy.deepcopy(cached), pickle.loads(pickle.dumps(cached))):
        assert other.prefill_ms(spec, "H100", 512) == cached.prefill_ms(spec, "H100", 512)
        assert other.params == perf.params  # delegated to the wrapped model
    with pytest.raises(AttributeError):
        getattr(CachedPerf.__new__(CachedPerf), "anything")  # noqa: B009 (the lookup is the test)


def test_speech_clips_are_timed_exactly_window_by_window():
    """A speech encoder pays per started 30 s window: a 10 s and a 30 s clip cost one window, a 31 s clip two.
    The grid's linear interpolation would smooth that step (and time every clip under a minute as one minute)."""
    perf, spec = _roofline(), default_catalog()["@cf/openai/whisper-large-v3-turbo"]
    cached = CachedPerf(perf)
    times = {s: cached.prefill_ms(spec, "L4", s / 60.0) for s in (10, 30, 31, 45, 60, 61)}
    for s, ms in times.items():
        assert ms == perf.prefill_ms(spec, "L4", s / 60.0)
    assert times[10] < times[30] < 1.1 * times[10]  # the decoder's share only
    assert times[31] > 1.5 * times[30]
    assert times[31] < times[45] < times[60] < 1.1 * times[31]
    assert times[61] > 1.3 * times[60]
