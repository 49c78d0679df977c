"""The bursty synthetic trace of the sim-vs-live matrix: seeded, and written in time order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.live.matrix import bursty_trace


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


@pytest.mark.parametrize("seed", range(12))
def test_arrivals_are_written_in_time_order(tmp_path, seed):
    """A burst's last arrival can fall after its drawn end; the next burst used to start before it (seed 3: one
    timestamp 555 ms before its predecessor)."""
    rows = _rows(bursty_trace(tmp_path / "b.jsonl", n=200, seed=seed))
    ts = np.array([r["timestamp"] for r in rows])
    assert len(rows) == 200 and (np.diff(ts) >= 0).all() and ts[0] > 0


def test_the_same_arguments_write_the_same_file(tmp_path):
    a = bursty_trace(tmp_path / "a.jsonl", n=50, seed=7).read_bytes()
    assert a == bursty_trace(tmp_path / "b.jsonl", n=50, seed=7).read_bytes()
    rows = _rows(tmp_path / "a.jsonl")
    assert all(4 <= r["input_length"] <= 4096 and 8 <= r["output_length"] <= 64 for r in rows)
