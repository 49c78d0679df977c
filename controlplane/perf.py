"""Service-time models: how long a GPU takes to prefill a prompt and to run one decode step of a batch.

``PerfModel`` is the interface the router (predicted wait), placement (replica capacity) and the simulator use.
``Roofline`` derives times from the GPU spec table (FLOPS, memory bandwidth, interconnect) and the catalog's
architecture figures (:mod:`controlplane.perf_arch` counts FLOPs and bytes), with a few efficiency constants fitted
to published measurements (``controlplane/data/perf_params.json``, refit with ``python -m
controlplane.perf_calibration``). :class:`controlplane.perf_profile.MeasuredProfile` is the other implementation,
interpolating a table measured by ``edgepop profile``.

Per pass the roofline charges, on each of the ``tp`` GPUs of a replica:

* compute: matrix FLOPs at the precision's tensor peak times a GEMM efficiency fitted per GPU type (a type never
  measured takes its architecture's value), lower for 8-bit GEMMs, falling for small token counts
  (``eff * n / (n + n_half)``), plus attention FLOPs at the 16-bit peak;
* memory: the streamed weights (all of them, every pass) and the KV cache read/written, at a fraction of the
  memory bandwidth fitted per GPU type (a type never measured takes its memory technology's value: HBM or
  GDDR; lower again for weight-only formats, which dequantise in the kernel);
* the two of them combined as a smooth maximum (real kernels do not overlap perfectly near the knee);
* element-wise kernels between the GEMMs (norms, residual adds, rotary embedding, MLP activation), memory-bound
  and serial with them; norms and adds run in full on every GPU of a tensor-parallel group;
* a floor per layer: a dozen kernels each take a few microseconds however little work they get, which is what
  a small batch split over many GPUs runs into;
* interconnect: two all-reduces of the new tokens' activations per layer, each a per-call latency plus the ring's
  2(tp-1)/tp of the data over the link, both by interconnect (NVLink or PCIe), by the cheaper of NCCL's simple
  and low-latency protocols (small messages: a shorter latency at half the bandwidth);
* image models' passes are priced with the image server's profile (``image-server``): its own fixed cost per pass
  and its own share of the dense peak on every board (convolution nets reach less of it than large GEMMs);
* a fixed overhead per prefill and per decode step (scheduling, sampling, kernel launches); an engine that
  leaves each prompt's last token to a decode step (``EngineProfile.first_token_decode``) pays that step,
  overhead included, in its time to first token;
* for a stack whose tensor-parallel workers launch their kernels each from its own host, unsynchronised, a wait
  at every all-reduce for the last worker to arrive (``EngineProfile.barrier_jitter_us`` times
  :func:`straggler_factor`).

The per-layer all-reduce latency and the step overhead are why decode does not speed up like 1/tp: a 70B model
at tp 8 still pays 160 all-reduces and the step floor. Hardware constants are shared; the overheads and the
attention-kernel efficiency belong to an :class:`EngineProfile` (``default``: a modern optimised engine), because
they are properties of the serving software, not of the GPU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import astuple, dataclass, field, fields, replace
from typing import ClassVar, Protocol

import numpy as np
import pandas as pd
from scipy import special

from controlplane import perf_arch
from controlplane.catalog import PRECISION_BYTES, RUNTIME_OVERHEAD_BYTES, ModelSpec
from controlplane.perf_params import RANGES, EngineProfile, RooflineParams, check_override
from edgepop.errors import UserError
from topology.gpus import ARCHS, gpu_arch  # noqa: F401  (ARCHS: the known types' generations, re-exported)

# The engine profile that prices image models' passes (RooflineParams.engines; fitted by
# controlplane.perf_calibration on MLPerf ResNet-50 results of datacenter boards).
IMAGE_ENGINE = "image-server"
# FP8 tensor cores exist on Hopper and Ada only.
FP8_ARCHS = frozenset({"hopper", "ada"})
# fp32 GEMMs: TF32 tensor cores from Ampere on, at half the 16-bit peak; Turing has none, and its CUDA cores do
# fp32 at an eighth of its FP16 tensor peak (T4: 8.1 of 65 TFLOPS, NVIDIA's T4 datasheet).
TF32_ARCHS = frozenset({"hopper", "ada", "ampere"})
FP32_SHARE = {True: 1 / 2, False: 1 / 8}  # of the 16-bit peak, by whether the architecture has TF32
# Graphics-memory (GDDR) boards top out near 1 TB/s; every HBM board in the table is above 1.5 TB/s.
HBM_MIN_BW_GBPS = 1500.0
# A GPU-to-GPU link this fast (GB/s, both directions) is NVLink; PCIe Gen4/5 x16 is 64/128.
NVLINK_MIN_GBPS = 200.0
# NCCL's low-latency protocol stores 8 bytes per 4 of data (a flag with each word): at most half the link's rate.
LL_BANDWIDTH_SHARE = 0.5


class PerfModel(Protocol):
    """Service times in milliseconds for one replica of ``spec`` on GPUs of type ``gpu``."""

    def prefill_ms(self, spec: ModelSpec, gpu: str, tokens: int) -> float:
        """Process ``tokens`` prompt tokens (or units: images, audio minutes) of one request."""

    def decode_step_ms(self, spec: ModelSpec, gpu: str, batch: int, context: float) -> float:
        """One decode iteration producing one token for each of ``batch`` sequences of mean length ``context``."""


@dataclass(frozen=True)
class GPU:
    """One GPU type. Rates in bytes/s and FLOP/s; ``link_bw`` is one direction between two GPUs of a node."""

    name: str
    memory_bytes: float
    mem_bw: float
    flops16: float
    flops8: float
    link_bw: float
    arch: str
    has_fp8: bool
    memory_kind: str = "hbm"  # "hbm" or "gddr"
    link_kind: str = "nvlink"  # "nvlink" or "pcie"

    def peak(self, which: str) -> float:
        if which == "flops32":
            return self.flops16 * FP32_SHARE[self.arch in TF32_ARCHS]
        return {"flops8": self.flops8, "flops16": self.flops16}[which]


@functools.lru_cache(maxsize=64)
def straggler_factor(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal variables (0 for one; 0.56, 1.03, 1.42 for 2, 4, 8):
    how many standard deviations after the typical worker the last of ``n`` reaches a barrier."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = special.ndtr(x)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def gpu_table(gpus: pd.DataFrame) -> dict[str, GPU]:
    """GPU types from the topology's spec table (``topology/data/gpus.csv`` columns).

    The table's interconnect figure is the bidirectional total (NVLink 4: 900 GB/s; PCIe Gen4 x16: 64 GB/s), so
    one direction, what a ring all-reduce step uses, is half of it. The architecture is the ``arch`` column
    (:func:`topology.gpus.gpu_arch`).
    """
    out = {}
    for i, r in enumerate(gpus.itertuples(), start=2):  # (load_gpus fills arch; a frame built in code may not)
        given = getattr(r, "arch", "")  # (a frame's empty cell may be NaN: not an architecture)
        arch = gpu_arch(r.gpu, str(getattr(r, "notes", "") or ""), given if isinstance(given, str) else "",
                        ("<GPU table>", i))
        out[r.gpu] = GPU(r.gpu, r.memory_gb * 1e9, r.mem_bw_gbps * 1e9, r.bf16_tflops * 1e12,
                         r.fp8_int8_tflops * 1e12, r.interconnect_gbps * 1e9 / 2, arch, arch in FP8_ARCHS,
                         "hbm" if r.mem_bw_gbps >= HBM_MIN_BW_GBPS else "gddr",
                         "nvlink" if r.interconnect_gbps >= NVLINK_MIN_GBPS else "pcie")
    return out


@dataclass(frozen=True)
class StepTime:
    """Milliseconds of one pass and what they are made of (per GPU of the replica)."""

    compute_ms: float
    memory_ms: float
    comm_ms: float
    overhead_ms: float
    total_ms: float

    @property
    def bottleneck(self) -> str:
        """``compute``, ``memory`` or ``interconnect``: the largest of the three; ``overhead`` if it beats all."""
        parts = {"compute": self.compute_ms, "memory": self.memory_ms, "interconnect": self.comm_ms,
                 "overhead": self.overhead_ms}
        return max(parts, key=parts.get)


@dataclass
class Roofline:
    """Roofline service times; satisfies :class:`PerfModel` and adds batched prefill and breakdowns.

    Every method takes ``tp`` (GPUs per replica; default the catalog's ``tensor_parallel``) and ``weight_only``
    (force weight-only execution of an 8-bit format).
    """

    gpus: dict[str, GPU]
    params: RooflineParams = field(default_factory=RooflineParams.load)
    engine: str = "default"
    # prefill_batch_ms(..., prior=) counts new tokens' attention to a cached prefix (a measured profile cannot)
    counts_prefix_attention: ClassVar[bool] = True

    def __post_init__(self):
        self.profile = self.params.engine(self.engine)
        # Image models are served by an image server, not by a language-model engine: its own fixed cost per pass
        # and share of the peak (fitted on MLPerf ResNet-50 results), when the constants have one.
        self.image_profile = self.params.engines.get(IMAGE_ENGINE, self.profile)

    def engine_for(self, spec: ModelSpec) -> str:
        """The name of the engine profile that prices ``spec``'s passes (:meth:`profile_for`)."""
        return IMAGE_ENGINE if spec.unit == "image" and IMAGE_ENGINE in self.params.engines else self.engine

    def profile_for(self, spec: ModelSpec) -> EngineProfile:
        """The engine profile that prices ``spec``'s passes: the image server's for image models (when the
        constants hold one), this roofline's engine for every other model."""
        return self.image_profile if spec.unit == "image" else self.profile

    @classmethod
    def from_topology(cls, topo, engine: str = "default", **kw) -> Roofline:
        """Roofline over ``topo.gpus`` for an engine profile; keyword arguments override fitted constants
        (or pass ``params=`` a whole :class:`RooflineParams`)."""
        params = kw.pop("params", None) or RooflineParams.load()
        unknown = set(kw) - {f.name for f in fields(RooflineParams)}
        if unknown:
            raise UserError(f"unknown roofline parameter(s): {', '.join(sorted(unknown))}")
        for name, value in kw.items():
            if name in RANGES:
                check_override(name, value)
        return cls(gpu_table(topo.gpus), replace(params, **kw), engine)

    def gpu(self, name: str) -> GPU:
        try:
            return self.gpus[name]
        except KeyError:
            raise UserError(f"unknown GPU type {name!r} (known: {', '.join(sorted(self.gpus))})") from None

    # ------------------------------------------------------------------ deployment checks
    def check_tp(self, spec: ModelSpec, tp: int | None) -> int:
        """The tensor-parallel degree to use; it must divide the attention heads (engines shard by head)."""
        tp = spec.tensor_parallel if tp is None else int(tp)
        if tp < 1:
            raise UserError(f"tensor parallelism must be >= 1, got {tp}")
        if tp > 1 and spec.unit != "token":  # (their pass has no all-reduce term: it would scale for free)
            raise UserError(f"{spec.id}: tensor parallelism is not modelled for {spec.unit} models (tp {tp}); "
                            "they run on one GPU")
        if tp > 1 and spec.heads and spec.heads % tp:
            raise UserError(f"{spec.id}: tp {tp} does not divide its {spec.heads} attention heads")
        return tp

    def _kv_replication(self, spec: ModelSpec, tp: int) -> float:
        # With fewer KV heads than GPUs, each KV head is replicated on tp/kv_heads GPUs (GQA under wide TP).
        return max(1.0, tp / spec.kv_heads) if spec.kv_heads else 1.0

    def scheme(self, spec: ModelSpec, gpu: str, weight_only: bool = False) -> perf_arch.Scheme:
        return perf_arch.scheme(spec.precision, self.gpu(gpu).has_fp8, weight_only)

    def memory_per_gpu(self, spec: ModelSpec, gpu: str, tp: int | None = None, kv_tokens: float | None = None,
                       weight_only: bool = False) -> dict:
        """Bytes per GPU: weights, KV cache (``kv_tokens``, default the catalog's pool) and runtime overhead."""
        g, tp = self.gpu(gpu), self.check_tp(spec, tp)
        weights = perf_arch.stored_weight_bytes(spec, self.scheme(spec, gpu, weight_only)) / tp
        tokens = spec.kv_pool_tokens if kv_tokens is None else kv_tokens
        kv = tokens * spec.kv_bytes_per_token * self._kv_replication(spec, tp) / tp
        total = weights + kv + RUNTIME_OVERHEAD_BYTES
        return {"weights_bytes": weights, "kv_bytes": kv, "overhead_bytes": float(RUNTIME_OVERHEAD_BYTES),
                "total_bytes": total, "capacity_bytes": g.memory_bytes, "fits": total <= g.memory_bytes}

    # ------------------------------------------------------------------ timing
    def _time(self, spec: ModelSpec, g: GPU, tp: int, sch: perf_arch.Scheme, cost: perf_arch.PassCost,
              prefill: bool, profile: EngineProfile | None = None) -> StepTime:
        p, prof = self.params, profile or self.profile_for(spec)
        overhead_ms = prof.prefill_overhead_ms if prefill else prof.step_overhead_ms
        if prof.gemm_efficiency is not None:  # (an engine whose kernels reach their own share of any board's peak)
            peak = tp * g.peak(sch.gemm_peak) * prof.gemm_efficiency
        else:
            peak = tp * g.peak(sch.gemm_peak) * p.compute_efficiency(g)
            if sch.gemm_peak == "flops8":
                peak *= p.fp8_gemm_factor

        def ramp(rows: float) -> float:  # few GEMM rows leave tensor-core tiles partly empty
            return rows / (rows + p.gemm_half_tokens) if math.isfinite(rows) else 1.0

        compute = cost.gemm_flops / (peak * ramp(cost.gemm_rows)) + cost.head_flops / (peak * ramp(cost.seqs))
        compute += cost.attn_flops / (tp * g.flops16 * prof.attn_efficiency)
        bw = g.mem_bw * p.memory_efficiency(g)
        weight_bw = bw * (p.weight_only_bw_efficiency if sch.weight_only else 1.0)
        kv = cost.kv_bytes * self._kv_replication(spec, tp)
        memory = cost.weight_bytes / (tp * weight_bw) + kv / (tp * bw)
        k = p.overlap_exponent
        busy = (compute ** k + memory ** k) ** (1.0 / k)
        elementwise = (cost.replicated_bytes + cost.sharded_bytes / tp) * prof.elementwise_factor
        busy += elementwise / (g.mem_bw * p.elementwise_efficiency) + cost.layers * p.layer_floor_us * 1e-6
        # The score matrix through memory, between the GEMMs: it needs attention layers and heads, which an
        # image or speech pass has none of here (its gemm_rows is infinite, so the product is skipped, not 0*inf).
        if prefill and prof.dense_attention_bytes and cost.layers and spec.heads:
            busy += prof.dense_attention_bytes * cost.gemm_rows ** 2 * cost.layers * spec.heads / bw
        comm = cost.allreduces * (self.allreduce_s(g, tp, cost.allreduce_bytes)
                                  + prof.barrier_jitter_us * 1e-6 * straggler_factor(tp))
        ms = 1e3
        return StepTime(compute * ms, memory * ms, comm * ms, overhead_ms, (busy + comm) * ms + overhead_ms)

    def allreduce_s(self, g: GPU, tp: int, nbytes: float) -> float:
        """Seconds of one ring all-reduce of ``nbytes`` over ``tp`` GPUs (0 for a single GPU): each GPU sends
        and receives 2(tp-1)/tp of the data over its link, by the cheaper of NCCL's two protocols: the simple
        one (a per-call latency, the full link) and the low-latency one (a shorter latency, at most
        :data:`LL_BANDWIDTH_SHARE` of the link), which is what small messages such as decode steps use."""
        if tp <= 1:
            return 0.0
        p = self.params
        ring = 2.0 * (tp - 1) / tp * nbytes / (g.link_bw * p.link_efficiency_of(g))
        simple = p.by("allreduce_latency_us", g.link_kind) * 1e-6 + ring
        return min(simple, p.allreduce_ll_latency_us * 1e-6 + ring / LL_BANDWIDTH_SHARE)

    def prefill_breakdown(self, spec: ModelSpec, gpu: str, prompts: list[int], tp: int | None = None,
                          weight_only: bool = False, prior: list[int] | None = None) -> StepTime:
        """One prefill pass over the prompts of ``prompts`` (token counts) batched together. ``prior``: tokens
        of each prompt already in the KV cache (a prefix-cache hit), which its new tokens attend to."""
        if not prompts or min(prompts) < (1 if spec.unit != "audio-minute" else 1e-9):
            raise UserError(f"prompt token counts must be positive, got {prompts}")
        if prior is not None and (len(prior) != len(prompts) or min(prior) < 0):
            raise UserError(f"prior token counts must be >= 0, one per prompt, got {prior} for {prompts}")
        tp = self.check_tp(spec, tp)
        sch = self.scheme(spec, gpu, weight_only)
        units = prompts if spec.unit == "audio-minute" else [int(t) for t in prompts]  # (minutes: fractions)
        profile = self.profile_for(spec)
        head, step = perf_arch.first_token_passes(spec, sch, units, profile.first_token_decode,
                                                  [int(o) for o in prior] if prior else None)
        return self._first_token(spec, self.gpu(gpu), tp, sch, head, step, profile)

    def _first_token(self, spec: ModelSpec, g: GPU, tp: int, sch: perf_arch.Scheme, head, step,
                     profile: EngineProfile) -> StepTime:
        """Time to first token from :func:`first_token_passes`' passes: the prefill pass (with the prefill
        overhead) and, for a ``first_token_decode`` engine, the decode step after it (with the step overhead)."""
        if step is None:
            return self._time(spec, g, tp, sch, head, True, profile)
        if head is None:
            pre = StepTime(0.0, 0.0, 0.0, profile.prefill_overhead_ms, profile.prefill_overhead_ms)
        else:
            pre = self._time(spec, g, tp, sch, head, True, profile)
        dec = self._time(spec, g, tp, sch, step, False, profile)
        return StepTime(*(a + b for a, b in zip(astuple(pre), astuple(dec), strict=True)))

    def decode_breakdown(self, spec: ModelSpec, gpu: str, batch: int, context: float, tp: int | None = None,
                         weight_only: bool = False) -> StepTime:
        """One decode step of ``batch`` sequences with ``context`` tokens each already in the KV cache."""
        if batch < 1:
            raise UserError(f"batch must be >= 1, got {batch}")
        if context < 0:
            raise UserError(f"context must be >= 0, got {context}")
        tp = self.check_tp(spec, tp)
        sch = self.scheme(spec, gpu, weight_only)
        cost = perf_arch.decode_pass(spec, sch, int(batch), float(context))
        return self._time(spec, self.gpu(gpu), tp, sch, cost, prefill=False)

    def mixed_breakdown(self, spec: ModelSpec, gpu: str, prompts: list[int], batch: int, context: float,
                        tp: int | None = None, weight_only: bool = False,
                        prior: list[int] | None = None) -> StepTime:
        """One continuous-batching iteration: prefill ``prompts`` while ``batch`` sequences of ``context``
        tokens decode one token each (the prefill's fixed overhead applies when there are prompts). ``prior``:
        tokens of each prompt prefilled before (chunked prefill: earlier chunks its new tokens attend to)."""
        if any(int(t) < 1 for t in prompts) or batch < 0 or context < 0:
            raise UserError(f"mixed step needs positive prompts, batch >= 0 and context >= 0, got {prompts}, "
                            f"{batch}, {context}")
        tp = self.check_tp(spec, tp)
        sch = self.scheme(spec, gpu, weight_only)
        cost = perf_arch.mixed_pass(spec, sch, [int(t) for t in prompts], int(batch), float(context), prior)
        return self._time(spec, self.gpu(gpu), tp, sch, cost, prefill=bool(prompts))

    def mixed_step_ms(self, spec: ModelSpec, gpu: str, prompts: list[int], batch: int, context: float,
                      tp: int | None = None, weight_only: bool = False, prior: list[int] | None = None) -> float:
        """Milliseconds of one mixed prefill + decode iteration (see :meth:`mixed_breakdown`)."""
        return self.mixed_breakdown(spec, gpu, prompts, batch, context, tp, weight_only, prior).total_ms

    def prefill_ms(self, spec: ModelSpec, gpu: str, tokens: int, tp: int | None = None,
                   weight_only: bool = False) -> float:
        """Time to first token of one request with ``tokens`` prompt tokens (units for image/audio models)."""
        return self.prefill_breakdown(spec, gpu, [prompt_units(spec, tokens)], tp, weight_only).total_ms

    def prefill_batch_ms(self, spec: ModelSpec, gpu: str, tokens_list: list[int], tp: int | None = None,
                         weight_only: bool = False, prior: list[int] | None = None) -> float:
        """One pass prefilling several requests together (weights are streamed once for all of them); ``prior``:
        see :meth:`prefill_breakdown`."""
        return self.prefill_breakdown(spec, gpu, list(tokens_list), tp, weight_only, prior).total_ms

    def decode_step_ms(self, spec: ModelSpec, gpu: str, batch: int, context: float, tp: int | None = None,
                       weight_only: bool = False) -> float:
        return self.decode_breakdown(spec, gpu, max(int(batch), 1), max(float(context), 0.0), tp,
                                     weight_only).total_ms


def with_precision(spec: ModelSpec, precision: str | None = None, kv_precision: str | None = None) -> ModelSpec:
    """``spec`` served at another weight (and optionally KV) precision: weight bytes follow the precision."""
    out = spec
    if precision and precision != spec.precision:
        if precision not in PRECISION_BYTES:
            raise UserError(f"unknown precision {precision!r} (known: {', '.join(PRECISION_BYTES)})")
        out = replace(out, precision=precision, weight_bytes=spec.parameters * PRECISION_BYTES[precision])
    if kv_precision and kv_precision != spec.kv_precision:
        if kv_precision not in PRECISION_BYTES:
            raise UserError(f"unknown KV precision {kv_precision!r} (known: {', '.join(PRECISION_BYTES)})")
        out = replace(out, kv_precision=kv_precision)
    return out


def prompt_units(spec: ModelSpec, size: float) -> float:
    """A request's size as the service-time models read it: whole tokens or images (at least one), or minutes of
    audio as they are (a 20 s clip is 1/3 of a minute, not one)."""
    if spec.unit == "audio-minute":
        return max(float(size), 1.0 / 60.0)
    return max(int(size), 1)


def capacity_rps(perf: PerfModel, spec: ModelSpec, gpu: str, prompt_tokens: float = 512,
                 output_tokens: float = 128, batch: int | None = None, **opts) -> float:
    """Sustained requests/s of one replica at full batch: prefill serialised, decode shared by the batch.

    ``batch`` defaults to the catalog's ``max_batch`` and is capped by how many sequences of
    ``prompt_tokens + output_tokens`` fit the replica's KV pool. ``opts`` (``tp``, ``weight_only``) go to
    models that take them (:class:`Roofline`).
    """
    # (A mean prompt past the window is computed, not refused: a replayed trace's sizes are not clipped, and its
    # mean can pass the window though most of its requests fit; those that do not are refused one by one.)
    batch = int(batch or spec.max_batch)
    prefill = perf.prefill_ms(spec, gpu, prompt_units(spec, prompt_tokens), **opts)
    if not spec.generative:
        # Encoders batch whole requests: one pass over the batch, each prompt attending to its own tokens only (as
        # the replica engine runs it), not one sequence of the batch's summed length.
        together = getattr(perf, "prefill_batch_ms", None)
        batch_ms = (together(spec, gpu, [prompt_units(spec, prompt_tokens)] * batch, **opts) if together is not None
                    else batch * prefill)
        return 1e3 * batch / max(batch_ms, prefill)
    if spec.kv_pool_tokens:
        per_seq = max(prompt_tokens + output_tokens, 1)
        if spec.sliding_window:  # what a replica reserves: the footprint, in whole pool tokens
            per_seq = spec.kv_charge(math.ceil(per_seq))
        batch = max(1, min(batch, math.floor(spec.kv_pool_tokens / per_seq)))
    step = perf.decode_step_ms(spec, gpu, batch, prompt_tokens + output_tokens / 2, **opts)
    # The prefill makes the first token; the other output_tokens - 1 come from decode steps shared by the batch.
    per_request_ms = prefill + max(output_tokens - 1.0, 0.0) * step / batch
    return 1e3 / per_request_ms


def capacity_rps_mix(perf: PerfModel, spec: ModelSpec, gpu: str, sizes, output_tokens: float = 128,
                     batch: int | None = None, **opts) -> float:
    """:func:`capacity_rps` of a mix of request sizes: ``sizes`` holds ``(prompt units, share)`` pairs, and a
    request costs the shares' weighted mean of each size's time (``1 / capacity_rps``). What a speech model's
    capacity needs: its clips pay per started window, so the mean clip's cost is not the clips' mean cost."""
    sizes = [(float(u), float(w)) for u, w in sizes if w > 0]
    total = sum(w for _, w in sizes)
    if not sizes or total <= 0:
        raise UserError(f"{spec.id}: capacity of a size mix needs at least one size with a positive share")
    ms = sum(w / total / capacity_rps(perf, spec, gpu, u, output_tokens, batch=batch, **opts) for u, w in sizes)
    return 1.0 / ms


def clip_mix(spec: ModelSpec, minutes) -> tuple[tuple[float, float], ...]:
    """Speech clips (minutes each) as ``(mean minutes, share)`` per count of started windows, for
    :func:`capacity_rps_mix`: within one count a clip's cost is linear in its length, so each group's mean clip
    costs its clips' mean. A model without windows is linear throughout: one group."""
    m = np.maximum(np.asarray(minutes, dtype=float), 1.0 / 60.0)
    if not len(m):
        return ()
    if not spec.audio_window_s:
        return ((float(m.mean()), 1.0),)
    windows = np.maximum(1, np.ceil(m * 60.0 / spec.audio_window_s - 1e-9)).astype(np.int64)
    keys, inverse, counts = np.unique(windows, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=m)
    return tuple((float(sums[i] / counts[i]), float(counts[i] / len(m))) for i in range(len(keys)))
