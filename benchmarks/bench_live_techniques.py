"""Live serving techniques on real ONNX compute; the last line printed is one JSON object.

1. Prefix KV reuse: time to first token (TTFT) of requests sharing a ~400-token prefix (a long system prompt)
   with distinct ~20-token suffixes, on an LM engine with and without the prefix cache (cache warmed by one
   earlier request, as a second user of the same system prompt would find it).
2. Speculative decoding: greedy decode wall time of the Net2Net target alone vs with the ``tiny`` draft
   proposing ``k`` tokens per round; acceptance rate per ``k``; output equality is checked on every run.

Usage: ``python benchmarks/bench_live_techniques.py [--quick] [--lm gpt2-tiny] [--noise 0.15]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dataplane import registry
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.prefix_cache import PrefixCacheConfig
from dataplane.sampling import SamplingParams
from dataplane.session import SessionConfig
from dataplane.speculative import _call, generate_greedy, generate_speculative, load_pair
from edgepop.argtypes import json_line, non_negative_float, positive_int
from edgepop.rng import seed_arg


def _ttft(engine: LMEngine, prompt: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    res = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0, stop_on_eos=False), timeout=120)
    return time.perf_counter() - t0, res.cached_tokens  # with max_tokens=1, completion == first token


def bench_prefix(lm_name: str, reps: int, rng: np.random.Generator) -> dict:
    lm = registry.load(lm_name, SessionConfig(allow_spinning=False))
    vocab = min(256, lm.spec.vocab_size)
    shared = rng.integers(0, vocab, 400).tolist()
    prompts = [shared + rng.integers(0, vocab, 20).tolist() for _ in range(reps + 1)]
    plain = LMEngine(lm, LMEngineConfig(max_batch=4))
    cached = LMEngine(lm, LMEngineConfig(max_batch=4, prefix_cache=PrefixCacheConfig(16, 64 << 20)))
    try:
        for e in (plain, cached):
            _ttft(e, prompts[0])  # warm-up; fills the cache with the shared prefix
        t_plain, t_cached, n_cached = [], [], []
        for p in prompts[1:]:
            t_plain.append(_ttft(plain, p)[0])
            dt, n = _ttft(cached, p)
            t_cached.append(dt)
            n_cached.append(n)
        same = all(plain.generate(p, SamplingParams(max_tokens=8, temperature=0)).token_ids
                   == cached.generate(p, SamplingParams(max_tokens=8, temperature=0)).token_ids for p in prompts[1:3])
    finally:
        plain.close()
        cached.close()
    a, b = statistics.median(t_plain), statistics.median(t_cached)
    return {"model": lm_name, "prompt_tokens": len(prompts[1]), "shared_prefix_tokens": 400,
            "cached_tokens": min(n_cached), "ttft_ms_no_cache": round(a * 1e3, 2),
            "ttft_ms_cache": round(b * 1e3, 2), "ttft_speedup": round(a / b, 2), "outputs_identical": same}


def _call_ms(model, n_new: int, past) -> float:
    """Median ms of one call feeding ``n_new`` tokens after ``past``."""
    ts = []
    for _ in range(9):
        t0 = time.perf_counter()
        _call(model, list(range(n_new)), past)
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1e3, 2)


def bench_speculative(ks: list[int], n_prompts: int, max_tokens: int, noise: float, depth: int,
                      rng: np.random.Generator) -> dict:
    target, draft = load_pair(depth=depth, noise=noise)
    prompts = [rng.integers(0, 256, 32).tolist() for _ in range(n_prompts)]
    generate_greedy(target, prompts[0], 8)  # warm both sessions
    generate_greedy(draft, prompts[0], 8)

    # Interleaved per prompt (plain, then each k), so drifting load on a shared machine hits all alike.
    runs = {"draft": lambda p: generate_greedy(draft, p, max_tokens),
            "plain": lambda p: generate_greedy(target, p, max_tokens),
            **{k: (lambda p, k=k: generate_speculative(target, draft, p, k=k, max_tokens=max_tokens)) for k in ks}}
    secs, outs = dict.fromkeys(runs, 0.0), {name: [] for name in runs}
    for p in prompts:
        for name, fn in runs.items():
            t0 = time.perf_counter()
            outs[name].append(fn(p))
            secs[name] += time.perf_counter() - t0
    t_plain, t_draft, want = secs["plain"], secs["draft"], outs["plain"]
    out = {"target_params_m": round(target.spec.n_params() / 1e6, 1), "draft_params_m": round(draft.spec.n_params() / 1e6, 1),
           "noise": noise, "depth": depth, "tokens": max_tokens * n_prompts,
           "target_ms_per_token": round(t_plain / (max_tokens * n_prompts) * 1e3, 3),
           "draft_ms_per_token": round(t_draft / (max_tokens * n_prompts) * 1e3, 3), "per_k": {}}
    _, past = _call(target, prompts[0], target.empty_past(1))
    out["target_call_ms_by_new_tokens"] = {str(n): _call_ms(target, n, past) for n in [1] + [k + 1 for k in ks]}
    for k in ks:
        res = outs[k]
        acc = sum(r.accepted for r in res)
        out["per_k"][str(k)] = {
            "speedup": round(t_plain / secs[k], 2),
            "acceptance": round(acc / sum(r.proposed for r in res), 3),
            "agreement": round(acc / (acc + sum(r.rejections for r in res)), 3),
            "tokens_per_target_call": round(sum(len(r.token_ids) for r in res) / sum(r.rounds + 1 for r in res), 2),
            "identical_to_greedy": all(r.token_ids == w for r, w in zip(res, want, strict=True))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--lm", choices=[c.name for c in registry.list_models("text-generation")], default="gpt2-tiny",
                    help="LM for the prefix-cache TTFT benchmark")
    ap.add_argument("--noise", type=non_negative_float, default=0.2,
                    help="Net2Net target noise (lower: higher acceptance)")
    ap.add_argument("--depth", type=positive_int, default=2, help="Net2Net target blocks per draft block")
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    prefix = bench_prefix(args.lm, 4 if args.quick else 10, rng)
    print(f"prefix cache ({args.lm}): TTFT {prefix['ttft_ms_no_cache']} ms -> {prefix['ttft_ms_cache']} ms "
          f"(x{prefix['ttft_speedup']}), {prefix['cached_tokens']} of {prefix['prompt_tokens']} tokens cached",
          flush=True)
    spec = bench_speculative([1, 2, 4, 6], 2 if args.quick else 4, 32 if args.quick else 64, args.noise, args.depth, rng)
    for k, r in spec["per_k"].items():
        print(f"speculative k={k}: x{r['speedup']} acceptance {r['acceptance']} agreement {r['agreement']} "
              f"identical={r['identical_to_greedy']}", flush=True)
    print(json_line({"prefix_cache": prefix, "speculative": spec}))


if __name__ == "__main__":
    main()
