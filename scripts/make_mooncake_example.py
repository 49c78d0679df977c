"""Write the synthetic Mooncake-format example trace shipped as ``sim/data/mooncake_style_synthetic.jsonl``.

No real Mooncake trace ships with edgepop; this file is made by edgepop's own workload generator (multi-turn chat
sessions on one LLM, 512-token prefix blocks) so that the Mooncake reader, replay and prefix-cache code have a
small example in the exact JSONL format of github.com/kvcache-ai/Mooncake traces. Deterministic (seed below)::

    python scripts/make_mooncake_example.py out/mooncake_example.jsonl

The shipped file was written before a chat that outgrows its context window went on as a new chat (it lost that
turn then): run now, the script writes one more request and shifts the rest (400 rows either way, most block ids
renumbered). The shipped file is kept as it is, because the documented replays and figures (docs/fidelity.md,
docs/techniques.md) were measured on it: the script writes the current generator's version to the path it is
given, and overwrites the shipped file only with ``--replace-shipped``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.traces import MOONCAKE_BLOCK_TOKENS, MOONCAKE_EXAMPLE, write_mooncake_trace
from sim.workload import generate
from sim.workload_config import WorkloadConfig
from topology import Topology

SEED = 2024
EXAMPLE = {"requests": 400, "rps": 1.0, "diurnal": False, "mix": {"@cf/meta/llama-3.1-8b-instruct": 1.0},
           "session_fraction": 0.7, "session_turns": 4.0, "think_time_s": 20.0,
           "block_tokens": MOONCAKE_BLOCK_TOKENS}


def main() -> None:
    p = argparse.ArgumentParser(description="Write the synthetic Mooncake-format example trace (JSONL).")
    p.add_argument("path", help="file to write (the shipped example only with --replace-shipped)")
    p.add_argument("--replace-shipped", action="store_true",
                   help=f"allow overwriting the shipped {Path(MOONCAKE_EXAMPLE).name}, on which documented figures "
                   "were measured")
    args = p.parse_args()
    path = Path(args.path)
    if path.resolve() == Path(MOONCAKE_EXAMPLE).resolve() and not args.replace_shipped:
        p.error(f"{path} is the shipped example, on which documented figures were measured; pass "
                "--replace-shipped to overwrite it")
    if path.is_dir():
        p.error(f"{path} is a folder: give a file name")
    w = generate(WorkloadConfig.from_dict(EXAMPLE, where="make_mooncake_example"), Topology.load(), rng=SEED)
    write_mooncake_trace(w.requests, path)
    print(f"wrote {len(w)} requests to {path}")


if __name__ == "__main__":
    main()
