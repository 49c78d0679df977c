"""Seeded random streams, one per concern, so changing one (say, routing) never shifts another's draws.

Every random draw in edgepop comes from a generator handed down from here; the same seed gives the same run,
simulated or live::

    streams(seed)["route_edge"]     # the edge router's generator (p2c's samples)
"""

from __future__ import annotations

import argparse

import numpy as np

# Append new names at the end: children are spawned by position, so the earlier streams keep their draws.
MAX_INT = 2**63 - 1  # the largest seed (or count) a 64-bit table column holds
STREAMS = ("workload", "place_edge", "place_central", "route_edge", "route_central", "jitter")


def streams(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per name of :data:`STREAMS`, all derived from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(c) for name, c in zip(STREAMS, children, strict=True)}


def seed_arg(text: str) -> int:
    """The argparse type of every ``--seed`` flag: a whole number in [0, 2**63 - 1] (numpy's seed sequences take
    any non-negative integer; the seed columns of the output tables hold 64-bit integers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}") from None
    if not 0 <= value <= MAX_INT:
        raise argparse.ArgumentTypeError(f"must be a whole number in [0, 2**63 - 1], got {text!r}")
    return value
