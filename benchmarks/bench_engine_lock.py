"""Do LM engines in one process slow each other beyond the cores they share? (the interpreter lock)

The live gateway runs every replica's engine as a thread of one Python process. Each decode step holds the
interpreter lock for its Python part (sampling, token delivery: about 7% of a gpt2-tiny step at batch 8 on one
core), so engines in one process queue for the lock as well as for cores. This measures a continuous-batching
engine's median decode step (``--batch`` rows, one intra-op thread, CPU) three ways, repeated ``--repeats``
times in one run: alone; beside ``--engines - 1`` others as threads of the same process; beside as many in
separate processes, started together. With no more engines than cores, threads minus processes is what the
shared lock costs.

    python benchmarks/bench_engine_lock.py [--model gpt2-tiny] [--batch 8] [--engines 2] [--tokens 96]

Last stdout line: one JSON object (median step ms of each arrangement over the repeats, and the ratios).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time

import numpy as np

from dataplane import registry
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.sampling import SamplingParams
from dataplane.session import SessionConfig
from edgepop.argtypes import json_line


def _load(name: str):
    return registry.load(name, SessionConfig(provider="cpu", intra_op_threads=1))


def median_step_ms(model, batch: int, tokens: int, rounds: int = 4) -> float:
    """Median wall time of the engine's decode steps over ``rounds`` batches of ``batch`` sequences."""
    eng = LMEngine(model, LMEngineConfig(max_batch=batch))
    steps: list[float] = []
    decode = eng._decode_step

    def timed() -> None:
        t0 = time.perf_counter()
        decode()
        steps.append(time.perf_counter() - t0)

    eng._decode_step = timed  # the engine thread's whole step: the model call and its Python part
    try:
        eng.generate("warm up", SamplingParams(max_tokens=4))
        steps.clear()
        for r in range(rounds):
            params = [SamplingParams(max_tokens=tokens, temperature=0.8, seed=i + 100 * r, stop_on_eos=False)
                      for i in range(batch)]
            handles = [eng.submit("the edge pop answers the request " * 2, p, on_token=lambda t, s: None)
                       for p in params]
            for h in handles:
                h.result()
    finally:
        eng.close()
    return float(np.median(steps)) * 1e3


def _child(name: str, batch: int, tokens: int, start, results) -> None:
    model = _load(name)
    start.wait()
    results.put(median_step_ms(model, batch, tokens))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=[c.name for c in registry.list_models("text-generation")], default="gpt2-tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.engines < 2 or args.batch < 1 or args.tokens < 2 or args.repeats < 1:
        ap.error("need --engines >= 2, --batch >= 1, --tokens >= 2, --repeats >= 1")
    model = _load(args.model)
    runs: dict[str, list[float]] = {"alone": [], "threads": [], "processes": []}
    for rep in range(args.repeats):
        runs["alone"].append(median_step_ms(model, args.batch, args.tokens))
        out: list[float] = []
        threads = [threading.Thread(target=lambda o=out: o.append(median_step_ms(model, args.batch, args.tokens)))
                   for _ in range(args.engines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        runs["threads"].append(float(np.mean(out)))
        ctx = mp.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_child, args=(args.model, args.batch, args.tokens, start, results))
                 for _ in range(args.engines)]
        for p in procs:
            p.start()
        time.sleep(5.0)  # let every child load its model before the common start
        start.set()
        vals = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        runs["processes"].append(float(np.mean(vals)))
        print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in runs.items()), flush=True)
    med = {k: round(float(np.median(v)), 3) for k, v in runs.items()}
    print(json_line({"benchmark": "engine_lock", "model": args.model, "batch": args.batch,
                      "engines": args.engines, "cores": os.cpu_count(), "repeats": args.repeats,
                      "step_ms": med, "runs_ms": {k: [round(x, 3) for x in v] for k, v in runs.items()},
                      "threads_vs_processes": round(med["threads"] / med["processes"], 3),
                      "processes_vs_alone": round(med["processes"] / med["alone"], 3)}))


if __name__ == "__main__":
    main()
