"""``edgepop lora-check`` and ``edgepop quantize``: the live LoRA and int8 serving techniques."""

from __future__ import annotations

import argparse
import json
import math

from edgepop.rng import seed_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``lora-check`` and ``quantize`` to the ``edgepop`` parser."""
    p = subparsers.add_parser(
        "lora-check", help="run a LoRA adapter in the ONNX LM and compare logits with a numpy reference",
        description="Build a GPT-2 base from code and a seeded (or given) adapter; print max-abs logit "
        "differences of the in-graph LoRA path vs the float64 numpy reference and vs the base model.")
    p.add_argument("--preset", default="tiny", help="GPT-2 preset of the base (default tiny)")
    p.add_argument("--rank", type=int, default=None, help="rank of the seeded adapter (1..32; default 8)")
    p.add_argument("--alpha", type=float, default=None, help="alpha of the seeded adapter (default 16)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of base weights, adapter and tokens")
    p.add_argument("--adapter", default=None, help="an adapter .npz to validate and run instead")
    p.set_defaults(func=run_lora_check)

    q = subparsers.add_parser(
        "quantize", help="int8-quantize a registered model and report size, speed-up and output drift",
        description="Dynamic int8 (MatMul/Gather weights) for LMs and encoders, static QDQ with a seeded "
        "calibration set for ResNet; writes the int8 .onnx to --out and prints the figures as JSON.")
    q.add_argument("model", help="registered model name, e.g. minilm-l6-v2, gpt2-tiny, resnet-tiny")
    q.add_argument("--out", required=True, help="directory for the int8 model")
    q.add_argument("--repeats", type=int, default=20, help="timed runs per variant (median is reported)")
    q.add_argument("--threads", type=int, default=1, help="intra-op threads for the timing (default 1)")
    q.add_argument("--keep-tied-head", action="store_true",
                   help="do not fold constant Transposes (GPT-2's tied LM head then stays fp32: smaller file, "
                        "slower decode)")
    q.set_defaults(func=run_quantize)


def run_lora_check(args: argparse.Namespace) -> int:
    from dataplane import lora
    from dataplane.errors import InvalidInputError
    from dataplane.lora_check import run_check
    from dataplane.models import gpt2

    if args.preset not in gpt2.PRESETS:
        raise InvalidInputError(f"--preset '{args.preset}' is not one of {', '.join(gpt2.PRESETS)}")
    if args.adapter is not None and (args.rank is not None or args.alpha is not None):  # the file's own rule
        raise lora.AdapterError("--rank and --alpha shape the seeded adapter; --adapter brings its own")
    args.rank = 8 if args.rank is None else args.rank
    args.alpha = 16.0 if args.alpha is None else args.alpha
    if args.adapter is None and not 1 <= args.rank <= lora.MAX_RANK:
        raise lora.AdapterError(f"--rank {args.rank} must be in 1..{lora.MAX_RANK}")
    if args.adapter is None and not (math.isfinite(args.alpha) and 0 < args.alpha <= lora.MAX_ALPHA):
        raise lora.AdapterError(f"--alpha must be a finite number in (0, {lora.MAX_ALPHA:g}], got {args.alpha}")
    r = run_check(args.preset, args.rank, args.alpha, args.seed, args.adapter)
    print(f"adapter rank {r['rank']} alpha {r['alpha']:g} on {r['projections']} projections "
          f"({r['adapter_bytes']} bytes)")
    print(f"logit max-abs diff vs numpy reference (prefill + cached decode): {r['lora_vs_numpy_max_abs']:.3e}")
    print(f"logit max-abs diff vs base model: {r['lora_vs_base_max_abs']:.3e} "
          f"(logits up to {r['logit_max_abs']:.2f}; top-1 changed at {r['top1_changed_frac']:.0%} of positions)")
    print(f"mixed batch (base row + adapter row) vs numpy: {r['mixed_batch_max_abs']:.3e}; "
          f"baked: {r['baked_vs_numpy_max_abs']:.3e}; merged: {r['merged_vs_numpy_max_abs']:.3e}")
    print(json.dumps(r))
    return 0 if r["lora_vs_numpy_max_abs"] < 1e-4 else 1


def run_quantize(args: argparse.Namespace) -> int:
    from dataplane import quantize
    from edgepop.errors import UserError

    if not 1 <= args.repeats <= 10_000:  # (checked before the model is quantized and written)
        raise UserError(f"--repeats must be from 1 to 10,000 timed runs, got {args.repeats}")

    print(json.dumps(quantize.quantize_and_measure(args.model, args.out, repeats=args.repeats,
                                                   threads=args.threads,
                                                   fold_transposes=not args.keep_tied_head)))
    return 0
