"""The LM engine's service times *as the live gateway runs it*, read from the engine's own stamps in the gateway's
request timelines (:mod:`dataplane.gateway.timeline`), in the profile-table format of ``edgepop profile``.

An engine measured in another process (:mod:`dataplane.engine_profile`) misses what the gateway's process adds
to every iteration: its event loop and HTTP server share the interpreter lock and the cores with the engine
threads. Here calibration requests go through the live gateway and only the engine-side stamps are read, so
neither HTTP nor the injected delays enter the figures:

* ``prefill`` (``batch_size`` prompts of ``tokens`` tokens, ``max_tokens=1``, sent together while a blocker keeps
  the engine busy, so it admits them in one iteration): last first token - admission; bursts the engine still
  split over iterations are dropped;
* ``decode`` (``batch_size`` streams of ``context``-token prompts admitted together, ``decode_steps`` steps each): the
  mean decode step of the requests whose every step ran at that batch size (the median over at least
  ``3 x repeats`` requests);
* ``kv_merge`` (``batch_size`` streams decoding, one prompt joining them): the engine's own time for merging the
  joiner's KV into the batch's (``LMTiming.merge_s``), ``tokens`` the positions written, ``context`` those first
  padded in a copy of their own (the shorter side's); what a join costs the running batch beyond the prefill rows;
* ``kv_trim`` (``batch_size`` rows staying when one leaves): the engine's own time for copying them out of the
  batch's arrays (``LMTiming.trim_s``), ``tokens`` the positions written;
* ``iter_gap`` (by batch size): the mean time between two decode iterations of those requests (the engine
  loop's bookkeeping, a piece handed to the event loop per row, and waiting for a core or the interpreter lock
  when the host is busy);
* ``host_share`` (``batch_size`` = k replicas, each decoding two streams at once): the mean decode step while k
  of the deployment's engines decode together (one per emulated PoP, clients placed at each PoP), with
  ``host_share_loop`` and ``host_share_client`` rows: the cores (``ms`` = CPU ms per wall second) the gateway's
  event loop and this measuring client kept busy meanwhile, which the host model's fit counts as busy threads;
* ``host_share_merge`` (``batch_size`` = k): the engine's own time for one merge (:data:`SHARED_MERGE`: a prompt
  joining two decoding streams) while the other k - 1 engines decode, whose ratios to k = 1 are how much a merge
  or a trim slows down on a busy host, which need not be what a decode step does (on the 2-core VM at k = 4:
  1.46x and 2.44x in two measurements against 2.73x and 2.85x for a decode step).

Medians over ``repeats``.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pandas as pd

from dataplane.gateway.timeline import TRACE_HEADER
from dataplane.profiler import COLUMNS
from edgepop.errors import UserError
from sim.live.client import event_loop_cpu_s, fetch_timings, gateway_message, prompt_text, stream_once

PROMPT_TOKENS = (8, 32, 64, 128, 256, 384)
PREFILL_BATCH = (1, 2, 4, 8)
DECODE_BATCH = (1, 2, 4, 8, 16)
CONTEXTS = (32, 128, 256, 384)
# A generation's mean decode step falls with its length (its first steps cost more: 3.2 ms over 16 steps against
# 2.9 over 32 at 128 tokens of context, one engine on the development VM, the same in paced lone requests), so the
# rows are measured over as many steps as a replayed request of the longest output decodes (ReplayOptions'
# max_output, 32 tokens: 31 steps after the first token).
DECODE_STEPS = 31
# (running rows, their prompts' tokens, the joining prompt's tokens) of the kv_merge rows: a joiner shorter and
# longer than the batch's past (the shorter side's padding is a copy of its own), small and large batches, short
# and long pasts (no two shapes write the same positions: rows are keyed by them).
MERGE_SHAPES = tuple((b, ctx, n) for b in (2, 8) for ctx, n in ((64, 32), (64, 256), (320, 32), (320, 448)))
# (rows, their prompts' tokens) of the kv_trim rows: one of the rows leaves after 8 tokens, the others stay.
TRIM_SHAPES = tuple((b, ctx) for b in (2, 4, 8) for ctx in (64, 320))
# (running rows, their prompts' tokens, the joining prompt's tokens) of the host_share_merge rows: one of the
# kv_merge shapes, the same at every k, so that only the other engines' load differs.
SHARED_MERGE = (2, 320, 448)


class _Gateway:
    """Bursts of traced streaming requests to one live gateway, and their engine records."""

    def __init__(self, url: str, model: str, token: str | None, account: str, seed: int, n_ctx: int):
        self.n_ctx = n_ctx
        self.url = f"{url.rstrip('/')}/client/v4/accounts/{account}/ai/run/{model}"
        self.base_url = url
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.rng = np.random.default_rng(seed)
        self.prefix = f"served-{time.monotonic_ns()}-"
        self.n = 0

    async def burst(self, client, sizes: list[int], max_tokens: int | list[int], locations: list[str],
                    late: tuple[int, float] | None = None) -> list[dict]:
        """Send one request per size at once (from ``locations``) while a blocker keeps each engine busy, so that
        the engine admits them together when the blocker's iteration ends; their engine records (``max_tokens``:
        one for all, or one per request). ``late`` = (prompt
        tokens, delay s): one more request (two tokens) sent that long after the others, from the first location;
        its record comes last."""
        self.n += 1
        group = f"{self.prefix}{self.n}:"
        blockers = []
        # One prefill per engine, first, long enough to outlast the burst's arrival (every request costs the
        # gateway a millisecond or two before it reaches the engine).
        block = min(self.n_ctx - 2, 96 + 24 * len(sizes))
        for j, loc in enumerate(dict.fromkeys(locations)):
            body = {"prompt": prompt_text(block, self.rng), "max_tokens": 1, "stream": True, "ignore_eos": True}
            headers = {**self.headers, TRACE_HEADER: f"{group}b{j}", "x-edgepop-client-location": loc}
            blockers.append(asyncio.ensure_future(stream_once(client, self.url, headers, body)))
        await asyncio.sleep(0.02)
        jobs = []
        for i, (n, loc) in enumerate(zip(sizes, locations, strict=True)):
            asked = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
            body = {"prompt": prompt_text(n, self.rng), "max_tokens": asked, "stream": True,
                    "ignore_eos": True, "seed": i}
            headers = {**self.headers, TRACE_HEADER: f"{group}{i}", "x-edgepop-client-location": loc}
            jobs.append(stream_once(client, self.url, headers, body))
        if late is not None:
            jobs.append(self._late(client, group, late, locations[0]))
        recs = await asyncio.gather(*jobs)
        await asyncio.gather(*blockers)
        refused = next((r for r in recs if r["status"] == 429), None)
        if refused is not None:  # its own message says which limit: rate, load shedding or a neuron budget
            raise UserError(f"{self.base_url}: the gateway refused profiling requests with 429 "
                            f"({gateway_message(refused['error'])}); serve it without that limit (--no-rate-limit, "
                            "--max-wait 0, no --neuron-budget) to measure it")
        if any(r["status"] != 200 or r["error"] for r in recs):
            return []
        token = self.headers.get("authorization", "").removeprefix("Bearer ") or None
        got = fetch_timings(self.base_url, group, token)["requests"]
        got.sort(key=lambda t: t["trace"].removeprefix(group) == "late")
        return [t["engine"] for t in got if not t["trace"].removeprefix(group).startswith("b")
                and t.get("engine") and t["engine"].get("first_token") is not None]

    async def _late(self, client, group: str, late: tuple[int, float], loc: str) -> dict:
        n, delay = late
        await asyncio.sleep(delay)
        body = {"prompt": prompt_text(n, self.rng), "max_tokens": 2, "stream": True, "ignore_eos": True}
        headers = {**self.headers, TRACE_HEADER: f"{group}late", "x-edgepop-client-location": loc}
        return await stream_once(client, self.url, headers, body)


def _loop_cpu_s(gw: _Gateway) -> float:
    """CPU seconds the gateway's event loop thread has used so far."""
    token = gw.headers.get("authorization", "").removeprefix("Bearer ") or None
    return event_loop_cpu_s(fetch_timings(gw.base_url, "-", token)["host"])


def _join_delay(rows: list[tuple], n_ctx: int, b: int, ctx: int, slower: float = 1.0) -> float:
    """Seconds after a burst's start at which a joiner finds its ``b`` streams of ``ctx``-token prompts decoding,
    a few steps in: after the blocker's and the batch's prefills (the nearest measured rows of ``rows``; 10 ms per
    32 tokens and prompt without them) and four decode steps, each ``slower`` times the measured one."""
    pre = {(r[1], r[2]): r[4] for r in rows if r[0] == "prefill"}
    dec = {r[1]: r[4] for r in rows if r[0] == "decode"}

    def prefill_ms(bb: int, n: int) -> float:
        return pre[min(pre, key=lambda k: (abs(k[0] - bb), abs(k[1] - n)))] if pre else 10.0 * bb * n / 32
    step = dec.get(b, dec.get(1, 5.0)) * slower
    return 0.02 + 1.3 * (prefill_ms(1, min(n_ctx - 2, 96 + 24 * b)) + prefill_ms(b, ctx)) / 1e3 + 4 * step / 1e3


async def _merges(gw: _Gateway, c, where: str, n_ctx: int, repeats: int, shapes, rows: list[tuple]) -> list[tuple]:
    """``kv_merge`` rows: ``b`` streams of ``ctx``-token prompts decode, a prompt of ``n`` tokens joins them a few
    steps in; the engine's own record of that merge (``merge_s`` and the positions it wrote)."""
    out: dict[tuple, list[float]] = {}
    for b, ctx, n in shapes:
        steps = min(48, n_ctx - ctx - 2)
        if n > n_ctx - 2 or steps < 16:
            continue
        delay = _join_delay(rows, n_ctx, b, ctx)
        got = []
        for _ in range(repeats * 2):
            eng = await gw.burst(c, [ctx] * b, steps, [where] * b, late=(n, delay))
            if eng and eng[-1].get("merge_s"):
                got.append(eng[-1])
            if len(got) == repeats:
                break
        if got:
            tokens, pad, ms = np.median([(e["merge_tokens"], e["merge_pad_tokens"], e["merge_s"]) for e in got], axis=0)
            out.setdefault((b, round(tokens), round(pad)), []).append(max(ms * 1e3, 1e-3))
    return [("kv_merge", *key, float(np.median(ms))) for key, ms in out.items()]  # one row per point


async def _trims(gw: _Gateway, c, where: str, n_ctx: int, repeats: int, shapes) -> list[tuple]:
    """``kv_trim`` rows: ``b`` streams of ``ctx``-token prompts decode, one of them ends early and the others are
    copied out of the batch's arrays; the engine's own record of that copy (``trim_s`` and the positions written)."""
    out: dict[tuple, list[float]] = {}
    for b, ctx in shapes:
        if n_ctx - ctx - 2 < 24:
            continue
        got, bursts = [], 0
        for _ in range(repeats * 3):
            eng = await gw.burst(c, [ctx] * b, [8] + [24] * (b - 1), [where] * b)
            # Only a burst admitted in one prefill has the shape asked (every row at the same past when one
            # leaves); on a loaded host one stream can reach the engine an iteration late and join by a merge.
            if len(eng) == b and all(e.get("prefill_rows") == b for e in eng):
                got += [e for e in eng if e.get("trims") == 1]
                bursts += 1
            if bursts == repeats:
                break
        if got:
            tokens, ms = np.median([(e["trim_tokens"], e["trim_s"]) for e in got], axis=0)
            out.setdefault((b - 1, round(tokens)), []).append(max(ms * 1e3, 1e-3))
    return [("kv_trim", b, tokens, 0, float(np.median(ms))) for (b, tokens), ms in out.items()]


async def _shared_merges(gw: _Gateway, c, where: list[str], n_ctx: int, repeats: int, host_engines,
                         rows: list[tuple]) -> list[tuple]:
    """``host_share_merge`` rows: the :data:`SHARED_MERGE` merge at the first engine while k - 1 others decode two
    streams each (for long enough to outlast it); the engine's own record of the merge, the median per k."""
    b, ctx, n = SHARED_MERGE
    ctx, n = min(ctx, n_ctx // 2), min(n, n_ctx - 2)
    steps = min(48, n_ctx - ctx - 2)
    out = []
    for k in host_engines:
        if k > len(where):
            continue
        delay = _join_delay(rows, n_ctx, b, ctx, slower=k)  # (steps slow down with k engines busy)
        others = [loc for loc in where[1:k] for _ in (0, 1)]
        busy = min(n_ctx - 130, 2 * steps)  # the others decode on past the merge
        got = []
        for _ in range(repeats * 2):
            eng = await gw.burst(c, [ctx] * b + [128] * len(others), [steps] * b + [busy] * len(others),
                                 [where[0]] * b + others, late=(n, delay))
            if eng and eng[-1].get("merge_s"):
                got.append(eng[-1]["merge_s"] * 1e3)
            if len(got) == repeats:
                break
        if got:
            out.append(("host_share_merge", k, n, 0, max(float(np.median(got)), 1e-3)))
    return out


async def _measure(gw: _Gateway, where: list[str], n_ctx: int, repeats: int, steps: int, prompt_tokens,
                   prefill_batch, decode_batch, contexts, host_engines, decode_steps: int,
                   merge_shapes=(), trim_shapes=()) -> list[tuple]:
    import httpx

    rows = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        await gw.burst(c, [8], 2, where[:1])  # warm-up
        for b in prefill_batch:
            for n in (t for t in prompt_tokens if t < n_ctx - 1):
                ms = []
                for _ in range(repeats * 2):  # bursts the engine split over iterations do not count
                    eng = await gw.burst(c, [n] * b, 1, where[:1] * b)
                    if len(eng) == b and len({e["admitted"] for e in eng}) == 1:
                        ms.append((max(e["first_token"] for e in eng) - eng[0]["admitted"]) * 1e3)
                    if len(ms) == repeats:
                        break
                if ms:
                    rows.append(("prefill", b, n, 0, float(np.median(ms))))
        gaps: dict[int, list[float]] = {}
        for b in decode_batch:
            for ctx in contexts:
                n = min(decode_steps, n_ctx - ctx - 2)  # (fewer steps where the window leaves less room)
                if n < 1:
                    continue
                ms = []
                # Small batches give few samples per burst: at least 3 x repeats per row (batch 1 is most of
                # a light load's steps, and a median of three was seen 10-20% off the live engine's steps).
                for _ in range(max(repeats, -(-3 * repeats // b))):
                    eng = await gw.burst(c, [ctx] * b, n + 1, where[:1] * b)
                    clean = [e for e in eng if e["steps"] and e["batch_sum"] == b * e["steps"]]
                    ms += [e["decode_s"] / e["steps"] * 1e3 for e in clean]
                    gaps.setdefault(b, []).extend(
                        (e["last_token"] - e["first_token"] - e["decode_s"] - e["stall_s"]) / e["steps"] * 1e3
                        for e in clean)
                if ms:
                    rows.append(("decode", b, 1, ctx, float(np.median(ms))))
        for b, g in sorted(gaps.items()):  # the mean: rare long waits for a core are what it is about
            rows.append(("iter_gap", b, 0, 0, max(float(np.mean(g)), 0.0)))
        rows += await _merges(gw, c, where[0], n_ctx, repeats, merge_shapes, rows)
        rows += await _trims(gw, c, where[0], n_ctx, repeats, trim_shapes)
        for k in host_engines:
            ms = []
            h0, c0, t0 = _loop_cpu_s(gw), time.process_time(), time.monotonic()
            # Every ratio is taken to k = 1, whose bursts give two samples each: more of them, and more for
            # every k than the decode rows get (the fitted cores swung 1.35-1.65 between runs with three).
            for _ in range(max(2 * repeats, -(-6 * repeats // (2 * k)))):
                eng = await gw.burst(c, [128] * (2 * k), 2 * steps + 1, [loc for loc in where[:k] for _ in (0, 1)])
                ms += [e["decode_s"] / e["steps"] * 1e3 for e in eng if e["steps"] and e["batch_sum"] == 2 * e["steps"]]
            # what ran beside the engines meanwhile (milli-cores): the gateway's event loop and this client
            wall = max(time.monotonic() - t0, 1e-9)
            loop_mc, client_mc = 1e3 * (_loop_cpu_s(gw) - h0) / wall, 1e3 * (time.process_time() - c0) / wall
            if ms:
                rows.append(("host_share", k, 1, 128, float(np.median(ms))))
                rows += [("host_share_loop", k, 0, 0, max(loop_mc, 1e-3)),  # profile rows must be positive
                         ("host_share_client", k, 0, 0, max(client_mc, 1e-3))]
        if merge_shapes and host_engines:
            rows += await _shared_merges(gw, c, where, n_ctx, repeats, host_engines, rows)
    return rows


def served_engine_profile(url: str, model: str, stand_in: str, pop_locations: list[tuple[float, float]],
                          n_ctx: int = 512, token: str | None = None, account: str = "local", seed: int = 0,
                          repeats: int = 3, steps: int = 16, prompt_tokens=PROMPT_TOKENS,
                          prefill_batch=PREFILL_BATCH, decode_batch=DECODE_BATCH, contexts=CONTEXTS,
                          host_engines=None, decode_steps: int = DECODE_STEPS,
                          merge_shapes=MERGE_SHAPES, trim_shapes=TRIM_SHAPES) -> pd.DataFrame:
    """``prefill``, ``decode`` and ``host_share`` rows of ``model`` (named after ``stand_in``) measured inside
    the live gateway at ``url``; ``pop_locations``: one client location at each PoP serving the model (the
    first serves the prefill and decode rows), ``host_engines``: the k values (default 1..PoPs, when several).
    ``decode_steps``: the decode steps of each ``decode`` row's generations (a request's mean step falls with
    its length, so the rows are measured at the length the replayed requests have: ``max_output - 1``; fewer at
    a context the model's window leaves less room after);
    ``steps``: the ``host_share`` rows' (twice that), whose ratios to one engine do not depend on it;
    ``merge_shapes`` and ``trim_shapes``: the ``kv_merge`` and ``kv_trim`` rows' (:data:`MERGE_SHAPES`,
    :data:`TRIM_SHAPES`; empty: none; with merge shapes and several PoPs, ``host_share_merge`` rows too)."""
    where = [f"{lat:.5f},{lon:.5f}" for lat, lon in pop_locations]
    if host_engines is None:
        host_engines = tuple(range(1, len(where) + 1)) if len(where) > 1 else ()
    gw = _Gateway(url, model, token, account, seed, n_ctx)
    if decode_steps < 1:
        raise ValueError(f"decode_steps must be at least 1, got {decode_steps}")
    rows = asyncio.run(_measure(gw, where, n_ctx, repeats, steps, prompt_tokens, prefill_batch, decode_batch,
                                contexts, host_engines, decode_steps, merge_shapes, trim_shapes))
    table = pd.DataFrame([(stand_in, *r) for r in rows], columns=COLUMNS[:6])
    table["ms"] = table.ms.round(4)
    return table
