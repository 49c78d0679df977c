"""Speculative decoding in the simulator: a draft model proposes ``k`` tokens, the target verifies ``k + 1``.

Per decode iteration of a batch (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"):

* the draft runs ``k`` forward passes, each ``draft_cost`` times the target's one-token decode step;
* the target verifies ``k + 1`` positions per sequence in one pass, timed by the roofline with ``k + 1`` new
  tokens per sequence (more GEMM rows and attention queries, the same weights and KV read once);
* with per-token acceptance rate ``a`` the expected tokens emitted per iteration are ``(1 - a^(k+1)) / (1 - a)``.

:class:`SpeculativePerf` wraps any perf model and returns, as ``decode_step_ms``, the time per *emitted* token of
every sequence: (draft + verify) / expected tokens. The engine's one-token-per-step bookkeeping then yields the
speculative TPOT without simulating individual drafts (the mean, not the per-step variance, of acceptance).
"""

from __future__ import annotations

from dataclasses import replace

from controlplane import perf_arch
from sim.techniques.base import TECHNIQUES, Technique


def expected_tokens(acceptance: float, k: int) -> float:
    """Expected tokens emitted per verification step with ``k`` drafts and per-token acceptance ``acceptance``."""
    a = float(acceptance)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class SpeculativePerf:
    """``perf`` with speculative decoding for tasks listed in ``acceptance`` (task -> rate); prefill unchanged."""

    def __init__(self, perf, k: int, acceptance: dict, draft_cost: float):
        self.perf, self.k, self.acceptance, self.draft_cost = perf, int(k), dict(acceptance), float(draft_cost)
        self._cache: dict = {}

    def prefill_ms(self, spec, gpu, tokens, **kw) -> float:
        return self.perf.prefill_ms(spec, gpu, tokens, **kw)

    def verify_ms(self, spec, gpu, batch: int, context: float) -> float:
        """One target pass over ``k + 1`` new tokens for each of ``batch`` sequences."""
        roof = getattr(self.perf, "perf", self.perf)  # CachedPerf wraps the roofline
        if not hasattr(roof, "_time") or spec.unit != "token":
            return self.perf.decode_step_ms(spec, gpu, batch * (self.k + 1), context)
        tp = roof.check_tp(spec, None)
        sch = roof.scheme(spec, gpu)
        b, q = float(batch), float(batch * (self.k + 1))
        kvb = perf_arch.kv_bytes_per_token(spec)
        one = perf_arch.decode_pass(spec, sch, int(batch), float(context))
        n = self.k + 1  # every per-token count of one decode pass, times the k+1 positions; weights once
        cost = replace(one, new_tokens=q, seqs=q, gemm_flops=one.gemm_flops * n, head_flops=one.head_flops * n,
                       attn_flops=one.attn_flops * n, kv_bytes=b * spec.kv_footprint(context) * kvb + q * kvb,
                       allreduce_bytes=one.allreduce_bytes * n, gemm_rows=q,
                       replicated_bytes=one.replicated_bytes * n, sharded_bytes=one.sharded_bytes * n)
        return roof._time(spec, roof.gpu(gpu), tp, sch, cost, prefill=False).total_ms

    def decode_step_ms(self, spec, gpu, batch, context, **kw) -> float:
        a = self.acceptance.get(spec.task)
        if a is None or not spec.generative or kw:
            return self.perf.decode_step_ms(spec, gpu, batch, context, **kw)
        key = (spec.id, gpu, int(batch), float(context))  # exact: see CachedPerf.decode_step_ms
        ms = self._cache.get(key)
        if ms is None:
            one = self.perf.decode_step_ms(spec, gpu, batch, context)
            draft = self.k * self.draft_cost * one
            ms = (draft + self.verify_ms(spec, gpu, batch, context)) / expected_tokens(a, self.k)
            self._cache[key] = ms
        return ms

    def __getattr__(self, name):
        return getattr(self.perf, name)


@TECHNIQUES.register("speculative", on=lambda t: t.speculative)
class Speculative(Technique):
    """``spec_k`` drafts per step at ``spec_draft_cost`` each, accepted at ``spec_acceptance`` per task."""

    def perf(self, perf):
        return SpeculativePerf(perf, self.t.spec_k, self.t.spec_acceptance, self.t.spec_draft_cost)
