"""Service times of a language model *as its engine serves it*, in the profile-table format of ``edgepop profile``.

``edgepop profile`` times bare graph calls; a live request also pays the engine's per-iteration work (sampling
over the vocabulary, KV-cache bookkeeping, thread hand-offs). For sim-vs-live comparisons the simulator should
see the same per-token cost the gateway's clients see, so this module times :class:`dataplane.engine_lm.LMEngine`
itself:

* ``prefill`` (batch 1, ``tokens``): submit one prompt with ``max_tokens=1`` and wait for its result;
* ``decode`` (``batch_size``, ``context``): run ``batch_size`` generations of prompts of ``context`` tokens and
  take the median gap between consecutive tokens while all of them are in the batch.

The table's columns are ``dataplane.profiler.COLUMNS``, so :class:`controlplane.perf_profile.MeasuredProfile`
reads it as it reads any profile.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.profiler import COLUMNS
from dataplane.sampling import SamplingParams
from dataplane.session import SessionConfig


def _prompts(rng: np.random.Generator, n: int, count: int) -> list[list[int]]:
    return [rng.integers(32, 127, n).tolist() for _ in range(count)]  # printable ASCII bytes


def engine_profile(stand_in: str, prompt_tokens=(8, 32, 64, 128, 256, 384), decode_batch=(1, 2, 4, 8),
                   contexts=(32, 128, 256), steps: int = 24, repeats: int = 3, seed: int = 0,
                   session: SessionConfig | None = None) -> pd.DataFrame:
    """Time prefill and decode of ``stand_in`` through an LMEngine (median of ``repeats`` after a warm-up)."""
    rng = np.random.default_rng(seed)
    model = registry.load(stand_in, session)
    n_ctx = model.spec.n_ctx
    host = socket.gethostname()
    eng = LMEngine(model, LMEngineConfig(max_batch=max(decode_batch), kv_budget_tokens=1 << 22))
    rows = []
    try:
        for n in (t for t in prompt_tokens if t < n_ctx - 1):
            times = []
            for _ in range(repeats + 1):
                p = _prompts(rng, n, 1)[0]
                t0 = time.perf_counter()
                eng.submit(p, SamplingParams(max_tokens=1, stop_on_eos=False, seed=0)).result()
                times.append(time.perf_counter() - t0)
            rows.append((stand_in, "prefill", 1, n, 0, float(np.median(times[1:])) * 1e3))
        for b in decode_batch:
            for c in (x for x in contexts if x + steps + 1 < n_ctx):
                gaps = []
                for _ in range(repeats):
                    gaps += _decode_gaps(eng, _prompts(rng, c, b), steps)
                rows.append((stand_in, "decode", b, 1, c, float(np.median(gaps)) * 1e3))
    finally:
        eng.close()
    table = pd.DataFrame(rows, columns=COLUMNS[:6])
    table["ms"] = table.ms.round(4)
    table["provider"] = model.provider
    table["host"] = host
    return table[list(COLUMNS)]


def _decode_gaps(eng: LMEngine, prompts: list[list[int]], steps: int) -> list[float]:
    """Token gaps (s) while every one of ``prompts`` is decoding in the same batch."""
    stamps: list[list[float]] = [[] for _ in prompts]
    handles = []
    for i, p in enumerate(prompts):
        def on_token(_tok, _piece, mine=stamps[i]):
            mine.append(time.perf_counter())
        handles.append(eng.submit(p, SamplingParams(max_tokens=steps + 1, stop_on_eos=False, seed=i), on_token))
    for h in handles:
        h.result()
    start = max(s[0] for s in stamps)  # every sequence has joined
    end = min(s[-1] for s in stamps)  # none has left
    gaps = []
    for s in stamps:
        t = np.array([x for x in s if start <= x <= end])
        gaps += np.diff(t).tolist()
    return gaps or [float(np.median(np.diff(stamps[0])))]
