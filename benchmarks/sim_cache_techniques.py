"""Prefix caching and LoRA adapters on a small edge scenario: token hit ratio with and without prefix-aware
routing, adapter loads with and without adapter-aware routing (the figures in docs/techniques.md).

    python benchmarks/sim_cache_techniques.py [--requests N] [--rps R]

Runs the embedded ``small`` scenario's edge deployment only, with chat sessions (turns resend their history) on
Llama 3.1 8B and, for LoRA, half of its requests naming one of its catalog adapters (Zipf popularity).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import time

from edgepop.argtypes import json_line, positive_float, positive_int
from sim.run import run_scenario
from sim.scenario import load_scenario, with_overrides
from sim.techniques import Techniques

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def run(requests: int, rps: float, router: str, techniques: Techniques, adapter_fraction: float = 0.0) -> dict:
    sc = load_scenario("small")
    wl = {"requests": requests, "rps": rps, "mix": {LLAMA: 1.0}, "session_fraction": 0.8, "session_turns": 6.0,
          "think_time_s": 10.0, "adapter_fraction": adapter_fraction}
    sc = with_overrides(sc, workload=wl)
    sc.edge.router = router
    sc.techniques = techniques
    t0 = time.perf_counter()
    out = run_scenario(sc, deployments=("edge",))
    block = out.summary["deployments"]["edge"]
    return {"ttft_p50_ms": block["ttft_ms"]["p50"], "ttft_p95_ms": block["ttft_ms"]["p95"],
            "prefix_cache": block.get("prefix_cache"), "lora": block.get("lora"),
            "wall_s": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=positive_int, default=3000)
    ap.add_argument("--rps", type=positive_float, default=40.0, help="offered requests/s (default 40)")
    args = ap.parse_args()
    n, rps = args.requests, args.rps
    fig = {}
    for name, router, tech in [
        ("prefix_off", "nearest-with-capacity", Techniques()),
        ("prefix_nearest", "nearest-with-capacity", Techniques(prefix_cache=True)),
        ("prefix_p2c", "p2c", Techniques(prefix_cache=True)),
        ("prefix_aware", "prefix-aware", Techniques(prefix_cache=True)),
    ]:
        r = run(n, rps, router, tech)
        fig[name] = {"ttft_p50_ms": r["ttft_p50_ms"], "ttft_p95_ms": r["ttft_p95_ms"],
                     "token_hit_ratio": (r["prefix_cache"] or {}).get("token_hit_ratio", 0.0)}
        print(name, fig[name], flush=True)
    for name, routing in [("lora_unaware", False), ("lora_aware", True)]:
        r = run(n, rps, "p2c", Techniques(lora=True, lora_slots=2, lora_routing=routing), adapter_fraction=0.5)
        fig[name] = {"ttft_p50_ms": r["ttft_p50_ms"], "ttft_p95_ms": r["ttft_p95_ms"],
                     "adapter_loads": r["lora"]["adapter_loads"], "adapter_requests": r["lora"]["adapter_requests"],
                     "adapter_load_ms_mean": r["lora"]["adapter_load_ms"]}
        print(name, fig[name], flush=True)
    print(json_line({"requests": n, "rps": rps, **fig}))


if __name__ == "__main__":
    main()
