"""The profile the live-host model (:mod:`sim.live.host_model`) runs on, measured on this host just before a replay.

One table in the format of ``edgepop profile`` (``dataplane.profiler.COLUMNS``):

* the stand-in's engine as the live gateway runs it (:mod:`sim.live.served_profile`, from the engine's stamps in
  the gateway's timelines): ``prefill`` by prompts admitted together and their (padded) length, ``decode`` by
  batch and context, ``kv_merge`` (a prompt's KV merged into a decoding batch's), ``host_share`` (the decode step
  while k of the deployment's engines decode at once); and ``kv_copy`` (copying KV arrays, :func:`dataplane.engine_profile.kv_copy_profile`);
* the gateway's own costs (``gw_*`` rows, ``batch_size`` 1), from the timelines of a few traced requests sent
  one at a time to the live gateway (:mod:`dataplane.gateway.timeline`): ``gw_http_in``, ``gw_prepare`` (by
  prompt tokens), ``gw_admission``, ``gw_dispatch``, ``gw_piece`` (a streamed piece's latency beyond the
  injected return delay), ``gw_piece_cpu`` (the event loop's CPU per streamed piece, from its thread's CPU
  time), ``gw_tail`` and ``gw_http_out``. Medians, so a stray scheduling delay does not become a cost.
"""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.engine_profile import engine_profile, kv_copy_profile
from dataplane.gateway.timeline import TRACE_HEADER
from dataplane.profiler import COLUMNS
from dataplane.session import SessionConfig
from sim.live.client import event_loop_cpu_s, fetch_timings, prompt_text, stream_once
from sim.live.decompose import live_components
from sim.live.served_profile import DECODE_STEPS, served_engine_profile


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
    cpu0 = event_loop_cpu_s(fetch_timings(url, "-", token)["host"])
    recs = asyncio.run(_traced(url, model, dict(headers), prompts, max_tokens, trace))
    got = fetch_timings(url, trace, token)
    cpu1 = event_loop_cpu_s(got["host"])
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


def measure_host_profile(url: str, model: str, stand_in: str, session: SessionConfig,
                         pop_locations: list[tuple[float, float]], token: str | None = None, account: str = "local",
                         seed: int = 0, progress=None, n_ctx: int = 512, engine: str = "served",
                         decode_steps: int = DECODE_STEPS) -> pd.DataFrame:
    """The whole live-host profile of ``model`` (served by ``stand_in``) for a deployment whose replicas of it
    sit at ``pop_locations`` (one client location per PoP): the engine's rows, ``kv_copy`` rows and the
    gateway's costs. ``engine``: ``served`` reads the engine's stamps inside the live gateway
    (:mod:`sim.live.served_profile`; the gateway's process is where the engines run), ``alone`` times an engine
    in this process (:func:`dataplane.engine_profile.engine_profile`). ``decode_steps``: the steps of each
    served ``decode`` row's generations (the replayed requests' longest output, less its first token)."""
    if progress:
        progress(f"measuring {stand_in}'s engine ({engine}; {len(pop_locations)} replicas sharing the host)")
    if engine == "served":
        parts = [served_engine_profile(url, model, stand_in, pop_locations, n_ctx, token, account, seed,
                                       decode_steps=decode_steps),
                 kv_copy_profile(stand_in, session)[list(COLUMNS[:6])]]
        eng = pd.concat(parts, ignore_index=True)
    elif engine == "alone":
        eng = engine_profile(stand_in, session=session, seed=seed, prefill_batch=(1, 2, 4), repeats=5,
                             host_engines=tuple(range(1, max(len(pop_locations), 2) + 1)))[list(COLUMNS[:6])]
    else:
        raise ValueError(f"engine must be 'served' or 'alone', got {engine!r}")
    if progress:
        progress(f"measuring the gateway's own costs through {url}")
    gw = gateway_costs(url, model, stand_in, token, account, seed=seed, max_context=n_ctx)
    table = pd.concat([eng, gw], ignore_index=True)
    table["provider"] = registry.load(stand_in, session).provider
    table["host"] = socket.gethostname()
    return table[list(COLUMNS)]


def pop_locations(desc: dict, topo, model: str) -> list[tuple[float, float]]:
    """One client location at each PoP serving ``model`` in the deployment ``desc`` describes (its PoP's own
    coordinates, so the nearest-replica routers send it there), in placement order."""
    pops = topo.pops.set_index("id")
    seen = dict.fromkeys(p["pop"] for p in desc["placement"] if p["model"] == model)
    return [(float(pops.lat[p]), float(pops.lon[p])) for p in seen]
