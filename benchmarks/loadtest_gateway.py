"""Load test of the live gateway: mixed valid and malformed requests at concurrency, bounded in count and time,
loopback only.

    python benchmarks/loadtest_gateway.py                     # starts its own `edgepop serve` subprocess
    python benchmarks/loadtest_gateway.py --url http://127.0.0.1:8787 --token TOKEN --account ACCT

Reports throughput, latency percentiles per request kind, status-code counts, 5xx count (must be 0), and the
server's resident memory (``process_resident_memory_bytes`` from /metrics) before and after. Stops after
``--requests`` requests or ``--duration`` seconds, whichever comes first. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from dataplane.gateway.server import require_loopback, spawn_serve

GEN, EMB, CLS = "@edgepop/gpt2-tiny", "@edgepop/all-minilm-l6-v2", "@edgepop/bert-small-classify"
TOKEN, ACCOUNT = "tok-loadtest-00001", "load"

# (kind, model, body or raw bytes, expected statuses); malformed kinds must be answered 4xx, never 5xx.
VALID = [
    ("generate", GEN, {"prompt": "Once upon a time", "max_tokens": 16}, {200, 429}),
    ("generate-stream", GEN, {"prompt": "Stream this", "max_tokens": 16, "stream": True}, {200, 429}),
    ("embed", EMB, {"text": ["a sentence", "another sentence"]}, {200, 429}),
    ("classify", CLS, {"text": "what a lovely day"}, {200, 429}),
    ("busy-reject", GEN, {"prompt": "x", "max_tokens": 8, "options": {"rejectIfBusy": True}}, {200, 429}),
]
MALFORMED = [
    ("bad-json", GEN, b"{\"prompt\": ", {400}),
    ("bad-schema", GEN, {"prompt": 12, "max_tokens": "many"}, {400}),
    ("no-fields", EMB, {}, {400}),
    ("unknown-model", "@cf/none/such", {"prompt": "x"}, {400}),
    ("too-large", GEN, {"prompt": "y" * 4000}, {413}),
    ("bad-location", GEN, {"prompt": "x"}, {400}),
    ("no-auth", GEN, {"prompt": "x"}, {401}),
    ("other-account", GEN, {"prompt": "x"}, {403}),
]


def rss_mb(url: str) -> float:
    m = re.search(r"^process_resident_memory_bytes ([\d.e+]+)$", httpx.get(f"{url}/metrics").text, re.M)
    return round(float(m.group(1)) / 2**20, 1) if m else float("nan")


async def run_load(url: str, token: str, account: str, n: int, duration_s: float, concurrency: int,
                   malformed_fraction: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    picks = [(MALFORMED if rng.random() < malformed_fraction else VALID) for _ in range(n)]
    plan = [group[int(rng.integers(len(group)))] for group in picks]
    stats = collections.defaultdict(list)
    codes: collections.Counter = collections.Counter()
    unexpected: collections.Counter = collections.Counter()
    next_i = 0
    deadline = time.monotonic() + duration_s

    async def one(c, kind, model, body, expected):
        acct = "someone-else" if kind == "other-account" else account
        hdr = {} if kind == "no-auth" else {"authorization": f"Bearer {token}"}
        if kind == "bad-location":
            hdr["x-edgepop-client-location"] = "north pole"
        u = f"{url}/client/v4/accounts/{acct}/ai/run/{model}"
        t = time.perf_counter()
        if isinstance(body, bytes):
            r = await c.post(u, content=body, headers={**hdr, "content-type": "application/json"})
        elif body.get("stream"):
            async with c.stream("POST", u, json=body, headers=hdr) as r:
                await r.aread()
        else:
            r = await c.post(u, json=body, headers=hdr)
        stats[kind].append((time.perf_counter() - t) * 1e3)
        codes[r.status_code] += 1
        if r.status_code not in expected:
            unexpected[f"{kind}:{r.status_code}"] += 1

    async def worker(c):
        nonlocal next_i
        while next_i < n and time.monotonic() < deadline:
            i, next_i = next_i, next_i + 1
            try:
                await one(c, *plan[i])
            except httpx.HTTPError as exc:
                codes[type(exc).__name__] += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    done = sum(len(v) for v in stats.values())
    lat = {k: {"n": len(v), "p50_ms": round(float(np.percentile(v, 50)), 2),
               "p95_ms": round(float(np.percentile(v, 95)), 2), "p99_ms": round(float(np.percentile(v, 99)), 2)}
           for k, v in sorted(stats.items())}
    return {"requests": done, "wall_s": round(wall, 2), "throughput_rps": round(done / wall, 1),
            "status_codes": {str(k): v for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))},
            "server_errors_5xx": sum(v for k, v in codes.items() if isinstance(k, int) and k >= 500),
            "unexpected": dict(unexpected), "latency": lat}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running gateway (loopback only); default: start one")
    ap.add_argument("--token", default=TOKEN)
    ap.add_argument("--account", default=ACCOUNT)
    ap.add_argument("--requests", type=int, default=2000, help="at most this many requests (default 2000)")
    ap.add_argument("--duration", type=float, default=60.0, help="and at most this many seconds (default 60)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--malformed-fraction", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 1 <= args.requests <= 100_000 or not 0 < args.duration <= 600 or not 1 <= args.concurrency <= 256:
        ap.error("requests must be in [1, 100000], duration in (0, 600] s, concurrency in [1, 256]")
    proc = None
    url = args.url
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="loadtest-gw-"))
        cfg = tmp / "gw.toml"
        cfg.write_text(f'models = ["{GEN}", "{EMB}", "{CLS}"]\npops = ["FRA", "LHR", "IAD"]\nslots = 16\n'
                       'max_body_bytes = 1048576\n[stand_ins]\n"@edgepop/bert-small-classify" = "bert-tiny-classify"\n')
        proc, url = spawn_serve(["--config", str(cfg), "--no-delay", "--db", str(tmp / "b.sqlite")],
                                env={"EDGEPOP_TOKENS": f"{args.token}:{args.account}"})
    require_loopback(url)
    try:
        before = rss_mb(url)
        out = asyncio.run(run_load(url, args.token, args.account, args.requests, args.duration, args.concurrency,
                                   args.malformed_fraction, args.seed))
        out["server_rss_mb_before"], out["server_rss_mb_after"] = before, rss_mb(url)
        out["server_alive_after"] = httpx.get(f"{url}/healthz").status_code == 200
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    for k, v in out.items():
        print(f"{k}: {v}", file=sys.stderr)
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
