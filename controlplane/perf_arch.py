"""Arithmetic of one transformer forward pass: FLOPs and bytes moved, from a catalog entry's architecture.

Everything here is exact counting, no efficiency factors: :mod:`controlplane.perf` turns these counts into time.
Counts are for the whole replica; the roofline divides them over the tensor-parallel GPUs, except the
``replicated_bytes`` of layer norms and residual adds, which every GPU of a Megatron-style split does in full.

Conventions: a multiply-add is 2 FLOPs; "body" parameters are the matrices every token multiplies through (all
layers); the input embedding is a gather (no FLOPs, no streaming) and the LM head multiplies only the tokens that
emit a logit (the last prompt token of a prefill, every sequence of a decode step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.catalog import MLP_KINDS, PRECISION_BYTES, ModelSpec
from edgepop.errors import UserError

WEIGHT_ONLY_SUFFIX = "-wo"
ACTIVATION_BYTES = 2.0  # activations stay 16-bit whatever the weight format


@dataclass(frozen=True)
class Scheme:
    """How a precision executes on a GPU type.

    ``weight_bytes``: bytes per weight streamed from HBM; ``gemm_peak``: which dense peak the matrix units run at
    (``"flops8"`` for 8-bit tensor cores, else ``"flops16"``); ``weight_only``: weights are stored narrow and
    dequantised to 16 bit inside the kernel (no narrow tensor cores used), which costs streaming efficiency.
    """

    precision: str
    weight_bytes: float
    gemm_peak: str
    weight_only: bool
    note: str


def split_precision(text: str) -> tuple[str, bool]:
    """``"int8-wo"`` -> ``("int8", True)``: a ``-wo`` suffix forces weight-only execution."""
    forced = text.endswith(WEIGHT_ONLY_SUFFIX)
    base = text[: -len(WEIGHT_ONLY_SUFFIX)] if forced else text
    if base not in PRECISION_BYTES:
        raise UserError(f"unknown precision {text!r} (known: {', '.join(PRECISION_BYTES)}, each optionally with "
                        f"{WEIGHT_ONLY_SUFFIX!r} for weight-only execution)")
    if forced and PRECISION_BYTES[base] >= 2:  # (16- and 32-bit weights already run at their own width)
        raise UserError(f"precision {text!r}: weight-only execution applies to 8- and 4-bit weights (fp8, int8, "
                        f"int4), not {base}")
    return base, forced


def scheme(precision: str, has_fp8: bool, weight_only: bool = False) -> Scheme:
    """What real engines do with ``precision`` on a GPU with (or without) FP8 tensor cores.

    * fp8 on Hopper/Ada: W8A8 FP8 GEMMs at the 8-bit peak (TensorRT-LLM, vLLM ``fp8``).
    * fp8 without FP8 tensor cores (A100, T4): weights stay 1 byte in HBM and are upcast to 16 bit in the GEMM
      (vLLM's FP8-Marlin weight-only path), so decode streams half the bytes but prefill runs at the 16-bit peak.
    * int8: W8A8 on INT8 tensor cores (SmoothQuant-style; every GPU in the table has them) unless forced weight-only.
    * int4: weight-only (AWQ/GPTQ, Marlin kernels): 0.5 byte per weight, 16-bit math.
    * fp32: TF32 tensor cores, taken as half the 16-bit peak (a GPU without them, Turing, on CUDA cores:
      :data:`controlplane.perf.FP32_SHARE`).
    """
    nbytes = PRECISION_BYTES[precision]
    if precision in ("bf16", "fp16"):
        return Scheme(precision, nbytes, "flops16", False, "16-bit tensor cores")
    if precision == "fp32":
        return Scheme(precision, nbytes, "flops32", False, "fp32 math (TF32 tensor cores where the GPU has them)")
    if precision == "int4" or weight_only:
        return Scheme(precision, nbytes, "flops16", True, f"{precision} weight-only: narrow weights, 16-bit math")
    if precision == "fp8" and not has_fp8:
        return Scheme(precision, nbytes, "flops16", True,
                      "no FP8 tensor cores: fp8 weights upcast to 16 bit (weight-only), 16-bit math")
    return Scheme(precision, nbytes, "flops8", False, f"{precision} W8A8 on 8-bit tensor cores")


def gated_mlp(spec: ModelSpec) -> bool:
    """Whether the MLP has a gate (3 matrices) or not (2): the catalog's ``mlp``, which the loader fills from
    :data:`controlplane.catalog.FAMILY_MLP` (and refuses to leave empty where the roofline needs it)."""
    if spec.mlp not in MLP_KINDS:
        raise UserError(f"{spec.id}: family {spec.family!r} has no known MLP kind: give the catalog entry "
                        f"mlp = \"gated\" or \"plain\"")
    return spec.mlp == "gated"


def body_params(spec: ModelSpec) -> float:
    """Parameters every token multiplies through: attention and MLP matrices of all layers.

    Derived from the architecture when the entry has it (heads, kv_heads, head_dim, intermediate); otherwise the
    whole parameter count minus the embedding table (encoders and vision/speech entries).
    """
    if spec.heads and spec.head_dim and spec.intermediate:
        q_o = 2 * spec.hidden * spec.heads * spec.head_dim
        k_v = 2 * spec.hidden * (spec.kv_heads or spec.heads) * spec.head_dim
        mlp = (3 if gated_mlp(spec) else 2) * spec.hidden * spec.intermediate
        return float(spec.layers * (q_o + k_v + mlp))
    return max(spec.parameters - spec.vocab * spec.hidden, 0.5 * spec.parameters)


def head_params(spec: ModelSpec) -> float:
    """The LM head (vocab x hidden) of a generative model; 0 for others."""
    return float(spec.vocab * spec.hidden) if spec.generative else 0.0


def kv_bytes_per_token(spec: ModelSpec) -> float:
    """KV cache bytes one token of context takes (the catalog entry's ``kv_bytes_per_token``)."""
    return spec.kv_bytes_per_token


def streamed_weight_bytes(spec: ModelSpec, sch: Scheme) -> float:
    """Bytes of weights one forward pass reads from HBM (body and LM head; the embedding is only gathered)."""
    return (body_params(spec) + head_params(spec)) * sch.weight_bytes


def stored_weight_bytes(spec: ModelSpec, sch: Scheme) -> float:
    """Bytes the weights occupy in GPU memory at this precision (the catalog's figure when precision matches)."""
    if sch.precision == spec.precision:
        return spec.weight_bytes
    return spec.parameters * sch.weight_bytes


@dataclass(frozen=True)
class PassCost:
    """FLOPs and bytes of one forward pass over ``new_tokens`` tokens of ``seqs`` sequences (whole replica)."""

    new_tokens: float
    seqs: float
    gemm_flops: float  # body GEMMs, gemm_rows rows each
    head_flops: float  # LM head GEMM, one row per sequence that emits a logit
    attn_flops: float
    weight_bytes: float
    kv_bytes: float
    allreduce_bytes: float  # per all-reduce call (activations of the new tokens, 16-bit)
    allreduces: int  # calls per pass under tensor parallelism
    gemm_rows: float  # rows of the GEMMs' token dimension: few rows leave tensor cores idle
    replicated_bytes: float = 0.0  # element-wise traffic every GPU does in full (norms, residual adds)
    sharded_bytes: float = 0.0  # element-wise traffic split over the GPUs (rotary embedding, MLP activation)
    layers: int = 0  # transformer layers the pass runs through (each pays the per-layer kernel floor)


def elementwise_bytes(spec: ModelSpec, tokens: float) -> tuple[float, float]:
    """HBM traffic of the element-wise kernels between the GEMMs for ``tokens`` tokens, (replicated, sharded).

    Per layer and token: two norms (read + write the hidden vector) and two residual adds (two reads, one write)
    on every GPU; rotary embedding of queries and keys (read + write) and the MLP activation (gated: read gate
    and up, write one; plain: read + write) split over the GPUs.
    """
    if not (spec.heads and spec.head_dim and spec.intermediate):
        return 0.0, 0.0
    per_layer_rep = (2 * 2 + 2 * 3) * spec.hidden
    rope = 2 * (spec.heads + (spec.kv_heads or spec.heads)) * spec.head_dim
    act = (3 if gated_mlp(spec) else 2) * spec.intermediate
    scale = tokens * spec.layers * ACTIVATION_BYTES
    return per_layer_rep * scale, (rope + act) * scale


def prefill_pass(spec: ModelSpec, sch: Scheme, prompts: list[int], prior: list[int] | None = None) -> PassCost:
    """One prefill pass over ``prompts`` (token counts of the requests batched together). ``prior``: tokens of each
    prompt already in the KV cache (a chunk of a longer prompt), which its new tokens attend to and read; default
    none."""
    n = float(sum(prompts))
    seqs = float(len(prompts))
    if spec.unit != "token":
        # Images / audio minutes: the catalog gives FLOPs per unit (a speech encoder's per started window); no
        # attention term or KV cache. Convolution / encoder GEMMs over one image or window of audio have
        # thousands of rows already.
        flops = (sum(spec.audio_gflops(m) for m in prompts) if spec.unit == "audio-minute"
                 else spec.gflops_per_unit * n)
        return PassCost(n, seqs, flops * 1e9, 0.0, 0.0, spec.parameters * sch.weight_bytes, 0.0, 0.0, 0, math.inf)
    gemm = 2.0 * body_params(spec) * n
    head = 2.0 * head_params(spec) * seqs
    kv_write = n * kv_bytes_per_token(spec)
    if spec.sliding_window:  # its local layers attend over at most the window
        attn, kv_read = windowed_prefill_attention(spec, prompts, prior)
        kv_write += kv_read
    else:
        # Causal self-attention: QK^T and PV each 2*t^2*d per head, halved by the causal mask.
        attn = sum(2.0 * spec.layers * spec.heads * spec.head_dim * float(t) ** 2 for t in prompts)
        if prior:  # t new tokens after o cached ones: QK^T and PV over the o, 4 t o d per head more; the o read once
            attn += sum(4.0 * spec.layers * spec.heads * spec.head_dim * float(t) * o
                        for t, o in zip(prompts, prior, strict=True))
            kv_write += float(sum(prior)) * kv_bytes_per_token(spec)
    return PassCost(n, seqs, gemm, head, attn, streamed_weight_bytes(spec, sch), kv_write,
                    n * spec.hidden * ACTIVATION_BYTES, 2 * spec.layers, n, *elementwise_bytes(spec, n), spec.layers)


def _window_pairs(end: float, window: float) -> float:
    """(query, key) pairs of causal attention over the first ``end`` tokens when each query sees at most
    ``window`` keys (itself included), in the continuous form the all-global count uses (``end^2 / 2``)."""
    return end * end / 2.0 if end <= window else window * end - window * window / 2.0


def windowed_prefill_attention(spec: ModelSpec, prompts: list[int], prior: list[int] | None) -> tuple[float, float]:
    """(attention FLOPs, cached KV bytes read) of a prefill on a sliding-window model: its global layers attend
    over the whole prompt and cached prefix as :func:`prefill_pass` counts, its local layers over at most
    ``sliding_window`` previous tokens; a cached prefix of ``o`` tokens is read as ``kv_footprint(o)``."""
    w, g = float(spec.sliding_window), spec.global_layers
    local = spec.layers - g
    before = list(prior) if prior else [0] * len(prompts)
    pairs = sum(g * (_window_pairs(o + t, math.inf) - _window_pairs(o, math.inf))
                + local * (_window_pairs(o + t, w) - _window_pairs(o, w))
                for t, o in zip(prompts, before, strict=True))
    read = sum(spec.kv_footprint(float(o)) for o in before) * kv_bytes_per_token(spec)
    return 4.0 * spec.heads * spec.head_dim * pairs, read


def mixed_pass(spec: ModelSpec, sch: Scheme, prompts: list[int], batch: int, context: float,
               prior: list[int] | None = None) -> PassCost:
    """One iteration that prefills ``prompts`` (new requests or chunks of them) and runs a decode step for
    ``batch`` other sequences of ``context`` tokens, as continuous-batching engines do: the weights are streamed
    once for both, every other count adds up."""
    p = prefill_pass(spec, sch, prompts, prior) if prompts else None
    d = decode_pass(spec, sch, batch, context) if batch else None
    if p is None or d is None:
        if p is None and d is None:
            raise UserError("a mixed step needs prompts or decoding sequences")
        return p or d
    return PassCost(p.new_tokens + d.new_tokens, p.seqs + d.seqs, p.gemm_flops + d.gemm_flops,
                    p.head_flops + d.head_flops, p.attn_flops + d.attn_flops, max(p.weight_bytes, d.weight_bytes),
                    p.kv_bytes + d.kv_bytes, p.allreduce_bytes + d.allreduce_bytes, p.allreduces,
                    p.gemm_rows + d.gemm_rows, p.replicated_bytes + d.replicated_bytes,
                    p.sharded_bytes + d.sharded_bytes, p.layers)


def body_pass(spec: ModelSpec, sch: Scheme, tokens: int) -> PassCost:
    """The transformer body alone over ``tokens`` tokens: every layer's GEMMs and element-wise kernels, no
    attention, no LM head, no all-reduce (what an operator-level profile of the non-attention layers times)."""
    n = float(tokens)
    return PassCost(n, n, 2.0 * body_params(spec) * n, 0.0, 0.0, body_params(spec) * sch.weight_bytes, 0.0, 0.0,
                    0, n, *elementwise_bytes(spec, n), spec.layers)


def decode_pass(spec: ModelSpec, sch: Scheme, batch: int, context: float) -> PassCost:
    """One decode iteration: one new token for each of ``batch`` sequences holding ``context`` tokens of KV."""
    b = float(batch)
    gemm = 2.0 * body_params(spec) * b
    head = 2.0 * head_params(spec) * b
    # A sliding window's local layers read (and attend over) min(context, window) tokens: kv_footprint.
    seen = spec.kv_footprint(context)
    attn = 4.0 * spec.layers * spec.heads * spec.head_dim * seen * b
    kv_read = b * seen * kv_bytes_per_token(spec)
    return PassCost(b, b, gemm, head, attn, streamed_weight_bytes(spec, sch), kv_read + b * kv_bytes_per_token(spec),
                    b * spec.hidden * ACTIVATION_BYTES, 2 * spec.layers, b, *elementwise_bytes(spec, b), spec.layers)


def first_token_passes(spec: ModelSpec, sch: Scheme, prompts: list[int], decode_first: bool,
                       prior: list[int] | None = None):
    """(prefill pass or None, decode step or None) up to the first token of ``prompts`` batched together.

    Engines prefill every prompt token and emit the first token from that pass: (prefill, None). An engine that
    leaves each prompt's last token to a decode step (``EngineProfile.first_token_decode``, token models only)
    prefills ``t - 1`` tokens of each prompt (None when all have one token) and then decodes one token for each
    prompt at the context it prefilled. ``prior``: tokens of each prompt already in the KV cache (a prefix-cache
    hit), which its new tokens attend to (:func:`prefill_pass`); default none.
    """
    if not decode_first or spec.unit != "token" or not spec.generative:
        return prefill_pass(spec, sch, prompts, prior), None
    before = list(prior) if prior else [0] * len(prompts)
    rest = [(t - 1, o) for t, o in zip(prompts, before, strict=True) if t > 1]
    head = prefill_pass(spec, sch, [t for t, _ in rest], [o for _, o in rest] if prior else None) if rest else None
    return head, decode_pass(spec, sch, len(prompts), (sum(t for t, _ in rest) + sum(before)) / len(prompts))
