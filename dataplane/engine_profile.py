"""Service times of a language model *as its engine serves it*, in the profile-table format of ``edgepop profile``.

``edgepop profile`` times bare graph calls; a live request also pays the engine's per-iteration work (sampling
over the vocabulary, KV-cache bookkeeping, thread hand-offs). For sim-vs-live comparisons the simulator should
see the same per-token cost the gateway's clients see, so this module times :class:`dataplane.engine_lm.LMEngine`
itself:

* ``prefill`` (``batch_size`` prompts of ``tokens`` tokens, admitted in one iteration, so left padded into one
  call): submit them together with ``max_tokens=1`` and wait for all results;
* ``decode`` (``batch_size``, ``context``): run ``batch_size`` generations of prompts of ``context`` tokens and
  take the median gap between consecutive tokens while all of them are in the batch (one iteration: the forward
  call, sampling every row, the engine's bookkeeping);

and, for a simulator that models the live host (``sim.live.host_model``), what one host gives several engines:

* ``host_share`` (``batch_size`` = k engines, ``context``): the median decode iteration of an engine while k
  engines of the same model decode at once in this process (they share the cores and the interpreter lock, as
  the gateway's per-replica engines do); its ratio to k = 1 is the host's slowdown at k busy replicas;
* ``kv_copy`` (``tokens`` = MiB): copying KV-cache arrays, as the engine does when prompts join a running batch
  (concatenation) or rows leave it (trimming).

The table's columns are ``dataplane.profiler.COLUMNS``, so :class:`controlplane.perf_profile.MeasuredProfile`
reads it as it reads any profile (it uses the ``prefill`` and ``decode`` rows; the others are the host model's).
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.profiler import COLUMNS
from dataplane.sampling import SamplingParams
from dataplane.session import SessionConfig
from edgepop.memory import keep_freed_memory

PROMPT_TOKENS = (8, 32, 64, 128, 256, 384)
PREFILL_BATCH = (1, 2, 4)
DECODE_BATCH = (1, 2, 4, 8, 16)
CONTEXTS = (32, 128, 256, 384)
HOST_ENGINES = (1, 2, 3, 4)


def byte_prompts(rng: np.random.Generator, n: int, count: int) -> list[list[int]]:
    """``count`` prompts of ``n`` token ids drawn from ``rng``."""
    return [rng.integers(32, 127, n).tolist() for _ in range(count)]  # printable ASCII bytes


def engine_profile(stand_in: str, prompt_tokens=PROMPT_TOKENS, decode_batch=DECODE_BATCH, contexts=CONTEXTS,
                   steps: int = 24, repeats: int = 3, seed: int = 0, session: SessionConfig | None = None,
                   prefill_batch=(1,), host_engines=(), host_context: int = 128) -> pd.DataFrame:
    """Time prefill and decode of ``stand_in`` through an LMEngine (median of ``repeats`` after a warm-up);
    ``prefill_batch`` sizes beyond 1, ``host_engines`` (k values for ``host_share`` rows, with ``kv_copy`` rows)
    add what the live-host model needs."""
    rng = np.random.default_rng(seed)
    model = registry.load(stand_in, session)
    n_ctx = model.spec.n_ctx
    host = socket.gethostname()
    eng = LMEngine(model, LMEngineConfig(max_batch=max(max(decode_batch), max(prefill_batch)),
                                         kv_budget_tokens=1 << 22))
    rows = []
    try:
        for b in prefill_batch:
            for n in (t for t in prompt_tokens if t < n_ctx - 1):
                times = []
                for _ in range(repeats + 1):
                    t0 = time.perf_counter()
                    for h in _submit_together(eng, byte_prompts(rng, n, b), 1):
                        h.result()
                    times.append(time.perf_counter() - t0)
                rows.append((stand_in, "prefill", b, n, 0, float(np.median(times[1:])) * 1e3))
        for b in decode_batch:
            for c in (x for x in contexts if x + steps + 1 < n_ctx):
                gaps = []
                for _ in range(repeats):
                    gaps += decode_gaps(eng, byte_prompts(rng, c, b), steps)
                rows.append((stand_in, "decode", b, 1, c, float(np.median(gaps)) * 1e3))
    finally:
        eng.close()
    if host_engines:
        rows += _host_share(model, stand_in, host_engines, host_context, steps, repeats, rng)
        rows += _kv_copy(model)
    return _table(rows, model.provider, host)


def kv_copy_profile(stand_in: str, session: SessionConfig | None = None) -> pd.DataFrame:
    """The ``kv_copy`` rows of ``stand_in`` alone."""
    model = registry.load(stand_in, session)
    return _table(_kv_copy(model), model.provider, socket.gethostname())


def _table(rows: list[tuple], provider: str, host: str) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=COLUMNS[:6])
    table["ms"] = table.ms.round(4)
    table["provider"] = provider
    table["host"] = host
    return table[list(COLUMNS)]


def _submit_together(eng: LMEngine, prompts: list[list[int]], max_tokens: int, on_token=None) -> list:
    """Submit ``prompts`` so that the engine admits them in one iteration (its lock is held meanwhile)."""
    with eng._cond:  # re-entrant: submit() takes it too; the engine thread cannot admit until all are queued
        return [eng.submit(p, SamplingParams(max_tokens=max_tokens, stop_on_eos=False, seed=i),
                           on_token and (lambda _t, _p, i=i: on_token(i)))
                for i, p in enumerate(prompts)]


def decode_gaps(eng: LMEngine, prompts: list[list[int]], steps: int) -> list[float]:
    """Token gaps (s) while every one of ``prompts`` is decoding in the same batch."""
    stamps: list[list[float]] = [[] for _ in prompts]
    handles = _submit_together(eng, prompts, steps + 1, lambda i: stamps[i].append(time.perf_counter()))
    for h in handles:
        h.result()
    start = max(s[0] for s in stamps)  # every sequence has joined
    end = min(s[-1] for s in stamps)  # none has left
    gaps = []
    for s in stamps:
        t = np.array([x for x in s if start <= x <= end])
        gaps += np.diff(t).tolist()
    return gaps or [float(np.median(np.diff(stamps[0])))]


def _host_share(model, stand_in: str, engines, context: int, steps: int, repeats: int, rng) -> list[tuple]:
    """``host_share`` rows: the decode iteration of one of k engines decoding at once (batch 2 each)."""
    rows = []
    pool = [LMEngine(model, LMEngineConfig(max_batch=4, kv_budget_tokens=1 << 20), name=f"{stand_in}-share{i}")
            for i in range(max(engines))]
    try:
        for k in engines:
            gaps: list[float] = []
            for _ in range(repeats):
                out: list[list[float]] = [[] for _ in range(k)]
                prompts = [byte_prompts(rng, context, 2) for _ in range(k)]  # drawn here: one generator, one thread
                threads = [threading.Thread(target=lambda i=i, out=out, prompts=prompts: out[i].extend(
                    decode_gaps(pool[i], prompts[i], steps * 2))) for i in range(k)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for g in out:  # the middle half of each engine's run: all k engines were decoding then
                    gaps += g[len(g) // 4: 3 * len(g) // 4] or g
            rows.append((stand_in, "host_share", k, 1, context, float(np.median(gaps)) * 1e3))
    finally:
        for e in pool:
            e.close()
    return rows


def _kv_copy(model, repeats: int = 5) -> list[tuple]:
    """``kv_copy`` rows: concatenating one batch's KV arrays (every layer, key and value) with another's, with
    the allocator set as the engine sets it (:mod:`edgepop.memory`)."""
    keep_freed_memory()
    spec = model.spec
    rows = []
    for mib in (2, 8, 32, 64):
        per = mib * (1 << 20) // (4 * len(model.past_names) * spec.n_head * spec.head_dim)  # batch x positions
        a = [np.ones((1, spec.n_head, per, spec.head_dim), np.float32) for _ in model.past_names]
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            [np.concatenate([x, x], axis=0) for x in a]
            times.append(time.perf_counter() - t0)
        rows.append((model.name, "kv_copy", 1, 2 * mib, 0, float(np.median(times[1:])) * 1e3))
    return rows
