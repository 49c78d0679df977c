"""Service-time models: how long a GPU takes to prefill a prompt and to run one decode step of a batch.

``PerfModel`` is the interface the router (predicted wait), placement (replica capacity) and the simulator use.
``Roofline`` derives times from the GPU spec table (FLOPS, memory bandwidth, interconnect) and the catalog's
architecture figures, with efficiency factors for how much of the peak real kernels reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from controlplane.catalog import ModelSpec
from edgepop.errors import UserError


class PerfModel(Protocol):
    """Service times in milliseconds for one replica of ``spec`` on GPUs of type ``gpu``."""

    def prefill_ms(self, spec: ModelSpec, gpu: str, tokens: int) -> float:
        """Process ``tokens`` prompt tokens (or units: images, audio minutes) of one request."""

    def decode_step_ms(self, spec: ModelSpec, gpu: str, batch: int, context: float) -> float:
        """One decode iteration producing one token for each of ``batch`` sequences of mean length ``context``."""


@dataclass(frozen=True)
class GPU:
    name: str
    mem_bw: float  # bytes/s
    flops16: float  # dense 16-bit tensor FLOP/s
    flops8: float  # dense 8-bit FLOP/s
    link_bw: float  # bytes/s between GPUs of one node


def gpu_table(gpus: pd.DataFrame) -> dict[str, GPU]:
    return {r.gpu: GPU(r.gpu, r.mem_bw_gbps * 1e9, r.bf16_tflops * 1e12, r.fp8_int8_tflops * 1e12,
                       r.interconnect_gbps * 1e9) for r in gpus.itertuples()}


@dataclass
class Roofline:
    """max(compute time, memory time) per phase, scaled by efficiency factors, plus fixed per-call overheads.

    Defaults are typical of vLLM/TensorRT-LLM-class serving: prefill reaches ~55% of dense tensor peak, decode
    streams weights and KV at ~75% of HBM bandwidth, each kernel launch sequence costs a fixed overhead.
    """

    gpus: dict[str, GPU]
    prefill_efficiency: float = 0.55
    decode_bw_efficiency: float = 0.75
    decode_compute_efficiency: float = 0.4
    prefill_overhead_ms: float = 2.0
    step_overhead_ms: float = 1.5
    tp_comm_efficiency: float = 0.7

    @classmethod
    def from_topology(cls, topo, **kw) -> Roofline:
        return cls(gpu_table(topo.gpus), **kw)

    def gpu(self, name: str) -> GPU:
        try:
            return self.gpus[name]
        except KeyError:
            raise UserError(f"unknown GPU type {name!r} (known: {', '.join(sorted(self.gpus))})") from None

    def _peak(self, spec: ModelSpec, g: GPU) -> float:
        if spec.precision in ("fp8", "int8", "int4"):
            return g.flops8
        return g.flops16 / 2 if spec.precision == "fp32" else g.flops16

    def _allreduce_ms(self, spec: ModelSpec, g: GPU, tokens: float) -> float:
        """Two all-reduces of the hidden state per layer under tensor parallelism (ring: 2(tp-1)/tp of the data)."""
        tp = spec.tensor_parallel
        if tp == 1:
            return 0.0
        data = 2 * spec.layers * tokens * spec.hidden * 2.0 * 2 * (tp - 1) / tp
        return 1e3 * data / (g.link_bw * self.tp_comm_efficiency)

    def prefill_ms(self, spec: ModelSpec, gpu: str, tokens: int) -> float:
        g, tp, n = self.gpu(gpu), spec.tensor_parallel, max(int(tokens), 1)
        if spec.unit != "token":
            flops = spec.gflops_per_unit * 1e9 * n
            attn = 0.0
        else:
            flops = 2.0 * spec.parameters * n
            attn = 2.0 * spec.layers * n * n * spec.heads * spec.head_dim if spec.heads else 0.0
        compute = (flops + attn) / (self._peak(spec, g) * self.prefill_efficiency * tp)
        memory = (spec.weight_bytes + n * spec.kv_bytes_per_token) / (g.mem_bw * self.decode_bw_efficiency * tp)
        return 1e3 * max(compute, memory) + self._allreduce_ms(spec, g, n) + self.prefill_overhead_ms

    def decode_step_ms(self, spec: ModelSpec, gpu: str, batch: int, context: float) -> float:
        g, tp, b = self.gpu(gpu), spec.tensor_parallel, max(int(batch), 1)
        kv = b * max(context, 1.0) * spec.kv_bytes_per_token
        memory = (spec.weight_bytes + kv) / (g.mem_bw * self.decode_bw_efficiency * tp)
        flops = 2.0 * spec.parameters * b + 4.0 * spec.layers * b * context * spec.heads * spec.head_dim
        compute = flops / (self._peak(spec, g) * self.decode_compute_efficiency * tp)
        return 1e3 * max(memory, compute) + self._allreduce_ms(spec, g, b) + self.step_overhead_ms


def capacity_rps(perf: PerfModel, spec: ModelSpec, gpu: str, prompt_tokens: float = 512,
                 output_tokens: float = 128) -> float:
    """Sustained requests/s of one replica at full batch: prefill serialised, decode shared by ``max_batch``."""
    prefill = perf.prefill_ms(spec, gpu, int(prompt_tokens))
    if not spec.generative:
        # Encoders batch whole requests: a full batch costs about one pass over the batch's tokens.
        batch_ms = perf.prefill_ms(spec, gpu, int(prompt_tokens * spec.max_batch))
        return 1e3 * spec.max_batch / max(batch_ms, prefill)
    step = perf.decode_step_ms(spec, gpu, spec.max_batch, prompt_tokens + output_tokens / 2)
    per_request_ms = prefill + output_tokens * step / spec.max_batch
    return 1e3 / per_request_ms
