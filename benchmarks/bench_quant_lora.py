"""Live int8 quantization and LoRA figures on this machine's CPU; the last line printed is one JSON object.

1. int8 (``edgepop quantize``): file size fp32 vs int8, median latency speed-up (interleaved runs, one
   intra-op thread), drift -- MiniLM embedding cosine, GPT-2 logit error and top-1 agreement, ResNet
   (static QDQ) logit error and top-1 agreement.
2. LoRA (``edgepop lora-check``): logit max-abs error of the in-graph path vs the numpy reference, effect
   vs the base, and the decode-step cost of serving 8 different adapters in one batch vs the plain base.

Usage: ``python benchmarks/bench_quant_lora.py [--quick] [--models minilm-l6-v2,gpt2-tiny,...] [--repeats N]``
(``--quick``: tiny models and 5 repeats, unless ``--models`` or ``--repeats`` say otherwise)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from dataplane import lora, quantize, registry
from dataplane.lora_check import run_check
from dataplane.models import gpt2
from dataplane.runtime import LanguageModel
from dataplane.session import SessionConfig
from edgepop.argtypes import json_line, name_list, positive_int

DEFAULT_MODELS = "minilm-l6-v2,gpt2-tiny,gpt2-small,resnet-tiny,resnet-small"
QUICK_MODELS = "minilm-l6-v2,gpt2-tiny,resnet-tiny"


def lora_serving_cost(batch: int = 8, rank: int = 16, repeats: int = 30, context: int = 64) -> dict:
    """Median decode-step ms: plain base graph vs the LoRA graph with ``batch`` distinct adapters."""
    spec = gpt2.PRESETS["tiny"]
    rng = np.random.default_rng(0)
    w = gpt2.random_weights(spec, rng)
    config = SessionConfig(provider="cpu", intra_op_threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "base.onnx"
        onnx.save(gpt2.build_graph(spec, w), str(path))
        base = LanguageModel("base", spec, path, config)
        multi = lora.LoraLanguageModel("bench", spec, path, config)
        multi.adapters = [lora.random_adapter(spec, rank, 2.0 * rank, rng, name=f"a{i}") for i in range(batch)]
        int8 = quantize.int8_copy(multi, Path(tmp) / "lora.int8.onnx", "gpt2")  # int8 base, fp32 side path
        drift = _int8_lora_drift(multi, int8)
        ids = rng.integers(0, spec.vocab_size, (batch, context))
        step = (ids[:, :1], np.ones((batch, context + 1), np.int64), np.full((batch, 1), context, np.int64))
        runs = {"base": (base, base.prefill([list(r) for r in ids])[1]),
                "lora": (multi, multi.prefill([list(r) for r in ids])[1]),
                "int8_lora": (int8, int8.prefill([list(r) for r in ids])[1])}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for k, (m, past) in runs.items():
                t0 = time.perf_counter()
                m.step(*step, past)
                times[k].append((time.perf_counter() - t0) * 1e3)
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "rank": rank, "context": context, "decode_ms_base": ms["base"],
            "decode_ms_8_adapters": ms["lora"], "overhead": ms["lora"] / ms["base"],
            "decode_ms_8_adapters_int8_base": ms["int8_lora"], "int8_lora": drift}


def _int8_lora_drift(fp32, int8) -> dict:
    """int8-base + LoRA vs fp32 + LoRA on the drift sentences, each row with its own adapter."""
    ids = np.array([fp32.tokenizer.encode(s)[:40] for s in quantize.SENTENCES[: len(fp32.adapters)]], np.int64)
    f, q = quantize.lm_position_logits(fp32, ids), quantize.lm_position_logits(int8, ids)
    return {"logit_rel_l2": float(np.linalg.norm(q - f) / np.linalg.norm(f)),
            "top1_agreement": float((q.argmax(-1) == f.argmax(-1)).mean())}


def options(argv: list[str] | None = None) -> tuple[list[str], int]:
    """(Models to quantize, repeats) from the command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny models ({QUICK_MODELS}) and 5 repeats, unless --models / --repeats are given")
    # the families quantize_and_measure supports, checked before any model is built
    known = [c.name for c in registry.list_models() if c.family in ("gpt2", "bert", "resnet")]
    ap.add_argument("--models", type=name_list(known, "model"), default=None,
                    help=f"comma-separated models to quantize (default {DEFAULT_MODELS})")
    ap.add_argument("--repeats", type=positive_int, default=None, help="timed repeats (default 30)")
    args = ap.parse_args(argv)
    # --quick only changes the defaults: an explicit --models or --repeats was silently replaced by them
    models = args.models or (QUICK_MODELS if args.quick else DEFAULT_MODELS).split(",")
    repeats = args.repeats or (5 if args.quick else 30)
    return models, repeats


def main() -> None:
    models, repeats = options()
    results: dict = {"quant": {}, "lora": {}}
    with tempfile.TemporaryDirectory() as out:
        for name in models:
            fig = quantize.quantize_and_measure(name, out, repeats=repeats)
            fig.pop("int8_path")
            results["quant"][name] = fig
            print(f"{name}: {fig['fp32_bytes'] / 1e6:.1f} MB -> {fig['int8_bytes'] / 1e6:.1f} MB, "
                  f"speed-up {fig['speedup']:.2f}x", file=sys.stderr)
        if "gpt2-small" in models:  # the other side of the trade-off: tied LM head left in fp32
            fig = quantize.quantize_and_measure("gpt2-small", out, repeats=repeats, fold_transposes=False)
            fig.pop("int8_path")
            results["quant"]["gpt2-small/tied-head-fp32"] = fig
    for rank in (8, 32):
        r = run_check("tiny", rank, 2.0 * rank, seed=rank)
        results["lora"][f"rank{rank}"] = {k: r[k] for k in ("lora_vs_numpy_max_abs", "lora_vs_base_max_abs",
                                                             "mixed_batch_max_abs", "merged_vs_numpy_max_abs",
                                                             "top1_changed_frac", "adapter_bytes")}
    results["lora"]["serving"] = lora_serving_cost(repeats=repeats)
    print(json_line(results))


if __name__ == "__main__":
    main()
