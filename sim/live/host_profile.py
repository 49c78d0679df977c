"""The profile the live-host model (:mod:`sim.live.host_model`) runs on, measured on this host just before a replay.

One table in the format of ``edgepop profile`` (``dataplane.profiler.COLUMNS``):

* the stand-in's engine, alone and idle (:func:`dataplane.engine_profile.engine_profile`): ``prefill`` by
  prompts admitted together and their (padded) length, ``decode`` by batch and context, plus ``host_share``
  (the decode iteration with k engines decoding at once in one process) and ``kv_copy``;
* the gateway's own costs (``gw_*`` rows, ``batch_size`` 1), from the timelines of a few traced requests sent
  one at a time to the live gateway (:mod:`dataplane.gateway.timeline`): ``gw_http_in``, ``gw_prepare`` (by
  prompt tokens), ``gw_admission``, ``gw_dispatch``, ``gw_piece`` (a streamed piece's latency beyond the
  injected return delay), ``gw_piece_cpu`` (the event loop's CPU per streamed piece, from its thread's CPU
  time), ``gw_tail`` and ``gw_http_out``. Medians, so a stray scheduling delay does not become a cost.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pandas as pd

from dataplane.engine_profile import engine_profile
from dataplane.gateway.timeline import TRACE_HEADER
from dataplane.profiler import COLUMNS
from dataplane.session import SessionConfig
from sim.live.client import fetch_timings, prompt_text, stream_once
from sim.live.decompose import live_components


def _event_loop_cpu(host: dict) -> float:
    return sum(t["cpu_s"] for t in host["threads"] if t["role"] == "event-loop")


async def _traced(url: str, model: str, headers: dict, prompts: list[str], max_tokens: int, trace: str) -> list:
    import httpx

    u = f"{url.rstrip('/')}/client/v4/accounts/{headers.pop('_account')}/ai/run/{model}"
    out = []
    async with httpx.AsyncClient(timeout=120) as c:
        for i, prompt in enumerate(prompts):
            body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "seed": i}
            rec = await stream_once(c, u, {**headers, TRACE_HEADER: f"{trace}{i}"}, body)
            out.append(rec)
    return out


def gateway_costs(url: str, model: str, stand_in: str, token: str | None = None, account: str = "local",
                  prompt_tokens=(16, 128, 256), max_tokens: int = 24, repeats: int = 3, seed: int = 0,
                  max_context: int = 512) -> pd.DataFrame:
    """``gw_*`` rows of ``stand_in`` measured through the live gateway at ``url`` (one request at a time)."""
    headers = {"_account": account}
    if token:
        headers["authorization"] = f"Bearer {token}"
    rng = np.random.default_rng(seed)
    sizes = [n for n in prompt_tokens if n + max_tokens < max_context]
    prompts = [prompt_text(n, rng) for n in sizes for _ in range(repeats)]
    trace = f"hostprofile-{time.monotonic_ns()}:"
    asyncio.run(_traced(url, model, dict(headers), [prompt_text(8, rng)], 2, trace + "warm"))
    cpu0 = _event_loop_cpu(fetch_timings(url, "-")["host"])
    recs = asyncio.run(_traced(url, model, dict(headers), prompts, max_tokens, trace))
    got = fetch_timings(url, trace)
    cpu1 = _event_loop_cpu(got["host"])
    by_trace = {t["trace"]: t for t in got["requests"]}
    rows = []
    pieces = 0
    for i, (rec, n) in enumerate(zip(recs, [n for n in sizes for _ in range(repeats)], strict=True)):
        tl = by_trace.get(f"{trace}{i}")
        if tl is None or rec["status"] != 200 or tl.get("first_gen") is None:
            continue
        c = live_components(rec, tl)
        pieces += int(tl["pieces"])
        rows += [("gw_http_in", 0, c["http_in"]), ("gw_prepare", n, c["prepare"]),
                 ("gw_admission", 0, c["admission"]), ("gw_dispatch", 0, c["dispatch"]),
                 ("gw_piece", 0, c["stream_per_piece_ms"]), ("gw_tail", 0, c["tail"]),
                 ("gw_http_out", 0, c["http_out"])]
    if pieces:  # the loop's CPU over these requests, per piece (their per-request work included)
        rows.append(("gw_piece_cpu", 0, (cpu1 - cpu0) * 1e3 / pieces))
    table = pd.DataFrame([(stand_in, phase, 1, n, 0, max(float(ms), 0.001)) for phase, n, ms in rows],
                         columns=COLUMNS[:6])
    table = table.groupby(["model", "phase", "batch_size", "tokens", "context"], as_index=False).ms.median()
    table["ms"] = table.ms.round(4)
    return table


def measure_host_profile(url: str, model: str, stand_in: str, session: SessionConfig, replicas: int,
                         token: str | None = None, account: str = "local", seed: int = 0, progress=None,
                         n_ctx: int = 512) -> pd.DataFrame:
    """The whole live-host profile of ``model`` (served by ``stand_in``) for a deployment of ``replicas``
    replicas of it: the engine (with ``host_share`` up to that many engines) and the gateway's costs."""
    if progress:
        progress(f"measuring {stand_in}'s engine on this host (prefill batches, decode, {replicas} engines "
                 "sharing the host)")
    engine = engine_profile(stand_in, session=session, seed=seed, prefill_batch=(1, 2, 4), repeats=5,
                            host_engines=tuple(range(1, max(replicas, 2) + 1)))
    if progress:
        progress(f"measuring the gateway's own costs through {url}")
    gw = gateway_costs(url, model, stand_in, token, account, seed=seed, max_context=n_ctx)
    gw["provider"], gw["host"] = engine.provider.iloc[0], engine.host.iloc[0]
    return pd.concat([engine, gw[list(COLUMNS)]], ignore_index=True)
