"""Write the synthetic Mooncake-format example trace shipped as ``sim/data/mooncake_style_synthetic.jsonl``.

No real Mooncake trace ships with edgepop; this file is made by edgepop's own workload generator (multi-turn chat
sessions on one LLM, 512-token prefix blocks) so that the Mooncake reader, replay and prefix-cache code have a
small example in the exact JSONL format of github.com/kvcache-ai/Mooncake traces. Deterministic (seed below)::

    python scripts/make_mooncake_example.py
"""

from __future__ import annotations

from sim.traces import MOONCAKE_BLOCK_TOKENS, MOONCAKE_EXAMPLE, write_mooncake_trace
from sim.workload import generate
from sim.workload_config import WorkloadConfig
from topology import Topology

SEED = 2024
EXAMPLE = {"requests": 400, "rps": 1.0, "diurnal": False, "mix": {"@cf/meta/llama-3.1-8b-instruct": 1.0},
           "session_fraction": 0.7, "session_turns": 4.0, "think_time_s": 20.0,
           "block_tokens": MOONCAKE_BLOCK_TOKENS}


def main() -> None:
    w = generate(WorkloadConfig.from_dict(EXAMPLE, where="make_mooncake_example"), Topology.load(), rng=SEED)
    write_mooncake_trace(w.requests, MOONCAKE_EXAMPLE)
    print(f"wrote {len(w)} requests to {MOONCAKE_EXAMPLE}")


if __name__ == "__main__":
    main()
