"""Multi-turn chat sessions and prefix-block ids (``hash_ids``), vectorised.

A session is one user's conversation with one LLM. Turn 1 sends a chat prompt; every later turn sends the whole
history (earlier prompts and answers) plus a short new user message, after a think time. So consecutive turns share
a prefix, which is what prefix caching and session affinity exploit.

Turns are open-loop: a turn arrives at the previous turn's *arrival* plus the think time, not at the end of its
answer, so a turn may arrive while the answer its prompt (and ``hash_ids``) already holds is still streaming
(docs/workloads.md gives the share in the ablation scenario). The prefix cache holds prompt blocks only, never an
answer's, so such a turn can hit no more than a timely one could: the previous prompts' full blocks.

``hash_ids`` follow the Mooncake trace convention: a prompt of ``p`` tokens is cut into ``ceil(p / B)`` blocks of
``B`` tokens and each block gets an id that identifies the block *and everything before it* (a chained hash). Two
prompts share block ``i``'s id exactly when their first ``(i + 1) * B`` tokens are identical: the full blocks of a
session's history keep their ids from turn to turn, while a partial last block is new in every request. Ids are
numbered 0, 1, 2, ... in order of first appearance in arrival order, as in Mooncake's files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from sim.tokens import TaskTokens

THINK_SIGMA = 0.8  # spread of the think time between turns (lognormal): most gaps between ~1/3x and 3x the median


@dataclass
class Turns:
    """Turns of a set of sessions, in session order then turn order."""

    t: np.ndarray
    session: np.ndarray  # index of the session (0..S-1 within this call): its user, city and model
    turn: np.ndarray  # turn number within its chat
    prompt: np.ndarray
    output: np.ndarray
    chat: np.ndarray  # index of the chat (0..C-1 within this call): a session that outgrew its window goes on in new ones
    n_chats: int


def _segmented_cumsum(x: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cumulative sum of ``x`` restarting at each segment (segments of ``counts`` items starting at ``first``)."""
    c = np.cumsum(x)
    return c - np.repeat(c[first] - x[first], counts)


def expand_sessions(t0: np.ndarray, context: np.ndarray, dist: TaskTokens, mean_turns: float,
                    think_time_s: float, rng: np.random.Generator) -> Turns:
    """Turns of sessions starting at ``t0`` on models with context windows ``context`` (one per session).

    Turns per session are geometric with mean ``mean_turns``. A turn whose history would not fit the context
    window starts a new chat instead (the user opens a new conversation with a fresh first message, and the
    session's later turns build on that one), so every drawn turn arrives and the workload keeps its rate and its
    share of session turns. Outputs are clipped so prompt + output fits the window.
    """
    n = len(t0)
    k = rng.geometric(1.0 / mean_turns, n) if n else np.zeros(0, np.int64)
    first = np.cumsum(k) - k
    session = np.repeat(np.arange(n), k)
    turn = np.arange(int(k.sum())) - np.repeat(first, k)
    later = turn > 0
    msg = np.empty(len(turn), np.int64)
    msg[~later] = dist.prompt.sample(rng, n)
    msg[later] = dist.followup.sample(rng, int(later.sum()))
    output = dist.output.sample(rng, len(turn))
    ctx = context[session]
    msg[~later] = np.minimum(msg[~later], context - 1)
    gaps = np.where(later, think_time_s * np.exp(THINK_SIGMA * rng.standard_normal(len(turn))), 0.0)
    t = t0[session] + _segmented_cumsum(gaps, first, k)
    # Each turn adds the previous answer and a new message to the history it sends, within its chat. Prompts grow
    # strictly within a chat, so its first overflowing turn starts the next chat; repeat until none overflows (a
    # chat's first prompt always fits).
    start = ~later
    while True:
        starts = np.flatnonzero(start)
        length = np.diff(np.append(starts, len(turn)))
        grow = msg.copy()
        cont = np.flatnonzero(~start)
        grow[cont] += output[cont - 1]
        prompt = _segmented_cumsum(grow, starts, length)
        over = prompt > ctx - 1
        if not over.any():
            break
        chat = np.repeat(np.arange(len(starts)), length)
        idx = np.flatnonzero(over)
        first_over = idx[np.r_[True, chat[idx][1:] != chat[idx][:-1]]]  # each chat's first overflowing turn
        start[first_over] = True
        msg[first_over] = np.minimum(dist.prompt.sample(rng, len(first_over)), ctx[first_over] - 1)
    starts = np.flatnonzero(start)
    length = np.diff(np.append(starts, len(turn)))
    chat = np.repeat(np.arange(len(starts)), length)
    turn = np.arange(len(turn)) - np.repeat(starts, length)
    output = np.minimum(output, ctx - prompt)
    return Turns(t, session, turn, prompt, output, chat, len(starts))


def block_hash_ids(prompt: np.ndarray, group: np.ndarray, block_tokens: int) -> np.ndarray:
    """Flat prefix-block ids and the offsets of each request's slice (``len(prompt) + 1`` offsets).

    Requests are in arrival order; ``group`` (non-negative ints, used as indices) names what a request's prompt
    is a prefix of: the session for turns, a distinct value for each session-less request.
    Returns ``(ids, offsets)``.
    """
    prompt = np.asarray(prompt, np.int64)
    full = prompt // block_tokens
    partial = (prompt % block_tokens) > 0
    g = np.asarray(group, np.int64)
    max_full = np.zeros(g.max() + 1 if len(g) else 0, np.int64)
    np.maximum.at(max_full, g, full)
    base = np.cumsum(max_full) - max_full
    length = full + partial
    offsets = np.concatenate(([0], np.cumsum(length)))
    owner = np.repeat(np.arange(len(prompt)), length)
    pos = np.arange(offsets[-1]) - offsets[owner]
    partial_id = max_full.sum() + np.cumsum(partial) - 1  # a fresh id per partial last block
    ids = np.where(pos < full[owner], base[g][owner] + pos, partial_id[owner])
    # Renumber by first appearance so ids grow along the trace, like Mooncake's.
    return first_appearance_ids(ids, np.ones(len(ids), bool)), offsets


def hash_id_column(ids: np.ndarray, offsets: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """Request ``i``'s ids ``ids[offsets[i]:offsets[i + 1]]`` as an Arrow list column: the flat ids and the offsets
    as they are (8 bytes an id), not a tuple of Python ints per request (~0.1 GB more at a million requests)."""
    ids, offsets = np.asarray(ids, np.int64), np.asarray(offsets, np.int64)
    kind = pa.ListArray if offsets[-1] < 2**31 else pa.LargeListArray
    values = kind.from_arrays(pa.array(offsets, pa.int32() if kind is pa.ListArray else pa.int64()), pa.array(ids))
    return pd.arrays.ArrowExtensionArray(values)


def as_hash_id_column(rows) -> pd.api.extensions.ExtensionArray:
    """A sequence of id sequences (tuples of a trace, lists) as :func:`hash_id_column`'s column."""
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    ids = np.fromiter((h for r in rows for h in r), np.int64, int(offsets[-1]))
    return hash_id_column(ids, offsets)


def first_appearance_ids(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Renumber ``values`` (where ``valid``) 0, 1, 2, ... in order of first appearance; -1 elsewhere."""
    out = np.full(len(values), -1, np.int64)
    v = values[valid]
    if len(v):
        _, first, inverse = np.unique(v, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        out[valid] = rank[inverse]
    return out
