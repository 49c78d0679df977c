"""Service times of a language model measured *through a live gateway*, in the profile-table format of
``edgepop profile`` (``dataplane.profiler.COLUMNS``), for sim-vs-live comparisons.

The gateway adds its own per-request and per-token work (HTTP, tokenizing, SSE frames, the event loop and the
client sharing the engine's cores). A profile taken through it lets the simulator see the service times a
client of the emulation sees, so the comparison tests what the simulator models (network, routing, queueing,
batching), not whether a bare graph call costs what a served token costs.

* ``prefill`` (batch 1, ``tokens``): streamed requests with ``max_tokens=1``; client TTFT minus the injected RTT
  the gateway reports (``x-edgepop-rtt-ms`` x the deployment's delay scale);
* ``decode`` (``batch_size``, ``context``): ``batch_size`` concurrent streamed requests of ``context``-token
  prompts; the median client-side gap between consecutive tokens while all of them are streaming.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pandas as pd

from dataplane.gateway.sse import DONE, SSEParser
from dataplane.profiler import COLUMNS
from edgepop.errors import UserError
from sim.live.client import gateway_message, prompt_text

PROMPT_TOKENS = (8, 32, 64, 128, 256, 384)
DECODE_BATCH = (1, 2, 4, 8)
CONTEXTS = (32, 128, 256)


async def _stream(client, url: str, headers: dict, prompt: str, max_tokens: int, seed: int) -> tuple[float, list]:
    """(injected RTT in ms, arrival times of the pieces) of one streamed request."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "seed": seed}
    t0 = time.perf_counter()
    times = [t0]
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:  # (a neuron budget spent, a rate limit, a wrong token: the gateway says which)
            raise UserError(f"{url}: the gateway refused a profiling request with HTTP {r.status_code} "
                            f"({gateway_message(await r.aread())})")
        rtt = float(r.headers.get("x-edgepop-rtt-ms", 0.0))
        parser = SSEParser()
        async for text in r.aiter_text():
            now = time.perf_counter()
            for data in parser.feed(text):
                if data != DONE and json.loads(data).get("response"):
                    times.append(now)
    return rtt, times


async def _measure(url: str, model: str, headers: dict, delay_scale: float, rng: np.random.Generator,
                   prompt_tokens, decode_batch, contexts, steps: int, repeats: int) -> list[tuple]:
    import httpx

    u = f"{url.rstrip('/')}/client/v4/accounts/{headers.pop('_account')}/ai/run/{model}"
    rows = []
    async with httpx.AsyncClient(timeout=120) as c:
        await _stream(c, u, headers, prompt_text(16, rng), 2, 0)  # warm-up
        for n in prompt_tokens:
            ms = []
            for i in range(repeats):
                rtt, times = await _stream(c, u, headers, prompt_text(n, rng), 1, i)
                ms.append((times[1] - times[0]) * 1e3 - rtt * delay_scale)
            rows.append(("prefill", 1, n, 0, max(float(np.median(ms)), 0.01)))
        for b in decode_batch:
            for ctx in contexts:
                gaps = []
                for _ in range(repeats):
                    res = await asyncio.gather(*(_stream(c, u, headers, prompt_text(ctx, rng), steps + 1, i)
                                                 for i in range(b)))
                    pieces = [np.array(t[1:]) for _, t in res]
                    start, end = max(p[0] for p in pieces), min(p[-1] for p in pieces)
                    for p in pieces:
                        gaps += np.diff(p[(p >= start) & (p <= end)]).tolist()
                if gaps:
                    rows.append(("decode", b, 1, ctx, max(float(np.median(gaps)) * 1e3, 0.01)))
    return rows


def gateway_profile(url: str, model: str, stand_in: str, delay_scale: float, token: str | None = None,
                    account: str = "local", location: str | None = None, prompt_tokens=PROMPT_TOKENS,
                    decode_batch=DECODE_BATCH, contexts=CONTEXTS, steps: int = 24, repeats: int = 3,
                    seed: int = 0, max_context: int = 512) -> pd.DataFrame:
    """The profile table of ``model`` (rows named after its ``stand_in``) measured through the gateway at ``url``."""
    headers = {"_account": account}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if location:
        headers["x-edgepop-client-location"] = location
    prompt_tokens = tuple(t for t in prompt_tokens if t < max_context - 1)
    contexts = tuple(c for c in contexts if c + steps + 1 < max_context)
    import httpx

    try:
        rows = asyncio.run(_measure(url, model, headers, delay_scale, np.random.default_rng(seed), prompt_tokens,
                                    decode_batch, contexts, steps, repeats))
    except httpx.HTTPError as exc:  # (the gateway stopped, or its connection broke, while profiling)
        raise UserError(f"{url}: gateway not reachable while profiling ({type(exc).__name__}: {exc})") from None
    table = pd.DataFrame([(stand_in, *r) for r in rows], columns=COLUMNS[:6])
    table["ms"] = table.ms.round(4)
    table["provider"] = "gateway"
    table["host"] = url
    return table[list(COLUMNS)]
