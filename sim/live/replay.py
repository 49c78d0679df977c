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
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.gateway.server import require_loopback
from dataplane.gateway.sse import DONE, SSEParser
from dataplane.session import SessionConfig
from edgepop.errors import UserError
from sim.live.client import prompt_text
from sim.live.fidelity import compare, measure_profile, simulate_like, summarize
from sim.live.live_profile import gateway_profile
from sim.traces import read_trace
from topology import Topology


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
    profile_source: str = "gateway"  # "gateway": measured through the live gateway; "engine": the LM engine alone
    simulate: bool = True
    seed: int = 0
    timeout_s: float = 120.0


def build_requests(trace: pd.DataFrame, topo, opts: ReplayOptions, rng: np.random.Generator) -> pd.DataFrame:
    """Trace rows -> requests with client cities (by population), ingress PoPs and capped sizes.

    Columns follow the simulator's workload frame (``sim.workload.COLUMNS``) so the same frame drives both.
    """
    if opts.requests < 1 or opts.time_scale <= 0 or opts.max_prompt < 1 or opts.max_output < 1:
        raise UserError("replay: requests, time scale, max prompt and max output must be positive")
    t = trace.iloc[: opts.requests]
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
    await asyncio.sleep(max(0.0, t_due - time.perf_counter()))
    async with sem:
        t0 = time.perf_counter()
        rec = {"sent_lag_ms": (t0 - t_due) * 1e3, "status": 0, "error": "", "serving_pop": "", "pieces": 0}
        times, usage = [], {}
        try:
            async with client.stream("POST", url, json=body, headers=headers) as r:
                rec["status"] = r.status_code
                rec["serving_pop"] = r.headers.get("x-edgepop-pop", "")
                if r.status_code != 200:
                    rec["error"] = (await r.aread()).decode(errors="replace")[:200]
                    return rec
                parser = SSEParser()
                async for text in r.aiter_text():
                    now = time.perf_counter()
                    for data in parser.feed(text):
                        if data == DONE:
                            continue
                        ev = json.loads(data)
                        if "error" in ev:
                            rec["error"] = json.dumps(ev["error"])[:200]
                        if ev.get("response"):
                            times.append(now)
                        usage = ev.get("usage") or usage
                t_end = time.perf_counter()
        except Exception as exc:  # a broken connection is this request's outcome, not the replay's
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
            return rec
        gaps = np.diff(times) * 1e3 if len(times) > 1 else np.array([])
        tokens = int(usage.get("completion_tokens", len(times)))
        ttft = (times[0] - t0) * 1e3 if times else np.nan
        e2e = (t_end - t0) * 1e3
        rec.update(ttft_ms=ttft, e2e_ms=e2e, pieces=len(times), completion_tokens=tokens,
                   prompt_tokens_served=int(usage.get("prompt_tokens", 0)),
                   itl_p50_ms=float(np.median(gaps)) if len(gaps) else np.nan,
                   itl_max_ms=float(gaps.max()) if len(gaps) else np.nan,
                   tpot_ms=(e2e - ttft) / (tokens - 1) if tokens > 1 and times else np.nan)
        return rec


async def send_all(frame: pd.DataFrame, opts: ReplayOptions, rng: np.random.Generator) -> pd.DataFrame:
    """Send every request at its arrival time; returns ``frame`` with the client-side measurements added."""
    import httpx

    url = f"{opts.url.rstrip('/')}/client/v4/accounts/{opts.account}/ai/run/{opts.model}"
    base = {"content-type": "application/json"}
    if opts.token:
        base["authorization"] = f"Bearer {opts.token}"
    sem = asyncio.Semaphore(opts.concurrency)
    limits = httpx.Limits(max_connections=opts.concurrency, max_keepalive_connections=opts.concurrency)
    async with httpx.AsyncClient(timeout=opts.timeout_s, limits=limits) as client:
        t_start = time.perf_counter() + 0.2
        jobs = []
        for row in frame.itertuples():
            body = {"prompt": prompt_text(int(row.prompt_tokens), rng), "max_tokens": int(row.output_tokens),
                    "stream": True, "ignore_eos": True, "seed": int(row.request_id)}
            headers = {**base, "x-edgepop-client-location": f"{row.user_lat:.5f},{row.user_lon:.5f}"}
            jobs.append(_one(client, url, headers, body, t_start + row.arrival_s, sem))
        records = await asyncio.gather(*jobs)
    live = pd.DataFrame(records)
    for col in ("ttft_ms", "e2e_ms", "tpot_ms", "itl_p50_ms", "itl_max_ms", "completion_tokens",
                "prompt_tokens_served"):
        if col not in live:
            live[col] = np.nan
    return pd.concat([frame.reset_index(drop=True), live], axis=1)


def fetch_deployment(url: str, token: str | None = None) -> dict:
    """The live gateway's ``/edgepop/deployment`` description (it takes an API token unless the gateway runs
    without auth or with ``--open-ops``)."""
    import httpx

    auth = {"authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{url.rstrip('/')}/edgepop/deployment", headers=auth, timeout=10)
    except httpx.HTTPError as exc:
        raise UserError(f"{url}: gateway not reachable ({exc})") from None
    if r.status_code != 200:
        raise UserError(f"{url}: /edgepop/deployment answered {r.status_code}")
    return r.json()


def replay_and_compare(opts: ReplayOptions, progress=print) -> str:
    """Run the live replay, then (unless ``simulate`` is off) the simulator, write outputs, return the report."""
    require_loopback(opts.url)
    desc = fetch_deployment(opts.url, opts.token)
    if opts.model not in {p["model"] for p in desc["placement"]}:
        raise UserError(f"replay: model {opts.model!r} is not served by {opts.url}")
    topo = Topology.load(last_mile_ms=desc["last_mile_ms"])
    rng = np.random.default_rng(opts.seed)
    frame = build_requests(read_trace(opts.trace)[0], topo, opts, rng)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = opts.profile
    if opts.simulate and not profile:  # measured before the live run, under the same machine conditions
        profile = measure_for_replay(opts, desc, progress)
        profile.to_csv(out / "profile.csv", index=False)
    progress(f"replaying {len(frame)} requests over {frame.arrival_s.max():.1f} s against {opts.url}")
    live = asyncio.run(send_all(frame, opts, rng))
    live.to_parquet(out / "live.parquet", index=False)
    ok = live[(live.status == 200) & (live.error == "")]
    progress(f"live: {len(ok)}/{len(live)} ok; wrote {out / 'live.parquet'}")
    if not opts.simulate:
        return summarize(ok).to_string(index=False)
    sim = simulate_like(desc, live, topo, profile, progress=progress)
    sim.to_parquet(out / "sim.parquet", index=False)
    table = compare(sim, live)
    table.to_csv(out / "comparison.csv", index=False)
    return table.to_string(index=False)


def measure_for_replay(opts: ReplayOptions, desc: dict, progress=print) -> pd.DataFrame:
    """The service-time profile the simulator uses: through the gateway (default) or of the bare LM engine."""
    stand_in = desc["stand_ins"][opts.model]
    session = SessionConfig(provider=desc.get("provider", "auto"), intra_op_threads=desc.get("threads", 0))
    if opts.profile_source == "engine":
        return measure_profile([stand_in], progress, session)
    if opts.profile_source != "gateway":
        raise UserError(f"replay: profile source must be 'gateway' or 'engine', got {opts.profile_source!r}")
    progress(f"measuring {opts.model} ({stand_in}) through the gateway (pass --profile to reuse a table)")
    n_ctx = registry.load(stand_in, session).spec.n_ctx
    scale = float(desc["delay_scale"]) if desc["delay"] else 0.0
    return gateway_profile(opts.url, opts.model, stand_in, scale, opts.token, opts.account, max_context=n_ctx,
                           seed=opts.seed)
