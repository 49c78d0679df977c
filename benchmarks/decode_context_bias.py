"""The engine's decode step time is fixed between batch changes: how short does a long, steady decode come out?

One ReplicaEngine, Llama-3.1-8B, four sequences of 100 prompt + 7,000 output tokens arriving together (one batch
for the whole run, so the step time is set once, at a 100-token context). The reference re-times every step at
its real context (prefill + the sum of ``decode_step_ms(4, context)`` for each step). Simulated, not timed: the
figures depend on the service-time model only (docs/simulate.md quotes them).

Run: python benchmarks/decode_context_bias.py [--gpus H100 L4] [--output 7000]. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import heapq
import json

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def decode_bias(gpu: str, n: int = 4, prompt: int = 100, output: int = 7000, perf=None) -> dict:
    """Simulated and step-by-step E2E (s) of ``n`` identical sequences decoding together on one ``gpu``."""
    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline, gpu_table
    from sim.engine import ReplicaEngine, Seq
    from topology.gpus import load_gpus

    spec = default_catalog()[LLAMA]
    perf = perf or Roofline(gpu_table(load_gpus()))  # the calibrated roofline, as the simulator's default
    timers: list = []
    ends: list = []
    eng = ReplicaEngine(spec, gpu, perf, lambda e, t, v: heapq.heappush(timers, (t, v)), lambda s, t: None,
                        lambda s, t: ends.append(t))
    for i in range(n):
        eng.join(Seq(i, prompt, output), 0.0)
    while timers:
        t, v = heapq.heappop(timers)
        eng.wake(t, v)
    simulated = max(ends)
    prefill = perf.prefill_batch_ms(spec, gpu, [prompt] * n) / 1e3
    # token k (k = 2..output) is made by a step over contexts of prompt + k - 1 tokens
    steps = sum(perf.decode_step_ms(spec, gpu, n, float(prompt + k - 1)) for k in range(2, output + 1)) / 1e3
    exact = prefill + steps
    return {"gpu": gpu, "simulated_s": round(simulated, 2), "stepwise_s": round(exact, 2),
            "short_pct": round(100.0 * (exact - simulated) / exact, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", nargs="+", default=["H100", "L4"])
    ap.add_argument("--output", type=int, default=7000)
    args = ap.parse_args()
    rows = [decode_bias(g, output=args.output) for g in args.gpus]
    for r in rows:
        print(f"{r['gpu']}: simulated {r['simulated_s']} s, step by step {r['stepwise_s']} s, "
              f"{r['short_pct']}% short")
    print(json.dumps({"decode_context_bias": rows}))


if __name__ == "__main__":
    main()
