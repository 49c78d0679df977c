"""Load test of the live gateway on loopback: an overload sweep (default) or a mixed valid/malformed run.

    python benchmarks/loadtest_gateway.py                        # sweep 1..256 clients against its own server
    python benchmarks/loadtest_gateway.py --kind embed           # the same with embedding clients
    python benchmarks/loadtest_gateway.py --client httpx         # the same with httpx clients
    python benchmarks/loadtest_gateway.py --mixed                # 70% valid / 30% malformed at --concurrency
    python benchmarks/loadtest_gateway.py --keepalive-probe      # reuse connections idle ~5 s (own servers)
    python benchmarks/loadtest_gateway.py --url http://127.0.0.1:8787 --token TOKEN --account ACCT

Sweep: for each concurrency level (1, 2, 4, ..., 256) that many closed-loop clients send requests for
``--step-seconds`` (or until ``--step-requests`` answers; 9 levels x 15 s by default, about 2.5 minutes). A client
refused with 429 waits what ``retry-after-ms`` (else ``Retry-After``) says before its next request, as the
``openai`` client does. Per level: admitted (200) latency p50/p99 as the client sees it and as the server's
``server-timing`` says, shed rate (429s over all answers), goodput (200s per second inside the level's window, which
ends early when ``--step-requests`` answers came first), the share of 429s carrying ``Retry-After``, other errors,
and the CPU share the client and (own server, Linux) the server got: on a shared machine that share moves goodput
more than anything the gateway does. Summary: the unloaded p99 (of the 1-client level, which ``--levels`` must
list, wherever it lists it), the bound 2 x unloaded p99 + max wait and whether every level's admitted p99 stays under
it, and the lowest goodput from the peak level on as a fraction of the peak. The server runs with rate limits off
(they would cap one account long before the engines saturate), no WAN delay and one onnxruntime thread; client and
server share the machine's cores, so absolute figures are a floor and noisy. The sweep's clients are a minimal
keep-alive HTTP/1.1 client (``benchmarks/http_light.py``, about 0.1 ms of CPU per request against httpx's 0.9 ms),
so the load generator takes little of the cores the server needs; ``--client httpx`` runs the same sweep with httpx.

Mixed: ``--requests`` requests (at most ``--duration`` s) at ``--concurrency``, 70% valid and 30% malformed; status
counts, 5xx (must be 0), unexpected statuses, latency per kind, server memory before and after.

Keep-alive probe: clients that reuse a pooled connection after 4.95-5.0 s of idleness (httpx's and the openai
client's pool keep idle connections 5 s), against a server keeping idle connections 5 s (uvicorn's default) and
one keeping them ``keep_alive_s`` (the gateway's default, 75 s); counts of ``ReadError`` and answers.

Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import ssl
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from http_light import LightClient, LightHTTPError

from dataplane.gateway.server import require_loopback, spawn_serve
from edgepop.argtypes import json_line, non_negative_float, positive_int
from edgepop.errors import UserError
from edgepop.rng import seed_arg
from edgepop.stats import percentiles

GEN, EMB, CLS = "@edgepop/gpt2-tiny", "@edgepop/all-minilm-l6-v2", "@edgepop/bert-small-classify"
TOKEN, ACCOUNT = "tok-loadtest-00001", "load"
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SWEEP_BODY = {"chat": (GEN, {"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True}),
              "embed": (EMB, {"text": ["a sentence to embed", "and another one"]})}

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


def rss_mb(url: str, token: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"}).text
    m = re.search(r"^process_resident_memory_bytes ([\d.e+]+)$", text, re.M)
    return round(float(m.group(1)) / 2**20, 1) if m else float("nan")


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) of process ``pid`` so far (Linux /proc; None elsewhere or without a pid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, TypeError):
        return None


def retry_after_s(r: httpx.Response) -> float | None:
    """What a 429 asks a client to wait: ``retry-after-ms`` (as the openai client reads it), else ``Retry-After``."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(r.headers[name]) * scale
        except (KeyError, ValueError):
            continue
    return None


# ---------------------------------------------------------------------------------------------------- sweep
async def sweep_level(pool: list, url: str, hdr: dict, kind: str, clients: int, seconds: float,
                      max_answers: int, server_pid: int | None = None) -> dict:
    """``clients`` closed-loop clients for ``seconds``: requests are sent only inside the window; the ones in
    flight at its end are waited for and count in the latencies, while goodput counts answers inside it. Each
    client has its own connection from ``pool`` (httpx's shared pool scans all its connections per request,
    which at 256 would make the load generator, not the server, the bottleneck)."""
    model, body = SWEEP_BODY[kind]
    path = f"/client/v4/accounts/{hdr['account']}/ai/run/{model}"
    headers = {"authorization": hdr["authorization"]}
    lat, server_lat, counts, answered_at = [], [], collections.Counter(), []
    shed_with_retry = 0
    capped_at = None  # when max_answers stopped the sending: the window ends there if that is before ``end``
    cpu0, server0 = time.process_time(), cpu_seconds(server_pid)
    t0 = time.monotonic()
    end = t0 + seconds

    async def session(c):
        nonlocal shed_with_retry, capped_at
        while time.monotonic() < end and sum(counts.values()) < max_answers:
            t = time.perf_counter()
            try:
                r = await (c.post_json(path, body, headers) if isinstance(c, LightClient)
                           else c.post(url + path, json=body, headers=headers))
            except (httpx.HTTPError, LightHTTPError) as exc:
                counts[type(exc).__name__] += 1
                continue
            counts[r.status_code] += 1
            if capped_at is None and sum(counts.values()) >= max_answers:
                capped_at = time.monotonic()
            if r.status_code == 200:
                lat.append((time.perf_counter() - t) * 1e3)
                timing = dict(p.split(";dur=") for p in r.headers.get("server-timing", "").split(", ") if ";dur=" in p)
                server_lat.append(float(timing.get("total", "nan")))
                answered_at.append(time.monotonic())
            elif r.status_code == 429:
                wait = retry_after_s(r)
                shed_with_retry += wait is not None
                await asyncio.sleep(min(wait if wait is not None else 1.0, max(0.0, end - time.monotonic())))

    await asyncio.gather(*(session(c) for c in pool[:clients]))
    wall = time.monotonic() - t0
    client_cpu, server1 = time.process_time() - cpu0, cpu_seconds(server_pid)
    answers = sum(v for k, v in counts.items() if isinstance(k, int))
    window_end = min(end, capped_at) if capped_at is not None else end
    in_window = sum(t <= window_end for t in answered_at)
    window_s = max(window_end - t0, 1e-9)
    p, ps = percentiles(lat, (50, 99), digits=1), percentiles(server_lat, (50, 99), digits=1)
    return {"clients": clients, "admitted": counts[200], "shed": counts[429],
            "p50_ms": p["p50"], "p99_ms": p["p99"], "server_p50_ms": ps["p50"], "server_p99_ms": ps["p99"],
            "shed_rate": round(counts[429] / answers, 3) if answers else None,
            "goodput_rps": round(in_window / window_s, 1), "window_s": round(window_s, 2),
            "retry_after_share": round(shed_with_retry / counts[429], 3) if counts[429] else None,
            "client_cpu_share": round(client_cpu / wall, 2),
            "server_cpu_share": round((server1 - server0) / wall, 2) if server0 is not None and server1 else None,
            "goodput_per_server_cpu_s": round(in_window / (server1 - server0), 1)
            if server0 is not None and server1 and server1 > server0 else None,
            "other": {str(k): v for k, v in counts.items() if k not in (200, 429)}}


async def run_sweep(url: str, token: str, account: str, kind: str, levels, seconds: float, max_answers: int,
                    max_wait_s: float, server_pid: int | None = None, client: str = "light") -> dict:
    hdr = {"authorization": f"Bearer {token}", "account": account}
    rows = []
    if client == "light":
        pool = [LightClient(url) for _ in range(max(levels))]
    else:
        tls = ssl.create_default_context()  # one for all clients: building one per client costs ~30 ms of CPU each
        pool = [httpx.AsyncClient(timeout=120, verify=tls, limits=httpx.Limits(max_connections=1))
                for _ in range(max(levels))]
    try:
        for n in levels:
            rows.append(await sweep_level(pool, url, hdr, kind, n, seconds, max_answers, server_pid))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            await asyncio.sleep(1.0)  # let the last answers drain before the next level
    finally:
        for c in pool:
            await c.aclose()
    unloaded = unloaded_p99(rows)
    bound = 2 * unloaded + max_wait_s * 1e3 if unloaded is not None else None
    worst = max((r["p99_ms"] for r in rows if r["p99_ms"] is not None), default=None)
    goodput = [r["goodput_rps"] for r in rows]
    peak_i = int(np.argmax(goodput))
    after_peak = min(goodput[peak_i:])
    sheds = sum(r["shed"] for r in rows)
    with_retry = sum(round((r["retry_after_share"] or 0) * r["shed"]) for r in rows)
    return {"mode": "sweep", "kind": kind, "client": client, "max_wait_s": max_wait_s, "levels": rows,
            "unloaded_p99_ms": unloaded, "p99_bound_ms": None if bound is None else round(bound, 1),
            "worst_admitted_p99_ms": worst, "latency_bound_held": None if bound is None else worst <= bound,
            "peak_goodput_rps": goodput[peak_i], "peak_at_clients": rows[peak_i]["clients"],
            "goodput_after_peak_min_fraction": round(after_peak / goodput[peak_i], 3) if goodput[peak_i] else None,
            "per_cpu_goodput_after_peak_min_fraction": per_cpu_fraction(rows),
            "shed_total": sheds, "retry_after_on_all_429": with_retry == sheds,
            "errors_other": sum(sum(r["other"].values()) for r in rows)}


def unloaded_p99(rows: list[dict]) -> float | None:
    """Admitted p99 of the level with the fewest clients (1: --levels must list it), wherever it is listed."""
    return min(rows, key=lambda r: r["clients"])["p99_ms"]


def per_cpu_fraction(rows: list[dict]) -> float | None:
    """The goodput-after-peak fraction of goodput per server CPU-second: what is left of the goodput criterion
    when other processes take the server's cores (None without the server's CPU time)."""
    g = [r.get("goodput_per_server_cpu_s") for r in rows]
    if any(x is None for x in g) or not g:
        return None
    peak = int(np.argmax(g))
    return round(min(g[peak:]) / g[peak], 3) if g[peak] else None


# ---------------------------------------------------------------------------------------------------- mixed
async def run_mixed(url: str, token: str, account: str, n: int, duration_s: float, concurrency: int,
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
    lat = {}
    for k, v in sorted(stats.items()):
        p = percentiles(v, (50, 95, 99), digits=2)
        lat[k] = {"n": len(v), **{f"p{q}_ms": p[f"p{q}"] for q in (50, 95, 99)}}
    return {"mode": "mixed", "requests": done, "wall_s": round(wall, 2), "throughput_rps": round(done / wall, 1),
            "status_codes": {str(k): v for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))},
            "server_errors_5xx": sum(v for k, v in codes.items() if isinstance(k, int) and k >= 500),
            "unexpected": dict(unexpected), "latency": lat}


# ---------------------------------------------------------------------------------------------------- keep-alive
async def keepalive_probe(url: str, token: str, account: str, clients: int = 50) -> dict:
    """Each client sends a request, stays idle just under 5 s, then sends another on the same connection."""
    u = f"{url}/client/v4/accounts/{account}/ai/run/{EMB}"
    hdr = {"authorization": f"Bearer {token}"}
    counts: collections.Counter = collections.Counter()

    async def one(k: int, idle: float):
        async with httpx.AsyncClient(timeout=30) as c:
            await c.post(u, json={"text": "first"}, headers=hdr)
            await asyncio.sleep(idle + 0.0005 * k)
            try:
                counts[(await c.post(u, json={"text": "again"}, headers=hdr)).status_code] += 1
            except httpx.HTTPError as exc:
                counts[type(exc).__name__] += 1

    for idle in (4.95, 4.96, 4.97, 4.98, 4.99, 5.0):
        await asyncio.gather(*(one(k, idle) for k in range(clients)))
    return {str(k): v for k, v in counts.items()}


def run_keepalive(token: str, account: str) -> dict:
    out = {"mode": "keepalive-probe"}
    for keep in (5, None):
        tmp = Path(tempfile.mkdtemp(prefix="loadtest-ka-"))
        (tmp / "gw.toml").write_text(f"keep_alive_s = {keep}\n" if keep else "")
        proc, url = spawn_serve(["--config", str(tmp / "gw.toml"), "--no-delay", "--no-rate-limit", "--models", EMB,
                                 "--pops", "FRA", "--db", str(tmp / "b.sqlite")],
                                env={"EDGEPOP_TOKENS": f"{token}:{account}"})
        try:
            out[f"server_keep_alive_{'5s' if keep else 'default'}"] = run(keepalive_probe(url, token, account))
        finally:
            proc.terminate()
            proc.wait()
    return out


def run(coro):
    """Run the load on uvloop (the server's loop too): the generator's own overhead stays small at 256 clients."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running gateway (loopback only); default: start one")
    ap.add_argument("--token", default=TOKEN)
    ap.add_argument("--account", default=ACCOUNT)
    ap.add_argument("--mixed", action="store_true", help="the mixed valid/malformed run instead of the sweep")
    ap.add_argument("--keepalive-probe", action="store_true", help="the keep-alive race probe instead")
    ap.add_argument("--kind", choices=sorted(SWEEP_BODY), default="chat", help="sweep request kind")
    ap.add_argument("--client", choices=("light", "httpx"), default="light",
                    help="sweep clients: a minimal keep-alive HTTP/1.1 client (default; it takes less of the cores "
                         "the server needs) or httpx")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="sweep concurrency levels (max 256)")
    ap.add_argument("--step-seconds", type=float, default=15.0, help="seconds per sweep level (default 15)")
    ap.add_argument("--step-requests", type=int, default=5000, help="at most this many answers per level")
    ap.add_argument("--max-wait", type=non_negative_float, default=2.0,
                    help="the server's wait bound (own server only; 0: off)")
    ap.add_argument("--threads", type=positive_int, default=1, help="the server's onnxruntime threads (own server only; "
                    "default 1, leaving the other core to the event loop and the clients)")
    ap.add_argument("--requests", type=int, default=2000, help="mixed: at most this many requests (default 2000)")
    ap.add_argument("--duration", type=float, default=60.0, help="mixed: and at most this many seconds")
    ap.add_argument("--concurrency", type=int, default=32, help="mixed: concurrent clients")
    ap.add_argument("--malformed-fraction", type=non_negative_float, default=0.3, help="mixed: in [0, 1]")
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args()
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        ap.error("--levels must be comma-separated integers")
    if (not 1 <= args.requests <= 100_000 or not 0 < args.duration <= 600 or not 1 <= args.concurrency <= 256
            or not all(1 <= n <= 256 for n in levels) or not 0 < args.step_seconds <= 120
            or not 1 <= args.step_requests <= 100_000 or not args.malformed_fraction <= 1):
        ap.error("requests in [1, 100000], duration in (0, 600] s, concurrency and levels in [1, 256], "
                 "step-seconds in (0, 120], step-requests in [1, 100000], malformed-fraction in [0, 1]")
    if 1 not in levels and not (args.mixed or args.keepalive_probe):  # the sweep's unloaded p99 is the 1-client level's
        ap.error(f"--levels must include 1 (the unloaded level), got {args.levels!r}")
    if args.keepalive_probe:
        return run_keepalive(args.token, args.account)
    proc = None
    url = args.url.rstrip("/") if args.url is not None else None  # (paths are appended to it)
    if url is not None:  # someone else's server: loopback only, healthy, taking the token, before any load is sent
        try:
            require_loopback(url)
            health = httpx.get(f"{url}/healthz", timeout=10)
            metrics = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {args.token}"}, timeout=10)
        except UserError as exc:
            ap.error(str(exc))
        except httpx.HTTPError as exc:
            ap.error(f"--url {url}: no gateway answers there ({type(exc).__name__}: {exc})")
        if health.status_code != 200:
            ap.error(f"--url {url}: GET /healthz answered {health.status_code}, not 200: is it an edgepop gateway?")
        if metrics.status_code in (401, 403):
            ap.error(f"--token: the gateway at {url} refuses it (GET /metrics answered {metrics.status_code})")
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="loadtest-gw-"))
        cfg = tmp / "gw.toml"
        cfg.write_text(f'models = ["{GEN}", "{EMB}", "{CLS}"]\npops = ["FRA", "LHR", "IAD"]\n'
                       'max_body_bytes = 1048576\n[stand_ins]\n"@edgepop/bert-small-classify" = "bert-tiny-classify"\n')
        proc, url = spawn_serve(["--config", str(cfg), "--no-delay", "--no-rate-limit", "--max-wait",
                                 str(args.max_wait), "--threads", str(args.threads), "--db", str(tmp / "b.sqlite")],
                                env={"EDGEPOP_TOKENS": f"{args.token}:{args.account}"}, log=tmp / "server.log")
    try:
        before = rss_mb(url, args.token)
        if args.mixed:
            out = run(run_mixed(url, args.token, args.account, args.requests, args.duration,
                                        args.concurrency, args.malformed_fraction, args.seed))
        else:
            out = run(run_sweep(url, args.token, args.account, args.kind, levels, args.step_seconds,
                                args.step_requests, args.max_wait, proc.pid if proc is not None else None,
                                args.client))
        out["server_rss_mb_before"], out["server_rss_mb_after"] = before, rss_mb(url, args.token)
        out["server_alive_after"] = httpx.get(f"{url}/healthz").status_code == 200
    finally:
        if proc is not None:
            proc.terminate()
            out_code = proc.wait()
    if proc is not None:
        out["server_exit_status"] = out_code
    for k, v in out.items():
        if k != "levels":
            print(f"{k}: {v}", file=sys.stderr)
    return out


if __name__ == "__main__":
    print(json_line(main()))
