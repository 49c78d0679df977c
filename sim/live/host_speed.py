"""How fast the host runs now: a short probe taken beside every profile and every replay.

A live-host profile is measured minutes before the replay it is used for, and on a shared machine the host's speed
drifts in between (other tenants' load; docs/fidelity.md found a run whose profiles read 5-25% slower than its
engines then decoded). No reading of the profile's rows can see that. The probe is the same small piece of work
each time, independent of the live run: the stand-in's engine decoding one sequence at a fixed context in this
process (the median token gap over a few short generations, about a second), taken while the gateway is idle.

A profile measured between probes ``a`` and ``b`` ran at speed ``(a + b) / 2``; a replay between ``b`` and ``c``
at ``(b + c) / 2`` (:func:`span_speed`, :func:`replay_speed`). :func:`at_speed` rescales a profile's times by the
ratio, so the simulation runs at the speed the host had during the replay; profiles pooled over cells are first
brought to one speed (:func:`common_speed`), so that a slow cell's profile does not count as scatter. The ratio is
a measurement of the machine, not a fit to the live results: the replay's own timings are never read.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.engine_profile import byte_prompts, decode_gaps
from dataplane.session import SessionConfig

RATE_ROWS = ("host_share_loop", "host_share_client")  # CPU ms per wall second: a share of the host, kept as is


class HostSpeedProbe:
    """The probe of one stand-in: ``probe()`` returns the median decode step (ms) of one sequence at ``context``
    tokens, over ``repeats`` generations of ``steps`` tokens. The engine is built once and kept for every probe
    (a fresh engine's first steps are slower). Always the same prompts (``seed``), so probes compare."""

    def __init__(self, stand_in: str, session: SessionConfig | None = None, seed: int = 0, context: int = 128,
                 steps: int = 48, repeats: int = 6):
        model = registry.load(stand_in, session)
        if context + steps + 1 >= model.spec.n_ctx:
            raise ValueError(f"probe context {context} + {steps} steps exceeds {stand_in}'s window "
                             f"{model.spec.n_ctx}")
        self.stand_in, self.steps, self.repeats = stand_in, steps, repeats
        self._prompts = byte_prompts(np.random.default_rng(seed), context, repeats)
        self._eng = LMEngine(model, LMEngineConfig(max_batch=1, kv_budget_tokens=1 << 20),
                             name=f"{stand_in}-probe")
        decode_gaps(self._eng, self._prompts[:1], 4)  # warm-up: first calls allocate

    def probe(self) -> float:
        """The host's decode step now, in ms (median token gap)."""
        gaps: list[float] = []
        for p in self._prompts:
            gaps += decode_gaps(self._eng, [p], self.steps)
        return round(float(np.median(gaps)) * 1e3, 4)

    def timed(self) -> dict:
        """A probe with the monotonic time it ended, as stored beside a replay."""
        ms = self.probe()
        return {"ms": ms, "at": round(time.monotonic(), 3)}

    def close(self) -> None:
        self._eng.close()


def span_speed(before: float, after: float) -> float:
    """The host's step (ms) over a span with probes ``before`` and ``after`` it: their mean."""
    if not all(isinstance(x, int | float) and x > 0 for x in (before, after)):
        raise ValueError(f"probe steps must be positive, got {before!r} and {after!r}")
    return (before + after) / 2


def at_speed(profile: pd.DataFrame, measured_at: float, speed: float) -> pd.DataFrame:
    """``profile`` (measured while the probe read ``measured_at`` ms) as the host would measure it at ``speed``:
    every duration scaled by their ratio (the ``host_share`` steps too: their ratios to one engine do not move;
    not the ``RATE_ROWS``, which are cores kept busy, not durations)."""
    if not (measured_at > 0 and speed > 0):
        raise ValueError(f"probe steps must be positive, got {measured_at!r} and {speed!r}")
    out = profile.copy()
    out["ms"] = out.ms.where(out.phase.isin(RATE_ROWS), out.ms * (speed / measured_at))
    return out


def common_speed(profiles: list[pd.DataFrame], probes: list[dict]) -> tuple[list[pd.DataFrame], float]:
    """``profiles`` (each with its ``probes``, as stored in a cell's ``cell.json``: ``profile``, the probes before
    and after it) brought to one speed, the median of theirs, for pooling; and that speed (ms)."""
    speeds = [span_speed(*p["profile"]) for p in probes]
    ref = float(np.median(speeds))
    return [at_speed(t, s, ref) for t, s in zip(profiles, speeds, strict=True)], ref


def replay_speed(probes: dict) -> float:
    """The host's step (ms) during a replay (``probes["replay"]``: the probes before and after it)."""
    return span_speed(*probes["replay"])


def speed_change_pct(probes: dict) -> float:
    """How much slower (+) the host ran during the replay than while its own profile was measured, in %."""
    return round(100 * (replay_speed(probes) / span_speed(*probes["profile"]) - 1), 1)
