"""``edgepop estimate``: capacity calculator — prefill and decode times, memory fit and requests/s of one replica.

Everything comes from the calibrated roofline (:class:`controlplane.perf.Roofline`, constants fitted to published
measurements by ``python -m controlplane.perf_calibration``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys

GB = 1e9


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="capacity calculator: prefill/decode ms, memory fit, requests/s of a replica",
                       description="Estimate one replica of a catalog model on a GPU type with the calibrated "
                                   "roofline: time to first token, decode time per step, tokens/s, memory per GPU, "
                                   "the bottleneck and requests/s.")
    p.add_argument("--model", required=True, help="catalog model id, e.g. @cf/meta/llama-3.1-8b-instruct")
    p.add_argument("--gpu", required=True, help="GPU type from the topology's GPU table, e.g. H100, A100-80GB, L4")
    p.add_argument("--tp", type=int, default=None, help="GPUs per replica (tensor parallel; default: the catalog's)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoding together (default 1)")
    p.add_argument("--prompt-tokens", type=float, default=None, help="prompt tokens per request (default 512); "
                   "for image models images (default 1), for speech models audio minutes, fractions allowed "
                   "(default 1; 0.5 is a 30 s clip)")
    # (language-model-only flags default to None: given to an image or speech model, they are refused, not ignored)
    p.add_argument("--output-tokens", type=int, default=None,
                   help="generated tokens per request (default 128; language models only)")
    p.add_argument("--context", type=float, default=None,
                   help="KV tokens per sequence at the decode step, at least the prompt's (default: prompt + "
                        "output/2; language models only)")
    p.add_argument("--precision", default=None,
                   help="serve at another weight precision (fp32|bf16|fp16|fp8|int8|int4; '-wo' suffix forces "
                        "weight-only, e.g. int8-wo); default: the catalog's")
    p.add_argument("--kv-precision", default=None,
                   help="KV-cache precision (default: the catalog's; language models only)")
    p.add_argument("--engine", default="default", help="engine profile from perf_params.json (default: default); "
                   "image models are priced with the image-server profile whatever this says")
    p.add_argument("--catalog", default=None, help="another catalog TOML (default: the shipped one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _spec(args):
    from controlplane.catalog import Catalog, default_catalog
    from edgepop.errors import UserError

    catalog = Catalog.load(args.catalog) if args.catalog else default_catalog()
    if args.model not in catalog:
        close = difflib.get_close_matches(args.model, catalog.ids, n=4, cutoff=0.3)
        close += [i for i in catalog.ids if args.model.lower() in i.lower() and i not in close]
        hint = f"; close: {', '.join(close[:4])}" if close else f"; e.g. {', '.join(catalog.ids[:3])}"
        raise UserError(f"unknown model {args.model!r} ({len(catalog)} models in {catalog.source}{hint})")
    return catalog[args.model]


def _prompt_size(spec, given: float | None) -> float | int:
    """``--prompt-tokens`` in the model's unit: whole tokens or images (default 512 / 1), or minutes of audio, a
    fraction allowed (default 1)."""
    from edgepop.errors import UserError

    if spec.unit == "audio-minute":
        value = 1.0 if given is None else given
        if not 1 / 60 <= value <= 100_000:  # (NaN fails too)
            raise UserError(f"--prompt-tokens is audio minutes for {spec.id}: from 1/60 (one second) to 100,000, "
                            f"got {value:g}")
        return value
    value = (1 if spec.unit == "image" else 512) if given is None else given
    if not (1 <= value <= 100_000_000 and float(value).is_integer()):
        what = "images" if spec.unit == "image" else "tokens"
        raise UserError(f"--prompt-tokens must be a whole number of {what} from 1 to 100,000,000, got {value:g}")
    return int(value)


def estimate(args) -> dict:
    """The estimate as a plain dict (what ``--json`` prints)."""
    from controlplane import perf_arch
    from controlplane.perf import Roofline, capacity_rps, with_precision
    from controlplane.perf_coverage import estimate_warnings
    from edgepop.errors import UserError
    from topology.world import Topology

    # (no engine batches more; a larger count would only exhaust memory)
    for name, most in (("batch", 100_000), ("output_tokens", 100_000_000)):
        if getattr(args, name) is not None and not 1 <= getattr(args, name) <= most:
            raise UserError(f"--{name.replace('_', '-')} must be an integer from 1 to {most:,}, got "
                            f"{getattr(args, name)}")
    if args.context is not None and not 0 <= args.context < float("inf"):  # (NaN fails too)
        raise UserError(f"--context must be a number of tokens >= 0, got {args.context}")
    weight_only = False
    spec = _spec(args)
    if spec.unit != "token":
        for flag, value in (("--output-tokens", args.output_tokens), ("--context", args.context),
                            ("--kv-precision", args.kv_precision)):
            if value is not None:
                kind = "an image" if spec.unit == "image" else "a speech"
                shown = f"{value:g}" if isinstance(value, float) else value
                raise UserError(f"{flag} {shown}: applies to language models only; {spec.id} is {kind} model "
                                "(no output tokens, no KV cache)")
    args.output_tokens = 128 if args.output_tokens is None else args.output_tokens
    args.prompt_tokens = _prompt_size(spec, args.prompt_tokens)
    if spec.unit == "token" and args.context is not None and args.context < args.prompt_tokens:
        raise UserError(f"--context {args.context:g} is less than --prompt-tokens {args.prompt_tokens}: a decode "
                        "step's context holds at least the prompt")
    if args.precision:
        base, weight_only = perf_arch.split_precision(args.precision)
        spec = with_precision(spec, base)
    spec = with_precision(spec, kv_precision=args.kv_precision)
    if spec.unit == "token":  # a request past the window is refused (or cut) by any server: nothing to estimate
        whole = args.prompt_tokens + (args.output_tokens if spec.generative else 0)
        if whole > spec.context_window or (args.context or 0) > spec.context_window:
            what = (f"--context {args.context:g}" if (args.context or 0) > spec.context_window else
                    f"--prompt-tokens {args.prompt_tokens}" + (f" + --output-tokens {args.output_tokens} = {whole}"
                                                               if spec.generative else ""))
            raise UserError(f"{what} tokens exceed the context window of {spec.id} ({spec.context_window} tokens)")
    model = Roofline.from_topology(Topology.load(), engine=args.engine)
    g = model.gpu(args.gpu)
    if args.tp is not None and args.tp > 1 and spec.heads and spec.heads % int(args.tp):
        raise UserError(f"{spec.id}: tp {args.tp} does not divide its {spec.heads} attention heads"
                        + _tp_hint(model, spec, args.gpu, weight_only))
    tp = model.check_tp(spec, args.tp)
    wo = {"tp": tp, "weight_only": weight_only}
    p_tok, o_tok, batch = args.prompt_tokens, args.output_tokens, args.batch
    gen = spec.generative
    # a decode step at --context C holds C tokens per sequence: the KV the batch needs is the larger of the two
    seq_tokens = max(p_tok + o_tok, args.context or 0)
    seq_kv = spec.kv_footprint(seq_tokens)  # full-layer equivalents: a sliding window's local layers hold less
    kv_tokens = batch * seq_kv if gen else 0
    mem = model.memory_per_gpu(spec, args.gpu, kv_tokens=kv_tokens, **wo)
    weights_only = mem["weights_bytes"] + mem["overhead_bytes"]
    if weights_only > g.memory_bytes:
        raise UserError(f"tp {tp} does not fit {spec.id} on {args.gpu}: weights need "
                        f"{weights_only / GB:.1f} GB per GPU, the GPU has {g.memory_bytes / GB:.0f} GB"
                        + _tp_hint(model, spec, args.gpu, weight_only, above=tp))
    free = g.memory_bytes - weights_only
    per_seq = seq_kv * spec.kv_bytes_per_token * model._kv_replication(spec, tp) / tp if gen else 0
    pre = model.prefill_breakdown(spec, args.gpu, [p_tok], **wo)
    out = {"model": spec.id, "gpu": args.gpu, "tp": tp, "gpus": tp, "precision": spec.precision,
           "kv_precision": spec.kv_precision if gen else None,
           "execution": model.scheme(spec, args.gpu, weight_only).note, "engine": model.engine_for(spec),
           "unit": spec.unit, "batch": batch, "prompt_tokens": p_tok, "output_tokens": o_tok if gen else 0,
           "prefill_ms": round(pre.total_ms, 3),
           "prefill_batch_ms": round(model.prefill_batch_ms(spec, args.gpu, [p_tok] * batch, **wo), 3),
           "bottleneck": {"prefill": pre.bottleneck}, "breakdown_ms": {"prefill": _parts(pre)}}
    if gen:
        context = args.context if args.context is not None else p_tok + o_tok / 2
        dec = model.decode_breakdown(spec, args.gpu, batch, context, **wo)
        step = dec.total_ms
        out.update({"context": context, "decode_ms_per_step": round(step, 3), "decode_ms_per_token": round(step, 3),
                    "decode_tokens_per_s_per_seq": round(1e3 / step, 2),
                    "decode_tokens_per_s": round(batch * 1e3 / step, 2),
                    "request_latency_ms": round(pre.total_ms + (o_tok - 1) * step, 1)})
        out["bottleneck"]["decode"] = dec.bottleneck
        out["breakdown_ms"]["decode"] = _parts(dec)
    else:
        out.update({"context": None, "decode_ms_per_step": None, "decode_ms_per_token": None,
                    "decode_tokens_per_s_per_seq": None, "decode_tokens_per_s": None,
                    "request_latency_ms": round(pre.total_ms, 1)})
    out["memory_per_gpu"] = {"weights_gb": round(mem["weights_bytes"] / GB, 3),
                             "kv_cache_gb": round(mem["kv_bytes"] / GB, 3),
                             "runtime_overhead_gb": round(mem["overhead_bytes"] / GB, 3),
                             "total_gb": round(mem["total_bytes"] / GB, 3),
                             "gpu_memory_gb": round(g.memory_bytes / GB, 1), "fits": bool(mem["fits"]),
                             "max_sequences_in_kv": int(free // per_seq) if per_seq else None}
    # capacity_rps runs the batch the simulator's replica would: no more sequences than the catalog's KV pool per
    # replica holds (what the simulator gives a replica), whatever else the GPU's memory could hold
    cap_batch = batch
    if gen and spec.kv_pool_tokens:
        cap_batch = max(1, min(batch, int(spec.kv_pool_tokens // spec.kv_charge(max(p_tok + o_tok, 1)))))
    out["kv_pool_tokens"] = int(spec.kv_pool_tokens) if gen and spec.kv_pool_tokens else None
    out["capacity_batch"] = cap_batch
    # (the memory above is for --batch sequences; capacity runs cap_batch of them, which must fit in turn)
    cap_fits = model.memory_per_gpu(spec, args.gpu, kv_tokens=cap_batch * spec.kv_footprint(p_tok + o_tok) if gen else 0, **wo)["fits"]
    out["capacity_rps_per_replica"] = (round(capacity_rps(model, spec, args.gpu, p_tok, o_tok, batch=batch, **wo), 3)
                                       if cap_fits else None)
    # dimensions outside the calibration's reference rows (the figures are the same either way)
    out["warnings"] = estimate_warnings(spec, g, tp, model.scheme(spec, args.gpu, weight_only), batch, p_tok,
                                        out["context"])
    return out


def _tp_hint(model, spec, gpu, weight_only, above: int = 0) -> str:
    """The error's hint: the smallest tensor-parallel degree above ``above`` whose weights fit, if any up to 16."""
    need = next((t for t in (1, 2, 4, 8, 16) if t > above and _fits_weights(model, spec, gpu, t, weight_only)), None)
    return f"; --tp {need} fits" if need else "; no tensor-parallel degree up to 16 fits"


def _fits_weights(model, spec, gpu, tp, weight_only) -> bool:
    from edgepop.errors import UserError

    try:
        mem = model.memory_per_gpu(spec, gpu, tp=tp, kv_tokens=0, weight_only=weight_only)
    except UserError:  # tp does not divide the heads
        return False
    return mem["fits"]


def _parts(t) -> dict:
    return {"compute": round(t.compute_ms, 3), "memory": round(t.memory_ms, 3), "interconnect": round(t.comm_ms, 3),
            "overhead": round(t.overhead_ms, 3), "total": round(t.total_ms, 3)}


def run(args: argparse.Namespace) -> int:
    est = estimate(args)
    if args.json:
        print(json.dumps(est, indent=2))
        return 0
    from rich.table import Table

    from edgepop.console import table_console

    unit = {"token": "tokens", "image": "images", "audio-minute": "audio minutes"}[est["unit"]]
    t = Table(title=f"{est['model']} on {est['tp']} x {est['gpu']} ({est['precision']}, {est['engine']} engine)")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row(f"prefill, 1 request of {est['prompt_tokens']} {unit}", f"{est['prefill_ms']:.1f} ms")
    t.add_row(f"prefill, {est['batch']} requests together", f"{est['prefill_batch_ms']:.1f} ms")
    if est["decode_ms_per_step"] is not None:
        t.add_row(f"decode step, batch {est['batch']}, context {est['context']:.0f}",
                  f"{est['decode_ms_per_step']:.2f} ms/token")
        t.add_row("decode tokens/s per sequence", f"{est['decode_tokens_per_s_per_seq']:.1f}")
        t.add_row("decode tokens/s, whole batch", f"{est['decode_tokens_per_s']:.1f}")
        t.add_row(f"one request ({est['output_tokens']} output tokens)", f"{est['request_latency_ms']:.0f} ms")
    m = est["memory_per_gpu"]
    t.add_row("memory per GPU (weights + KV + runtime)",
              f"{m['weights_gb']:.1f} + {m['kv_cache_gb']:.1f} + {m['runtime_overhead_gb']:.1f} = "
              f"{m['total_gb']:.1f} / {m['gpu_memory_gb']:.0f} GB ({'fits' if m['fits'] else 'DOES NOT FIT'})")
    t.add_row("bottleneck", ", ".join(f"{k}: {v}" for k, v in est["bottleneck"].items()))
    if est["capacity_rps_per_replica"] is None:
        t.add_row("capacity per replica", "none: it does not fit")
    else:
        note = (f" (batch {est['capacity_batch']}: the catalog's KV pool of {est['kv_pool_tokens']:,} tokens per "
                "replica holds no more such sequences)" if est["capacity_batch"] < est["batch"] else "")
        t.add_row("capacity per replica", f"{est['capacity_rps_per_replica']:.2f} requests/s{note}")
    console = table_console()
    console.print(t)
    console.print(f"execution: {est['execution']}")
    for line in est["warnings"]:
        print(f"warning: extrapolation: {line}", file=sys.stderr)
    return 0
