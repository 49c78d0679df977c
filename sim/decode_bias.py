"""How short the engine's kept decode step time makes a long, steady decode (a documented bias, docs/simulate.md).

The engine times a decode step when the batch changes and keeps that time while the context grows.
:func:`decode_bias` runs one :class:`~sim.engine.ReplicaEngine` with ``n`` identical sequences arriving together (one
batch for the whole run) and compares its E2E with a reference that re-times every step at its real context.
Simulated, not timed: the figures depend on the service-time model only. ``benchmarks/decode_context_bias.py``
prints them; a test holds them to the documented values.
"""

from __future__ import annotations

import heapq

from edgepop.errors import UserError

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def decode_bias(gpu: str, n: int = 4, prompt: int = 100, output: int = 7000, perf=None) -> dict:
    """Simulated and step-by-step E2E (s) of ``n`` identical sequences decoding together on one ``gpu``."""
    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline, gpu_table
    from sim.engine import ReplicaEngine, Seq
    from topology.gpus import load_gpus

    spec = default_catalog()[LLAMA]
    if prompt + output > spec.context_window:  # no such sequence runs: the model's window holds prompt + output
        raise UserError(f"decode bias: prompt {prompt} + output {output} tokens is over {LLAMA}'s context window "
                        f"of {spec.context_window:,}")
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
