"""``edgepop replay``: send a request trace to a live gateway from emulated client locations and time it.

Each trace row becomes one streaming text-generation request at its (scaled) arrival time, from a demand city
drawn by population (seeded), sent as ``x-edgepop-client-location``. Prompts are ASCII text of exactly the
trace's prompt length (the byte-level stand-in tokenizers make one token per character), capped by
``max_prompt``; ``ignore_eos`` makes every request generate exactly its output length (capped by ``max_output``).

Client-side per request: TTFT (send -> first non-empty piece), inter-token gaps, TPOT = (E2E - TTFT) / (tokens -
1) as the simulator defines it, and E2E (send -> end of stream). Written to ``live.parquet``; the simulator's view
of the same requests comes from :mod:`sim.live.fidelity`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dataplane.gateway.timeline import TRACE_HEADER
from edgepop.errors import UserError
from edgepop.memory import collector_paused
from sim.live.client import prompt_text, stream_once


@dataclass
class ReplayOptions:
    """What to replay and where; see ``edgepop replay --help``."""

    url: str
    trace: str
    out: str = "out/replay"
    requests: int = 100
    time_scale: float = 1.0
    model: str = "@cf/meta/llama-3.2-1b-instruct"
    max_prompt: int = 256
    max_output: int = 32
    token: str | None = None
    account: str = "local"
    concurrency: int = 64
    profile: str | None = None
    profile_source: str = "host"  # "host": sim.live.host_profile; "gateway": through the gateway; "engine": alone
    profile_repeats: int = 1  # profiles measured back to back, pooled per row (median): one scatters by 10-40%
    simulate: bool = True
    seed: int = 0
    timeout_s: float = 120.0
    repeat_live: bool = False  # send the same requests a second time: the live system compared with itself

    def run_url(self) -> str:
        """The Workers AI run endpoint of the replayed model."""
        return f"{self.url.rstrip('/')}/client/v4/accounts/{self.account}/ai/run/{self.model}"

    def auth(self) -> dict[str, str]:
        """The authorization header, when a token is given."""
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    def check(self) -> None:
        """One-line errors for sizes and rates out of range (before minutes of profiling, not after)."""
        for name in ("requests", "max_prompt", "max_output", "concurrency", "profile_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:  # (numpy ints too)
                raise UserError(f"replay: --{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name, label in (("time_scale", "--time-scale"), ("timeout_s", "timeout_s")):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise UserError(f"replay: {label} must be a positive number, got {value!r}")


def build_requests(trace: pd.DataFrame, topo, opts: ReplayOptions, rng: np.random.Generator) -> pd.DataFrame:
    """Trace rows -> requests with client cities (by population), ingress PoPs and capped sizes.

    Columns follow the simulator's workload frame (``sim.workload.COLUMNS``) so the same frame drives both.
    """
    opts.check()
    # The earliest requests, as the simulator's trace replay takes them (a file need not be in time order)
    t = trace.iloc[np.argsort(trace.arrival_s.to_numpy(), kind="stable")[: opts.requests]]
    n = len(t)
    d = topo.demand
    w = d.weight.to_numpy(np.float64)
    cum = np.cumsum(w)
    city = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), len(d) - 1)
    lat, lon = d.lat.to_numpy()[city], d.lon.to_numpy()[city]
    ingress, access = topo.ingress(lat, lon)
    arrival = (t.arrival_s.to_numpy() - t.arrival_s.to_numpy().min()) / opts.time_scale
    return pd.DataFrame({
        "request_id": np.arange(n), "arrival_s": arrival, "city": city, "user_lat": lat, "user_lon": lon,
        "user_country": d.cc.to_numpy()[city], "user_continent": d.continent.to_numpy()[city],
        "ingress": ingress.astype(np.int64), "ingress_pop": topo.pops.id.to_numpy()[ingress],
        "access_rtt_ms": access.astype(np.float64), "model": opts.model, "task": "text-generation",
        "prompt_tokens": np.clip(t.prompt_tokens.to_numpy(), 1, opts.max_prompt).astype(np.int64),
        "output_tokens": np.clip(t.output_tokens.to_numpy(), 1, opts.max_output).astype(np.int64),
        "session_id": np.full(n, -1, np.int64), "batch": False, "reject_if_busy": False,
    })


async def _one(client, url: str, headers: dict, body: dict, t_due: float, sem: asyncio.Semaphore) -> dict:
    await asyncio.sleep(max(0.0, t_due - time.monotonic()))
    async with sem:
        lag_ms = (time.monotonic() - t_due) * 1e3
        rec = await stream_once(client, url, headers, body)
        rec.update(sent_lag_ms=lag_ms, trace=headers.get(TRACE_HEADER, ""))
        return rec


async def send_all(frame: pd.DataFrame, opts: ReplayOptions, rng: np.random.Generator,
                   trace: str = "replay:") -> pd.DataFrame:
    """Send every request at its arrival time; returns ``frame`` with the client-side measurements added. Each
    request is traced as ``<trace><request_id>`` (its gateway timeline: :func:`fetch_timings`)."""
    import httpx

    url = opts.run_url()
    base = {"content-type": "application/json", **opts.auth()}
    sem = asyncio.Semaphore(opts.concurrency)
    limits = httpx.Limits(max_connections=opts.concurrency, max_keepalive_connections=opts.concurrency)
    async with httpx.AsyncClient(timeout=opts.timeout_s, limits=limits) as client:
        t_start = time.monotonic() + 0.2
        jobs = []
        for row in frame.itertuples():
            body = {"prompt": prompt_text(int(row.prompt_tokens), rng), "max_tokens": int(row.output_tokens),
                    "stream": True, "ignore_eos": True, "seed": int(row.request_id)}
            headers = {**base, "x-edgepop-client-location": f"{row.user_lat:.5f},{row.user_lon:.5f}",
                       TRACE_HEADER: f"{trace}{row.request_id}"}
            jobs.append(_one(client, url, headers, body, t_start + row.arrival_s, sem))
        # The client's own full collections (its process also holds the topology and the simulation: 50-80 ms
        # each) would stamp late every piece they delay: the collector waits until the replay is over.
        with collector_paused():
            records = await asyncio.gather(*jobs)
    live = pd.DataFrame(records)
    for col in ("ttft_ms", "e2e_ms", "tpot_ms", "itl_p50_ms", "itl_max_ms", "completion_tokens",
                "prompt_tokens_served", "c_first", "c_end"):
        if col not in live:
            live[col] = np.nan
    return pd.concat([frame.reset_index(drop=True), live], axis=1)
