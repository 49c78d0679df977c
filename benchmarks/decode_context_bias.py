"""The engine's decode step time is fixed between batch changes: how short does a long, steady decode come out?

One ReplicaEngine, Llama-3.1-8B, four sequences of 100 prompt + 7,000 output tokens arriving together (one batch
for the whole run, so the step time is set once, at a 100-token context). The reference re-times every step at
its real context (prefill + the sum of ``decode_step_ms(4, context)`` for each step). Simulated, not timed: the
figures depend on the service-time model only (docs/simulate.md quotes them).

Limitation: the reference prefills the four prompts in one batch, while the engine prefills the first sequence
alone (it finds the replica idle) and then the other three together, a few ms more on an H100 (about 50 ms on an
L4). At 7,000 output tokens that is under 0.1% of the E2E; at short outputs it is most of the difference, so a
small ``--output`` (10 tokens: about -8%) reports the prefill schedule, not the decode bias.

Run: python benchmarks/decode_context_bias.py [--gpus H100 L4] [--output 7000]. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json

from edgepop.argtypes import positive_int
from edgepop.errors import UserError
from sim.decode_bias import decode_bias


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", nargs="+", default=["H100", "L4"], help="GPU types (default: H100 L4)")
    ap.add_argument("--output", type=positive_int, default=7000, help="output tokens per sequence (default 7000)")
    args = ap.parse_args(argv)
    try:
        rows = [decode_bias(g, output=args.output) for g in args.gpus]
    except UserError as exc:  # an unknown GPU type or too long an output: one line naming the flag
        ap.error(f"{'--output' if 'context window' in str(exc) else '--gpus'}: {exc}")
    for r in rows:
        print(f"{r['gpu']}: simulated {r['simulated_s']} s, step by step {r['stepwise_s']} s, "
              f"{r['short_pct']}% short")
    print(json.dumps({"decode_context_bias": rows}))


if __name__ == "__main__":
    main()
