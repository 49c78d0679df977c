"""Data-plane benchmarks on this machine's provider; the last line printed is one JSON object.

1. Encoder dynamic batching vs one-at-a-time, 32 concurrent clients (goal: >= 3x throughput).
2. LM tokens/s with continuous batching vs sequential, 16 concurrent sequences; and continuous batching with
   the KV cache kept in the provider's memory between steps vs copied through host memory every step (the
   default on CUDA vs the only way before; on CPU both are host memory, so expect a ratio near 1).
3. Per-call overhead of the engines over a bare ``InferenceSession.run``.

Usage: ``python benchmarks/bench_dataplane.py [--quick] [--encoder minilm-l6-v2] [--lm gpt2-tiny]``
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from dataplane import registry
from dataplane.engine_batch import BatchConfig, BatchingEngine
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.sampling import SamplingParams
from dataplane.tokenization import pad_batch
from edgepop.argtypes import json_line, name_list

WORDS = ("edge inference runs at the point of presence close to users while the control plane places models "
         "and routes requests across regions with calibrated latency").split()


def _sentences(n: int, rng: np.random.Generator) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(8, 24)))) for _ in range(n)]


def _closed_loop(engine: BatchingEngine, items: list, clients: int) -> float:
    """Requests per second with ``clients`` threads, each sending its share back to back."""
    shares = [items[i::clients] for i in range(clients)]

    def client(share):
        for item in share:
            engine.submit(item).result()

    threads = [threading.Thread(target=client, args=(s,)) for s in shares]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(items) / (time.perf_counter() - t0)


def bench_encoder(name: str, n: int, clients: int, rng) -> dict:
    model = registry.load(name)
    items = [model.encode(s) for s in _sentences(n, rng)]
    one = BatchingEngine(model.run, BatchConfig(max_batch=1, max_wait_ms=0), name="one")
    dyn = BatchingEngine(model.run, BatchConfig(max_batch=clients, max_wait_ms=2.0), name="dyn")
    try:
        _closed_loop(one, items[:clients], clients)  # warm up both paths
        _closed_loop(dyn, items[:clients], clients)
        rps_one = _closed_loop(one, items, clients)
        rps_dyn = _closed_loop(dyn, items, clients)
    finally:
        one.close()
        dyn.close()
    return {"model": name, "concurrency": clients, "requests": n, "one_at_a_time_rps": round(rps_one, 1),
            "dynamic_batching_rps": round(rps_dyn, 1), "speedup": round(rps_dyn / rps_one, 2),
            "mean_batch": round(dyn.stats.mean_batch, 1), "provider": model.provider}


def bench_lm(name: str, seqs: int, max_tokens: int, rng, device_kv: bool = False) -> dict:
    """Sequential vs continuous batching; ``device_kv``: instead, continuous batching with the KV cache
    through host memory vs kept on the provider's device."""
    model = registry.load(name)
    prompts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) for _ in range(seqs)]
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=i, stop_on_eos=False) for i in range(seqs)]
    out = {"model": name, "sequences": seqs, "max_tokens": max_tokens, "provider": model.provider}
    runs = ((("host_kv", seqs, False), ("device_kv", seqs, True)) if device_kv
            else (("sequential", 1, None), ("continuous_batching", seqs, None)))
    for label, max_batch, kv in runs:
        eng = LMEngine(model, LMEngineConfig(max_batch=max_batch, device_kv=kv))
        try:
            eng.generate(prompts[0], SamplingParams(max_tokens=4))  # warm-up
            t0 = time.perf_counter()
            handles = [eng.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
            tokens = sum(h.result().completion_tokens for h in handles)
            out[f"{label}_tokens_per_s"] = round(tokens / (time.perf_counter() - t0), 1)
        finally:
            eng.close()
    a, b = runs[0][0], runs[1][0]
    out["speedup"] = round(out[f"{b}_tokens_per_s"] / out[f"{a}_tokens_per_s"], 2)
    return out


def _median_us(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_overhead(enc_name: str, lm_name: str, n: int) -> dict:
    enc = registry.load(enc_name)
    item = enc.encode("how far is the nearest point of presence")
    feeds = pad_batch([item])
    eng = BatchingEngine(enc.run, BatchConfig(max_batch=32, max_wait_ms=0), name="overhead")
    try:
        bare = _median_us(lambda: enc.session.ort.run(None, feeds), n)
        engine = _median_us(lambda: eng.submit(item).result(), n)
    finally:
        eng.close()
    lm = registry.load(lm_name)
    steps = 32
    ids = [1, 2, 3, 4, 5, 6, 7, 8]

    def bare_decode():
        logits, past, mask = lm.prefill([ids])
        for i in range(steps):
            mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
            logits, past = lm.step(np.array([[int(np.argmax(logits[0]))]]), mask, np.array([[len(ids) + i]]), past)

    lm_eng = LMEngine(lm)
    try:
        bare_lm = _median_us(bare_decode, max(3, n // 50))
        gen = _median_us(lambda: lm_eng.generate(ids, SamplingParams(max_tokens=steps + 1, temperature=0,
                                                                        stop_on_eos=False)), max(3, n // 50))
    finally:
        lm_eng.close()
    return {"encoder_bare_run_us": round(bare, 1), "encoder_engine_us": round(engine, 1),
            "encoder_overhead_us": round(engine - bare, 1),
            "lm_bare_us_per_token": round(bare_lm / (steps + 1), 1),
            "lm_engine_us_per_token": round(gen / (steps + 1), 1),
            "lm_overhead_us_per_token": round((gen - bare_lm) / (steps + 1), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (for CI smoke runs)")
    # model names are checked here: an unknown one failed with a traceback after the first benchmarks had run
    encoders = [c.name for c in registry.list_models() if c.task in ("text-embeddings", "text-classification")]
    lms = [c.name for c in registry.list_models("text-generation")]
    ap.add_argument("--encoder", type=name_list(encoders, "encoder"), default="minilm-l6-v2,bert-tiny-embed",
                    help="comma-separated encoder models")
    ap.add_argument("--lm", choices=lms, default="gpt2-tiny")
    ap.add_argument("--kv-lm", choices=lms, default="gpt2-small",
                    help="model for the device-resident KV cache comparison")
    args = ap.parse_args()
    lm, kv_lm = args.lm, args.kv_lm
    rng = np.random.default_rng(0)
    n_req, max_tokens, n_calls = (320, 32, 100) if args.quick else (1280, 64, 400)
    results = {
        "encoder_dynamic_batching": [bench_encoder(name, n_req, 32, rng) for name in args.encoder],
        "lm_continuous_batching": bench_lm(lm, 16, max_tokens, rng),
        "lm_device_kv": bench_lm(kv_lm, 8, max_tokens, rng, device_kv=True),
        "engine_overhead": bench_overhead(args.encoder[0], lm, n_calls),
    }
    for key, value in results.items():
        print(f"{key}: {value}")
    print(json_line(results))


if __name__ == "__main__":
    main()
