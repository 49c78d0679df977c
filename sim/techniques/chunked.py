"""Chunked prefill: every iteration decodes one token for each running sequence and prefills prompt chunks beside it.

Plain continuous batching (:class:`sim.engine.ReplicaEngine`) prefills every waiting prompt in one iteration while
the running sequences wait (vLLM's original scheduler). Engines that chunk prefills (Sarathi-Serve, Agrawal et
al. 2024; vLLM's chunked prefill; TensorRT-LLM's in-flight batching with ``max_num_tokens``) give each iteration a
token budget: one token for every decoding sequence, the rest filled with the waiting prompts in arrival order,
the last one cut to fit and continued in the next iteration. A long prompt then delays the running sequences by a
share of its prefill in many iterations instead of all of it in one, and a prompt's first token comes when its
last chunk is done.

:class:`ChunkedEngine` keeps the base engine's analytic decoding between batch changes and simulates only the
iterations that carry prompt chunks, one event each (a prompt of ``P`` tokens costs about ``P / budget`` of them).
An iteration's time is the service-time model's mixed step (``mixed_step_ms``; the roofline's
:func:`controlplane.perf_arch.mixed_pass`: the weights streamed once for chunks and decode rows) with each chunk's
attention to its prompt's earlier chunks (``prior``: their keys and values read, ``4 L H d c o`` FLOPs for ``c``
new tokens after ``o``), so that a prompt's chunks add up to its attention in one piece; for a service-time model without a roofline (a measured profile), a prefill of the
chunks plus a decode step. Each iteration's time beyond a plain decode step counts as the running sequences'
stall.

Scenario switch: ``[techniques] chunked_prefill = true``, ``prefill_chunk_tokens`` (the budget, default 2048).
"""

from __future__ import annotations

from sim.engine import ReplicaEngine, Seq, prefill_after_prefix
from sim.techniques.base import TECHNIQUES, Technique


def iteration_ms(perf, spec, gpu: str):
    """``(chunks, batch, context) -> ms`` of one iteration: ``chunks`` [(new tokens, earlier tokens of the same
    prompt)] prefilled beside ``batch`` decode rows of ``context`` tokens."""
    mixed = getattr(perf, "mixed_step_ms", None)
    if mixed is None or spec.unit != "token":
        prefill = prefill_after_prefix(perf, spec, gpu)
        return lambda chunks, b, ctx: prefill(chunks) + (perf.decode_step_ms(spec, gpu, b, ctx) if b else 0.0)
    return lambda chunks, b, ctx: mixed(spec, gpu, [c for c, _ in chunks], b, ctx,
                                        prior=[o for _, o in chunks])


class ChunkedEngine(ReplicaEngine):
    """Continuous batching with a per-iteration token budget (``budget``) shared by decode rows and prompt chunks."""

    __slots__ = ("budget", "left", "_mixed", "_mixed_cache")

    def __init__(self, *args, budget: int = 2048, **kw):
        super().__init__(*args, **kw)
        self.budget = int(budget)
        # id(seq) of a prompt partly prefilled -> its tokens still to prefill. Prompts stay in ``pending`` (in
        # arrival order) until their last chunk is done.
        self.left: dict[int, float] = {}
        self._mixed_cache: dict = {}
        self._mixed = iteration_ms(self.perf, self.spec, self.gpu)

    def _start_prefill(self, t: float) -> None:
        """Start one iteration: the decode rows, then chunks of the waiting prompts up to the budget."""
        b = len(self.heap)
        room = max(self.budget - b, 1)  # at least one prompt token per iteration, however big the batch
        chunks, batch = [], []
        for s in self.pending:
            if room <= 0:
                break
            if self.lookup is not None and id(s) not in self.left:  # its first chunk: prefix looked up now
                s.cached = self.lookup(s)
            whole = s.prompt - s.cached
            todo = self.left.get(id(s), whole)
            take = min(todo, room)
            # (new tokens, tokens of the prompt before them: its cached prefix and its earlier chunks)
            chunks.append((int(max(take, 1)), int(s.cached + whole - todo)))
            batch.append((s, todo - take))
            room -= take
        bucket = int((self.ctx_sum + b * self.steps - self.join_sum) / b) >> 6 if b else 0  # as the base engine
        key = (tuple(chunks), b, bucket)
        dur = self._mixed_cache.get(key)
        if dur is None:
            dur = self._mixed(chunks, b, float((bucket << 6) + 32) if b else 0.0) / 1e3
            if len(self._mixed_cache) < 65536:
                self._mixed_cache[key] = dur
        if b:
            self.stall_s += max(dur - self._step_time(), 0.0)  # what the chunks add to the decode step
            self.stall_count += 1
        self.prefilling = batch  # (seq, prompt tokens left after this iteration)
        self.prefill_end = t + dur

    def _end_prefill(self, t: float) -> None:
        batch, self.prefilling, self.prefill_end = self.prefilling, [], -1.0
        self.t_ref = t
        if self.heap:
            self.steps += 1.0  # every running sequence got its token in this iteration
        self._finish_due(t)
        for s, rest in batch:
            if rest > 0:
                self.left[id(s)] = rest
                continue
            self.left.pop(id(s), None)
            self.pending.remove(s)
            self._prefilled(s, t)

    def kill(self, t: float) -> list[Seq]:
        self.prefilling, self.left = [], {}  # the prompts of the running iteration are in ``pending`` too
        return super().kill(t)


@TECHNIQUES.register("chunked_prefill", on=lambda t: t.chunked_prefill)
class ChunkedPrefill(Technique):
    """Every language-model replica chunks its prefills into iterations of ``prefill_chunk_tokens`` tokens."""

    def engine(self, name, sim, replica):
        spec = replica.spec
        if not spec.generative or spec.unit != "token":
            return None
        caches = sim._engine_caches.setdefault((spec.id, replica.gpu), ({}, {}))
        return ChunkedEngine(spec, replica.gpu, sim.perf, sim._arm, sim._first_token, sim._finish, caches,
                             budget=self.t.prefill_chunk_tokens)
