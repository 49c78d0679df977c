"""Gateway benchmark: overhead over a direct data-plane call, and throughput with batching at concurrency 32.

1. Overhead: the same embedding request (``all-MiniLM-L6-v2``, one short sentence) run N times, alternating
   (a) a direct ``dataplane.tasks.text_embeddings`` call in this process (tokenize, engine, shape) and (b) over HTTP through an ``edgepop serve --no-delay --no-auth`` subprocess. Reported: p50 of (b) - p50 of (a)
   and the median of the paired differences as seen by the client (includes httpx's own cost), the server-side
   ``gateway`` stage of ``server-timing`` (what the gateway's code adds: parsing, tokenizing, control plane,
   JSON), and the client's time minus the server's engine time (HTTP + gateway, whatever the engine costs in
   the server process; on a busy 2-core machine the engine itself runs slower there than in the client).
2. Throughput at concurrency 32: embeddings (dynamic batching up to 32) and streamed chat completions
   (continuous batching), with requests/s, tokens/s, latency percentiles and the engines' mean batch size from
   /metrics; the embedding run is repeated against a server with batching off (max batch 1) for contrast.

The client and server share this machine's cores (2 on the development machine), so throughput figures are a
floor. The servers run without per-minute rate limits and without load shedding (``--no-rate-limit --max-wait
0``): this measures what the engines and the HTTP stack can do, not admission. Last stdout line: one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from dataplane.gateway.server import spawn_serve
from edgepop.argtypes import json_line

EMB = "@edgepop/all-minilm-l6-v2"
GEN = "@edgepop/gpt2-tiny"
TEXT = "The quick brown fox jumps over the lazy dog."
N_SEQ = 300
CONCURRENCY = 32


def pct(xs, q):
    return round(float(np.percentile(xs, q)), 3)


def overhead_pairs(url: str, n: int) -> tuple[list[float], list[float], list[float]]:
    """Direct calls and HTTP calls interleaved one by one, so both see the same background load.

    Returns (direct ms, HTTP ms, server-side (gateway stage, engine) ms)."""
    from dataplane.service import DataPlane
    from dataplane.tasks import text_embeddings

    u = f"{url}/client/v4/accounts/local/ai/run/{EMB}"
    direct, client_ms, server_ms = [], [], []
    with DataPlane() as dp, httpx.Client(timeout=30) as c:
        for _ in range(30):
            text_embeddings(dp, "minilm-l6-v2", {"text": TEXT})
            c.post(u, json={"text": TEXT})
        for _ in range(n):
            t = time.perf_counter()
            text_embeddings(dp, "minilm-l6-v2", {"text": TEXT})
            direct.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            r = c.post(u, json={"text": TEXT})
            client_ms.append((time.perf_counter() - t) * 1e3)
            assert r.status_code == 200, r.text
            st = dict(p.split(";dur=") for p in r.headers["server-timing"].split(", "))
            server_ms.append((float(st["gateway"]), float(st["infer"])))
    return direct, client_ms, server_ms


async def _load(url: str, path: str, make_body, total: int, stream: bool) -> dict:
    lat, tokens, errors = [], 0, 0
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)

    async def worker(c):
        nonlocal tokens, errors
        while not queue.empty():
            i = queue.get_nowait()
            t = time.perf_counter()
            if stream:
                async with c.stream("POST", url + path, json=make_body(i)) as r:
                    async for line in r.aiter_lines():
                        # tokens as the server counts them (the usage chunk): a content chunk may carry several
                        if line.startswith("data: {") and '"usage"' in line:
                            usage = json.loads(line[6:]).get("usage")
                            tokens += usage["completion_tokens"] if usage else 0
                    ok = r.status_code == 200
            else:
                r = await c.post(url + path, json=make_body(i))
                ok = r.status_code == 200
            errors += not ok
            lat.append((time.perf_counter() - t) * 1e3)

    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - t0
    return {"requests": total, "errors": errors, "wall_s": round(wall, 2), "rps": round(total / wall, 1),
            "tokens_per_s": round(tokens / wall, 1), "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95)}


def engine_counts(url: str, stand_in: str) -> np.ndarray:
    """(items, engine calls) of one stand-in's engine, from /metrics."""
    text = httpx.get(f"{url}/metrics").text
    items = float(re.search(rf'edgepop_engine_items_total{{stand_in="{stand_in}"}} ([\d.e+]+)', text).group(1))
    calls = float(re.search(rf'edgepop_engine_batches_total{{stand_in="{stand_in}"}} ([\d.e+]+)', text).group(1))
    return np.array([items, calls])


def measured_batch(url: str, stand_in: str, run) -> dict:
    """Run ``run()`` and add the mean engine batch size during it."""
    before = engine_counts(url, stand_in) if stand_in else None
    out = run()
    if stand_in:
        items, calls = engine_counts(url, stand_in) - before
        out["mean_batch"] = round(float(items / max(calls, 1.0)), 2)
    return out


def floor_ms(url: str, n: int) -> list[float]:
    """Round trips of GET /healthz: the HTTP stack alone (client, server, loopback)."""
    out = []
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            t = time.perf_counter()
            c.get(f"{url}/healthz")
            out.append((time.perf_counter() - t) * 1e3)
    return out


def server(tmp: Path, extra: list[str]):
    cfg = tmp / f"gw{len(list(tmp.iterdir()))}.toml"
    cfg.write_text(f'models = ["{EMB}", "{GEN}"]\npops = ["FRA", "LHR"]\n' + "\n".join(extra) + "\n")
    # Throughput figures of the engines and the HTTP stack: no per-minute limits, no load shedding.
    return spawn_serve(["--config", str(cfg), "--no-auth", "--no-delay", "--no-rate-limit", "--max-wait", "0",
                        "--db", str(tmp / "b.sqlite")])


def main() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    proc, url = server(tmp, ["slots = 256"])
    try:
        direct, client, srv = overhead_pairs(url, N_SEQ)
        floor = floor_ms(url, N_SEQ)
        emb_path = f"/client/v4/accounts/local/ai/run/{EMB}"
        emb = measured_batch(url, "minilm-l6-v2", lambda: asyncio.run(
            _load(url, emb_path, lambda i: {"text": f"{TEXT} {i}"}, 640, False)))
        chat_path = "/client/v4/accounts/local/ai/v1/chat/completions"
        chat = measured_batch(url, "gpt2-tiny", lambda: asyncio.run(_load(url, chat_path, lambda i: {
            "model": GEN, "messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": 32,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": i}, 192, True)))
    finally:
        proc.terminate()
        proc.wait()
    proc, url = server(tmp, ["slots = 256", "encoder_max_batch = 1"])
    try:
        emb1 = measured_batch(url, "minilm-l6-v2", lambda: asyncio.run(
            _load(url, emb_path, lambda i: {"text": f"{TEXT} {i}"}, 320, False)))
    finally:
        proc.terminate()
        proc.wait()
    d50, c50 = statistics.median(direct), statistics.median(client)
    paired = statistics.median(np.array(client) - np.array(direct))
    gw_stage, infer = np.array(srv).T
    beside_engine = statistics.median(np.array(client) - infer)
    result = {
        "direct_p50_ms": round(d50, 3), "http_p50_ms": round(c50, 3), "http_p95_ms": pct(client, 95),
        "overhead_p50_ms": round(c50 - d50, 3), "overhead_paired_median_ms": round(float(paired), 3), "server_gateway_stage_p50_ms": pct(gw_stage, 50),
        "server_engine_p50_ms": pct(infer, 50), "overhead_beside_engine_p50_ms": round(float(beside_engine), 3),
        "http_floor_p50_ms": pct(floor, 50),
        "overhead_goal_ms": 1.0,
        "embeddings_c32": emb, "embeddings_c32_no_batching": emb1,
        "batching_speedup": round(emb["rps"] / max(emb1["rps"], 1e-9), 2),
        "chat_stream_c32": chat,
    }
    for k, v in result.items():
        print(f"{k}: {v}", file=sys.stderr)
    return result


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(json_line(main()))
