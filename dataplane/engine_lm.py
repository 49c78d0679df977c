"""LM engine with iteration-level continuous batching over the GPT-2 graph's KV cache.

Every iteration of the engine thread (1) admits waiting requests while the batch has room and the KV
budget allows, prefilling them together (left padded); (2) runs one decode step for every running
sequence; (3) retires sequences that hit EOS, ``max_tokens``, the context limit, failed or were
cancelled. So sequences join and leave between steps, as in Orca/vLLM.

The batch's KV cache is one dense ``[B,H,P,D]`` tensor per layer and kind, rows left padded to a common past
length (:mod:`dataplane.padded_kv`).

KV budget: a request reserves ``prompt + max_tokens`` tokens when admitted and releases them when it
ends, however it ends (finished, failed, cancelled, or its future cancelled by the caller), so admitted work never
has to be pre-empted. A request that can never fit is refused at ``submit`` with :class:`CapacityError`.

Timing: every handle carries an :class:`~dataplane.lm_handle.LMTiming` (when it was submitted, admitted, got
its first and last token; its decode steps and the stalls other requests' prefills caused), so a caller can say
where a request's time went inside the engine.

Threading: ``submit`` is thread-safe and returns a :class:`GenerationHandle` at once; tokens arrive
through its iterator (a queue) and/or an ``on_token(token_id, text)`` callback run on the engine thread;
``handle.future`` is a :class:`concurrent.futures.Future` (``asyncio.wrap_future`` makes it awaitable).
"""

from __future__ import annotations

import codecs
import collections
import itertools
import threading
import time
from concurrent.futures import InvalidStateError

import numpy as np

from dataplane.errors import CapacityError, EngineClosedError, InvalidInputError
from dataplane.lm_handle import (
    _DONE,
    GenerationHandle,
    GenerationResult,
    LMEngineConfig,
    LMStats,
    LMTiming,
    TokenCallback,
)
from dataplane.lora import Adapter, LoraLanguageModel, adapter_salt
from dataplane.padded_kv import keep_rows, merge_positions, merge_rows
from dataplane.prefix_cache import PrefixCache
from dataplane.runtime import DeviceKV, LanguageModel, left_pad_prompts
from dataplane.sampling import SamplingParams, sample_token
from edgepop.memory import keep_freed_memory

__all__ = ["GenerationHandle", "GenerationResult", "LMEngine", "LMEngineConfig", "LMStats", "LMTiming",
           "TokenCallback"]


class _Seq:
    """Engine-side state of a running request."""

    def __init__(self, handle: GenerationHandle, eos_id: int):
        self.h = handle
        self.rng = np.random.default_rng(handle.params.seed)
        self.pos = 0  # real tokens in the cache
        self.cached = 0  # prompt tokens taken from the prefix cache
        self.next_token = -1  # sampled, not yet fed
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text: list[str] = []
        self.reserve = len(handle.prompt_ids) + handle.max_tokens
        self.held = 0  # KV tokens reserved in the engine's budget (set on admission, returned by _finish)
        self.finished = False
        self.eos_id = eos_id


class LMEngine:
    """Continuous-batching generation over a :class:`LanguageModel` (see the module docstring)."""

    def __init__(self, model: LanguageModel, config: LMEngineConfig | None = None, name: str | None = None):
        keep_freed_memory()  # every batch change copies the KV arrays: keep it at memory speed
        self.model = model
        self.config = config or LMEngineConfig()
        self.stats = LMStats()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._waiting: collections.deque[GenerationHandle] = collections.deque()
        self._closed = False
        # Engine-thread state: running sequences and their shared, padded KV cache.
        self._running: list[_Seq] = []
        self._past: list[np.ndarray] | DeviceKV | None = None
        self._mask: np.ndarray | None = None
        self._reserved = 0
        lora = isinstance(model, LoraLanguageModel)
        auto = model.on_cuda and not lora
        self._device_kv = auto if self.config.device_kv is None else bool(self.config.device_kv) and not lora
        pc = self.config.prefix_cache
        self.prefix_cache = PrefixCache(pc) if pc is not None and pc.max_bytes > 0 else None
        self._thread = threading.Thread(target=self._loop, name=f"edgepop-lm-{name or model.name}",
                                        daemon=True)
        self._thread.start()

    # ----- public API -----------------------------------------------------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams | None = None,
               on_token: TokenCallback | None = None, adapter: Adapter | None = None) -> GenerationHandle:
        """Validate and queue a request (a prompt string or token ids); returns immediately.

        ``adapter``: a LoRA :class:`~dataplane.lora.Adapter` for this request only (the model must be a
        :class:`~dataplane.lora.LoraLanguageModel`); rows of one batch may use different adapters.
        """
        params = params or SamplingParams()
        if adapter is not None and not isinstance(self.model, LoraLanguageModel):
            raise InvalidInputError(f"model {self.model.name!r} is not served with LoRA adapters")
        tok, n_ctx = self.model.tokenizer, self.model.spec.n_ctx
        if isinstance(prompt, str):
            try:  # a lone surrogate (Python strings can hold one) has no UTF-8 bytes to tokenize
                ids = tok.encode(prompt)
            except UnicodeEncodeError as exc:
                raise InvalidInputError(f"prompt is not valid Unicode text ({exc.reason} at character "
                                        f"{exc.start})") from None
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t >= tok.vocab_size for t in prompt):
                raise InvalidInputError(f"token ids must be in [0, {tok.vocab_size})")
            ids = list(prompt)
        else:
            raise InvalidInputError("prompt must be a string or a list of token ids")
        ids = ids or [tok.eos_id]  # GPT-2 convention: <|endoftext|> starts an unconditioned text
        if len(ids) >= n_ctx:
            raise CapacityError(f"prompt has {len(ids)} tokens; the context holds {n_ctx}")
        max_tokens = min(params.max_tokens, n_ctx - len(ids))
        if len(ids) + max_tokens > self.config.kv_budget_tokens:
            raise CapacityError(f"prompt + max_tokens = {len(ids) + max_tokens} exceeds the KV budget "
                                f"of {self.config.kv_budget_tokens} tokens")
        handle = GenerationHandle(next(self._ids), ids, params, max_tokens, on_token, self._wake, adapter,
                                  adapter_salt(adapter))
        handle.timing.submitted = time.monotonic()
        with self._cond:
            if self._closed:
                raise EngineClosedError("engine is closed")
            self._waiting.append(handle)
            self._cond.notify()
        return handle

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None,
                 timeout: float | None = None) -> GenerationResult:
        """Submit and wait."""
        return self.submit(prompt, params).result(timeout)

    def close(self) -> None:
        """Stop the engine; unfinished requests fail with :class:`EngineClosedError`."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    @property
    def active(self) -> int:
        return len(self._running)

    # ----- engine thread ---------------------------------------------------------------------------------
    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    break
                joiners = self._admit()
            self._retire([i for i, s in enumerate(self._running) if s.h.cancelled], reason="cancelled")
            if joiners:
                decoding = list(self._running)
                t0 = time.monotonic()
                self._prefill(joiners)
                dt = time.monotonic() - t0
                longest = max(len(s.h.prompt_ids) for s in joiners)
                for s in joiners:
                    tm = s.h.timing
                    tm.admitted, tm.prefill_s, tm.prefill_rows, tm.prefill_len = t0, dt, len(joiners), longest
                for s in decoding:  # their next token waits for this prefill: interference
                    s.h.timing.stall_s += dt
            if self._running:
                self._decode()
        closed = EngineClosedError("engine was closed")
        for s in self._running:
            self._finish(s, error=closed)
        for h in self._waiting:
            self._finish(_Seq(h, 0), error=closed)

    def _admit(self) -> list[_Seq]:
        out: list[_Seq] = []
        while self._waiting and len(self._running) + len(out) < self.config.max_batch:
            h = self._waiting[0]
            if h.cancelled:
                self._waiting.popleft()
                self._finish(_Seq(h, 0), reason="cancelled")
                continue
            seq = _Seq(h, self.model.tokenizer.eos_id)
            if self._reserved + seq.reserve > self.config.kv_budget_tokens:
                break  # FIFO: the head waits for room rather than being overtaken
            self._waiting.popleft()
            self._reserved += seq.reserve
            seq.held = seq.reserve
            out.append(seq)
        return out

    def _prefill(self, seqs: list[_Seq]) -> None:
        groups, cold = self._prefill_cached(seqs) if self.prefix_cache is not None else ([], seqs)
        try:
            if cold:
                groups.append((cold, *self._prefill_rows(cold)))
        except Exception:
            for s in cold:  # isolate: each prompt alone, so only a failing one fails
                try:
                    groups.append(([s], *self._prefill_rows([s])))
                except Exception as exc:
                    self._finish(s, error=exc)
        self.stats.prefills += 1
        for group, logits, present, mask in groups:
            if self.prefix_cache is not None:
                for row, s in enumerate(group):
                    pad = mask.shape[1] - len(s.h.prompt_ids)
                    self.prefix_cache.insert(s.h.prompt_ids, [a[row, :, pad:] for a in present], s.h.salt)
            keep = []
            for row, s in enumerate(group):
                s.pos = len(s.h.prompt_ids)
                if self._accept(s, logits[row]):
                    keep.append(row)
            if keep:
                self._merge([group[r] for r in keep], [a[keep] for a in present], mask[keep])

    def _prefill_cached(self, seqs: list[_Seq]) -> tuple[list, list[_Seq]]:
        """Prefill prompts with a cached prefix one by one from that KV; returns (groups, the other seqs)."""
        groups, cold = [], []
        for s in seqs:
            ids = s.h.prompt_ids
            n, kv = self.prefix_cache.lookup(ids, s.h.salt)
            if n == 0:
                cold.append(s)
                continue
            s.cached = n
            mask = np.ones((1, len(ids)), np.int64)
            try:
                logits, present = self._step(np.array([ids[n:]], np.int64), mask,
                                             np.arange(n, len(ids), dtype=np.int64)[None], kv, [s])
            except Exception as exc:
                self._finish(s, error=exc)
                continue
            groups.append(([s], logits, present, mask))
        return groups, cold

    def _decode(self) -> None:
        t0 = time.monotonic()
        batch = self._running
        length = self._mask.shape[1] + 1  # the step attends over the padded past and its new token
        self._decode_step()
        dt, b = time.monotonic() - t0, len(batch)
        for s in batch:
            tm = s.h.timing
            tm.decode_s += dt
            tm.steps += 1
            tm.batch_sum += b
            tm.kv_len_sum += length

    def _decode_step(self) -> None:
        ids = np.array([[s.next_token] for s in self._running], np.int64)
        pos = np.array([[s.pos] for s in self._running], np.int64)
        mask = np.concatenate([self._mask, np.ones((len(self._running), 1), np.int64)], axis=1)
        self.stats.steps += 1
        self.stats.batch_sizes[len(self._running)] += 1
        try:
            logits, present = self._step(ids, mask, pos, self._past, self._running, keep=self._device_kv)
            failed: list[int] = []
        except Exception:
            logits, present, failed = self._decode_rows(ids, mask, pos)
        self._past, self._mask = present, mask
        for s in self._running:
            s.pos += 1
        done = [i for i, s in enumerate(self._running) if i not in failed and not self._accept(s, logits[i])]
        self._retire(sorted(done + failed), reason=None)

    def _decode_rows(self, ids, mask, pos):
        """Fallback after a failed batched step: one call per row; failing rows fail alone."""
        self._host_past()
        logits = np.zeros((len(self._running), self.model.spec.vocab_size), np.float32)
        present = [np.zeros((a.shape[0], a.shape[1], a.shape[2] + 1, a.shape[3]), a.dtype) for a in self._past]
        failed = []
        for i, s in enumerate(self._running):
            try:
                lg, pr = self._step(ids[i:i + 1], mask[i:i + 1], pos[i:i + 1], [a[i:i + 1] for a in self._past],
                                    [s])
                logits[i] = lg[0]
                for dst, src in zip(present, pr, strict=True):
                    dst[i] = src[0]
            except Exception as exc:
                failed.append(i)
                self._finish(s, error=exc)
        return logits, present, failed

    def _step(self, ids, mask, pos, past, seqs: list[_Seq], keep: bool = False):
        """One forward call; a LoRA model gets each row's adapter (None rows: zero factors, the base).
        ``keep``: leave the present KV in the provider's memory (a :class:`DeviceKV`)."""
        if isinstance(self.model, LoraLanguageModel):
            return self.model.step_with(ids, mask, pos, past, [s.h.adapter for s in seqs])
        return self.model.step(ids, mask, pos, past, keep_on_device=keep)

    def _host_past(self) -> None:
        """Bring a device-resident cache back to host arrays, before rows join, leave or run one by one."""
        if isinstance(self._past, DeviceKV):
            self._past = self._past.numpy()

    def _prefill_rows(self, seqs: list[_Seq]):
        if isinstance(self.model, LoraLanguageModel):
            # Adapters go with the call, not onto the model: several engines (one per replica) share one model.
            ids, mask, pos = left_pad_prompts([s.h.prompt_ids for s in seqs])
            logits, present = self._step(ids, mask, pos, self.model.empty_past(len(seqs)), seqs)
            return logits, present, mask
        return self.model.prefill([s.h.prompt_ids for s in seqs])

    def _accept(self, s: _Seq, logits: np.ndarray) -> bool:
        """Sample and deliver one token; False when the sequence is finished (and already finalised)."""
        if s.h.cancelled:
            self._finish(s, reason="cancelled")
            return False
        try:
            token = sample_token(logits, s.h.params, s.rng)
            if token == s.eos_id and s.h.params.stop_on_eos:
                self._finish(s, reason="stop")
                return False
            s.h.token_ids.append(token)
            tm = s.h.timing
            tm.last_token = time.monotonic()
            if len(s.h.token_ids) == 1:
                tm.first_token = tm.last_token
            self.stats.tokens += 1
            piece = s.decoder.decode(self.model.tokenizer.token_bytes(token))
            if s.h.on_token is not None:
                s.h.on_token(token, piece)
        except Exception as exc:  # e.g. the caller's callback raised: this request fails, no other
            self._finish(s, error=exc)
            return False
        if piece:
            if not tm.first_piece:
                tm.first_piece = len(s.h.token_ids)
            s.text.append(piece)
            s.h._events.put(piece)
        if len(s.h.token_ids) >= s.h.max_tokens:
            self._finish(s, reason="length")
            return False
        s.next_token = token
        return True

    def _merge(self, seqs: list[_Seq], present: list[np.ndarray], mask: np.ndarray) -> None:
        if not self._running:
            self._running, self._past, self._mask = list(seqs), present, mask
            return
        self._host_past()
        t0, (written, padded) = time.monotonic(), merge_positions(self._mask.shape, mask.shape)
        self._past, self._mask = merge_rows(self._past, self._mask, present, mask)
        for s in seqs:  # what the joiners cost the batch beyond their prefill call (inside their prefill_s)
            s.h.timing.merge_s, s.h.timing.merge_tokens, s.h.timing.merge_pad_tokens = (
                time.monotonic() - t0, written, padded)
        self._running.extend(seqs)

    def _retire(self, rows: list[int], reason: str | None) -> None:
        """Remove finished rows from the batch (finalising them with ``reason`` if given)."""
        if not rows:
            return
        if reason is not None:
            for i in rows:
                self._finish(self._running[i], reason=reason)
        keep = [i for i in range(len(self._running)) if i not in set(rows)]
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._past = self._mask = None
            return
        self._host_past()
        t0 = time.monotonic()
        self._past, self._mask = keep_rows(self._past, self._mask, keep)
        dt = time.monotonic() - t0
        for s in self._running:  # the rows that stay are copied out: part of this iteration's decode time
            s.h.timing.add_trim(dt, self._mask.size)

    def _finish(self, s: _Seq, reason: str | None = None, error: BaseException | None = None) -> None:
        """Finalise a request once: return its KV reservation, end its stream, resolve its future. The
        future may already be cancelled by its caller (the gateway on a disconnect, ``wrap_future`` on a
        cancelled await); the reservation must be returned all the same, or the budget leaks."""
        if s.finished:
            return
        s.finished = True
        self._reserved -= s.held
        s.held = 0
        s.h.timing.finished = time.monotonic()
        tail = s.decoder.decode(b"", final=True)
        if tail:
            s.text.append(tail)
            s.h._events.put(tail)
        s.h._events.put(_DONE)
        try:
            if error is not None:
                s.h.future.set_exception(error)
            else:
                s.h.future.set_result(GenerationResult(
                    text="".join(s.text), token_ids=list(s.h.token_ids), prompt_tokens=len(s.h.prompt_ids),
                    finish_reason=reason or "stop", provider=self.model.provider, synthetic=self.model.synthetic,
                    cached_tokens=s.cached))
        except InvalidStateError:  # cancelled from outside, possibly between a check and here: nobody waits
            pass
