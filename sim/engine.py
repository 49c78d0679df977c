"""Node model: iteration-level continuous batching on one replica, advanced analytically between batch changes.

A replica alternates prefill iterations (all requests that reached it since the last one, prefilled together;
decoding sequences stall meanwhile, as in vLLM's default scheduler) and decode iterations (one token for every
running sequence). Between two changes of batch membership every decode iteration takes the same time, so the
engine never simulates single tokens: it keeps a step counter ``steps`` that grows at ``1 / step_s`` and knows the
step at which each sequence finishes. Events therefore scale with requests, not tokens.

Invariants: a sequence is in exactly one of ``pending`` (waiting for prefill), ``prefilling`` or the decode heap;
``ctx_sum`` equals the sum of the running sequences' current lengths; stalls counted per sequence equal the
prefill iterations it sat through while decoding.
"""

from __future__ import annotations

import heapq
import itertools
from heapq import heappush

from simpy.events import NORMAL

from sim.timers import Timer


def prefill_after_prefix(perf, spec, gpu: str):
    """``[(new tokens, tokens before them in the KV cache)] -> ms`` to the first token of those prompts prefilled
    together.

    New tokens after a cached prefix (a prefix-cache hit, an earlier chunk of the same prompt) attend to it: its
    keys and values are read and QK^T / PV run over it as well (``4 L H d t o`` FLOPs for ``t`` new tokens after
    ``o``), so a hit costs more than a fresh prompt of its new tokens (1,000 new tokens of Llama-3.1-8B on an
    H100: 18% more after 4,000 cached ones, 134% more after 30,000). A roofline model counts that itself
    (``prior``); a measured profile knows fresh prompts only, ``T(x)``, so each hit adds what its new tokens
    cost beyond a fresh prompt's, ``T(o + t) - T(o) - T(t) + T(0)`` with ``T(0)`` extrapolated as
    ``2 T(1) - T(2)`` (exact when ``T`` is linear in the tokens, within two tokens' attention when it is
    quadratic)."""
    if getattr(perf, "counts_prefix_attention", False):
        return lambda pairs: perf.prefill_batch_ms(spec, gpu, [int(t) for t, _ in pairs],
                                                   prior=[int(o) for _, o in pairs])

    def one(x) -> float:
        return perf.prefill_ms(spec, gpu, x)

    together = getattr(perf, "prefill_batch_ms", None)

    def ms(pairs) -> float:
        new = [t for t, _ in pairs]
        base = one(new[0]) if len(new) == 1 else together(spec, gpu, new) if together else one(sum(new))
        zero = 2.0 * one(1) - one(2)
        return base + sum(max(0.0, one(o + t) - one(o) - one(t) + zero) for t, o in pairs if o > 0)

    return ms


_NO_TIMER = Timer(None, None)  # what ReplicaEngine.timer holds before its first wake-up is pushed


class Seq:
    """A request on a replica (times in simulated seconds); ``rec`` is the simulator's handle for it."""

    __slots__ = ("rec", "prompt", "output", "joined_at", "first_token_at", "finish_step", "join_step",
                 "stall_mark", "stall_count_mark", "done", "cached", "stalls_at_end")

    def __init__(self, rec, prompt: int, output: int):
        self.rec, self.prompt, self.output = rec, prompt, output
        self.cached = 0  # prompt tokens found in the replica's prefix cache: prefill skips them
        self.joined_at = self.first_token_at = -1.0
        self.finish_step = self.join_step = 0.0
        self.stall_mark = 0.0
        self.stall_count_mark = 0
        self.stalls_at_end = None  # (s, count) frozen when it finishes: a prefill starting at that instant is not its
        self.done = False


class ReplicaEngine:
    """Continuous batching on one replica. ``on_first_token(seq, t)`` and ``on_finish(seq, t)`` report back;
    ``arm(engine, t, version)`` asks the simulator for a wake-up at time ``t`` (s); stale ones are ignored.
    """

    __slots__ = ("spec", "gpu", "perf", "arm", "on_first_token", "on_finish", "pending", "prefilling",
                 "prefill_end", "heap", "steps", "t_ref", "step_s", "ctx_sum", "join_sum", "stall_s",
                 "stall_count", "version", "busy_s", "busy_since", "_step_cache", "_prefill_cache", "generative",
                 "dead", "_prefill_fn", "_batch_fn", "_after_fn", "_order", "meter", "gpu_ids", "lookup", "env",
                 "timer", "_fire_cb", "_fire_cbs", "finished", "flush")

    def __init__(self, spec, gpu: str, perf, arm, on_first_token, on_finish, caches: tuple[dict, dict] | None = None):
        self.spec, self.gpu, self.perf = spec, gpu, perf
        self.arm, self.on_first_token, self.on_finish = arm, on_first_token, on_finish
        self.generative = spec.generative
        self.pending: list[Seq] = []
        self.prefilling: list[Seq] = []
        self.prefill_end = -1.0
        self.heap: list = []  # (finish_step, order of entry, seq)
        self.steps = 0.0
        self.t_ref = 0.0
        self.step_s = 0.0
        self.ctx_sum = 0.0  # sum of prompt lengths of decoding sequences (current lengths = + steps - join_step)
        self.join_sum = 0.0
        self.stall_s = 0.0
        self.stall_count = 0
        self.version = 0
        self.busy_s = 0.0
        self.busy_since = -1.0
        self.meter, self.gpu_ids = None, ()  # a sim.gpu_busy.GpuBusyMeter told of each busy period, if bound
        # Decode-step and prefill times by shape; ``caches`` lets the replicas of one (model, GPU) share them (the
        # values depend on nothing else), so a fleet of a thousand replicas computes each shape once.
        self._step_cache, self._prefill_cache = caches if caches is not None else ({}, {})
        fn = getattr(perf, "prefill_fn", None)  # a memoised model hands out one function per (model, GPU)
        self._prefill_fn = fn(spec, gpu) if fn is not None else (lambda tokens: perf.prefill_ms(spec, gpu, tokens))
        # Prompts prefilled together: each attends to its own tokens only, so the pass costs what the model says
        # for that list (a measured profile: padded to the longest), not one prompt of their summed length.
        batch_fn = getattr(perf, "prefill_batch_ms", None)
        self._batch_fn = ((lambda tokens: batch_fn(spec, gpu, list(tokens))) if batch_fn is not None
                          else (lambda tokens: perf.prefill_ms(spec, gpu, sum(tokens))))
        self._after_fn = None  # prefill_after_prefix's function, made at the first prefix-cache hit
        self.dead = False
        # Prefix caching: ``lookup(seq)`` gives the prompt tokens cached when its prefill starts (blocks become
        # hits once the prefill computing them has ended, so the lookup cannot be made earlier); None: off.
        self.lookup = None
        # Sequences due at the same step finish in the order they entered decode (an object's id() would make the
        # order, and what it starts next, differ from run to run).
        self._order = itertools.count()
        # Set by :meth:`push_timers`: wake-ups go straight onto that SimPy environment's queue, not through ``arm``.
        self.env = self._fire_cb = self._fire_cbs = self.finished = self.flush = None
        self.timer = _NO_TIMER  # the wake-up pushed last (see join; once popped, _schedule pushes it again)

    def push_timers(self, env, finished: list, flush) -> None:
        """Push each wake-up onto ``env``'s event queue as a ``sim.timers.Timer`` of :meth:`fire` (value: the
        version), at the time, priority and id the ``arm`` callback's timeout would have, without the call; after
        a wake-up, ``flush()`` when ``finished`` (the list ``on_finish`` appends to) is not empty."""
        self.env, self._fire_cb, self.finished, self.flush = env, self.fire, finished, flush
        self._fire_cbs = [self.fire]  # (the callbacks of a timer pushed again: nothing appends to them)

    # ---------------------------------------------------------------- helpers
    @property
    def decoding(self) -> int:
        return len(self.heap)

    def _advance(self, t: float) -> None:
        """Move the decode step counter to time ``t`` (decode is frozen while a prefill iteration runs)."""
        if self.heap and self.prefill_end < 0 and self.step_s > 0:
            self.steps += (t - self.t_ref) / self.step_s
        self.t_ref = t

    def _step_time(self) -> float:
        b = len(self.heap)
        if b == 0:
            return 0.0
        ctx = (self.ctx_sum + b * self.steps - self.join_sum) / b
        key = (b, int(ctx) >> 6)  # 64-token context buckets: decode time is nearly linear in context
        ms = self._step_cache.get(key)
        if ms is None:
            ms = self.perf.decode_step_ms(self.spec, self.gpu, b, float((key[1] << 6) + 32)) / 1e3
            self._step_cache[key] = ms
        return ms

    def _schedule(self, t: float) -> None:
        """Re-arm the wake-up for the next change: prefill end, or the next sequence finishing."""
        self.version = version = self.version + 1
        if self.prefill_end >= 0:
            at = self.prefill_end
        elif self.heap:
            # self._step_time(), inlined (once or twice per request)
            heap, steps = self.heap, self.steps
            b = len(heap)
            ctx = (self.ctx_sum + b * steps - self.join_sum) / b
            key = (b, int(ctx) >> 6)
            step_s = self._step_cache.get(key)
            if step_s is None:
                step_s = self._step_time()
            self.step_s = step_s
            due = heap[0][0] - steps
            at = t + (due if due > 0.0 else 0.0) * step_s  # (max(0.0, due) without the call)
        else:
            if self.busy_since >= 0:
                self.busy_s += t - self.busy_since
                self.busy_since = -1.0
                meter = self.meter
                if meter is not None:  # meter.stop(self.gpu_ids, t), inlined: once per busy period
                    meter.engines_busy -= 1
                    active = meter.active
                    for g in self.gpu_ids:
                        a = active[g] = active[g] - 1
                        if not a:
                            meter.busy[g] += t - meter.since[g]
                            meter.gpus_busy -= 1
                        elif a == 1:
                            meter.gpus_shared -= 1
            return
        env = self.env
        if env is None:
            self.arm(self, at, version)
        else:  # the arm callback's timer, pushed here (once or twice per request)
            now = env._now
            delay = at - now  # (the delay and the sum exactly as env.timeout(max(0.0, at - now)) computes them)
            timer = self.timer
            if timer.callbacks is None:  # the wake-up that fired (popped: its callbacks taken), pushed once more
                timer.callbacks, timer._value = self._fire_cbs, version
            else:
                self.timer = timer = Timer(self._fire_cb, version)
            heappush(env._queue, (now + (delay if delay > 0.0 else 0.0), NORMAL, next(env._eid), timer))

    # ---------------------------------------------------------------- events
    def join(self, seq: Seq, t: float) -> None:
        """A request reached the replica with its slot already reserved by the control plane."""
        if self.dead or seq.done:  # the node failed while the request was on its way
            return
        seq.joined_at = t
        if self.busy_since < 0:
            self.busy_since = t
            meter = self.meter
            if meter is not None:  # meter.start(self.gpu_ids, t), inlined: once per busy period
                meter.engines_busy += 1
                active = meter.active
                for g in self.gpu_ids:
                    a = active[g]
                    if not a:
                        meter.since[g] = t
                        meter.gpus_busy += 1
                    elif a == 1:
                        meter.gpus_shared += 1
                    active[g] = a + 1
        self.pending.append(seq)
        if self.prefill_end < 0:
            if self.heap:
                if self.step_s > 0:  # self._advance(t), inlined: this runs once per request
                    self.steps += (t - self.t_ref) / self.step_s
                # The wake-up pending for the next sequence to finish is superseded by the prefill's (_schedule
                # below): with no callbacks, the event loop pops it without a call (its version would make it a
                # no-op anyway).
                self.timer.callbacks = ()
            self.t_ref = t
            self._start_prefill(t)
            self._schedule(t)

    def _start_prefill(self, t: float) -> None:
        batch, self.pending = self.pending, []
        if self.lookup is not None:
            for s in batch:
                s.cached = self.lookup(s)
        if len(batch) == 1:
            first = batch[0]
            tokens = first.prompt - first.cached
            if first.cached and self.generative:  # its new tokens attend to the cached prefix as well
                tokens = ("after", ((tokens, first.cached),))
        elif self.generative and self.spec.unit == "token" and any(s.cached for s in batch):
            tokens = ("after", tuple(sorted((s.prompt - s.cached, s.cached) for s in batch)))
        elif (self.generative and self.spec.unit == "token") or self.spec.audio_window_s:
            # keyed by the sorted prompt lengths (a speech encoder pays each clip's started windows: not their sum)
            tokens = tuple(sorted(s.prompt - s.cached for s in batch))
        elif self.generative or self.spec.unit != "token":  # images, audio minutes: the units add up
            tokens = sum(s.prompt - s.cached for s in batch)
        else:  # encoders: one padded pass over the batch
            tokens = max(s.prompt for s in batch) * len(batch)
        dur = self._prefill_cache.get(tokens)
        if dur is None:
            if type(tokens) is not tuple:
                dur = self._prefill_fn(tokens) / 1e3
            elif tokens[0] == "after":
                if self._after_fn is None:
                    self._after_fn = prefill_after_prefix(self.perf, self.spec, self.gpu)
                dur = self._after_fn(tokens[1]) / 1e3
            else:
                dur = self._batch_fn(tokens) / 1e3
            if len(self._prefill_cache) < 65536:
                self._prefill_cache[tokens] = dur
        if self.heap:
            self.stall_s += dur  # every decoding sequence waits this long for its next token
            self.stall_count += 1
        self.prefilling = batch
        self.prefill_end = t + dur

    def wake(self, t: float, version: int) -> None:
        """The simulator's timer fired; ignore it unless it is the latest one armed."""
        if version != self.version or self.dead:
            return
        if self.prefill_end >= 0 and t >= self.prefill_end - 1e-9:
            self._end_prefill(t)
        else:
            if self.heap and self.prefill_end < 0 and self.step_s > 0:  # self._advance(t), inlined
                self.steps += (t - self.t_ref) / self.step_s
            self.t_ref = t
            self._finish_due(t)
        if self.prefill_end < 0 and self.pending:
            self._advance(t)
            self._start_prefill(t)
        self._schedule(t)

    def fire(self, ev) -> None:
        """A wake-up pushed by this engine (``push_timers``) fired: :meth:`wake` at the queue's clock, inlined (once
        or twice per request; a subclass that changes ``wake`` changes this too), then the caller's ``flush`` if
        sequences finished."""
        if ev._value != self.version or self.dead:
            return
        t = self.env._now
        prefill_end = self.prefill_end
        if prefill_end >= 0:
            if t >= prefill_end - 1e-9:
                self._end_prefill(t)
            else:
                self.t_ref = t  # (decode is frozen while a prefill runs: _advance moves no step)
                self._finish_due(t)
        else:
            if self.heap and self.step_s > 0:
                self.steps += (t - self.t_ref) / self.step_s
            self.t_ref = t
            self._finish_due(t)
        if self.prefill_end < 0 and self.pending:  # (wake's _advance(t) here moves no step: t_ref is t already)
            self._start_prefill(t)
        self._schedule(t)
        if self.finished:
            self.flush()

    def _end_prefill(self, t: float) -> None:
        batch, self.prefilling, self.prefill_end = self.prefilling, [], -1.0
        self.t_ref = t
        on_first_token, generative = self.on_first_token, self.generative
        for s in batch:  # self._prefilled(s, t) and self._enter_decode(s), inlined: once per request
            s.first_token_at = t
            on_first_token(s, t)
            if not generative or s.output <= 1:
                s.stalls_at_end = (0.0, 0)  # it never decoded: no stalls
                s.done = True
                self.on_finish(s, t)
            else:
                steps = self.steps
                s.join_step = steps
                s.finish_step = finish = steps + (s.output - 1)
                s.stall_mark, s.stall_count_mark = self.stall_s, self.stall_count
                self.ctx_sum += s.prompt
                self.join_sum += steps
                heapq.heappush(self.heap, (finish, next(self._order), s))
        heap = self.heap
        if heap and heap[0][0] <= self.steps + 1e-6:  # (what _finish_due tests first: often nothing is due)
            self._finish_due(t)

    def _prefilled(self, s: Seq, t: float) -> None:
        """``s``'s prompt is through: its first token now, then decoding (or done, with one token to make)."""
        s.first_token_at = t
        self.on_first_token(s, t)
        if not self.generative or s.output <= 1:
            s.stalls_at_end = (0.0, 0)  # it never decoded: no stalls
            s.done = True
            self.on_finish(s, t)
        else:
            self._enter_decode(s)

    def _enter_decode(self, s: Seq) -> None:
        s.join_step = self.steps
        s.finish_step = self.steps + (s.output - 1)
        s.stall_mark, s.stall_count_mark = self.stall_s, self.stall_count
        self.ctx_sum += s.prompt
        self.join_sum += self.steps
        heapq.heappush(self.heap, (s.finish_step, next(self._order), s))

    def join_decode(self, seq: Seq, t: float) -> None:
        """A sequence prefilled elsewhere (disaggregation: its KV cache just arrived) starts decoding here."""
        if self.dead or seq.done:
            return
        seq.joined_at = t
        if self.busy_since < 0:
            self.busy_since = t
            if self.meter is not None:
                self.meter.start(self.gpu_ids, t)
        self._advance(t)
        self._enter_decode(seq)
        if self.prefill_end < 0:
            self._finish_due(t)
            self._schedule(t)

    def _finish_due(self, t: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= self.steps + 1e-6:
            _, _, s = heapq.heappop(heap)
            self.ctx_sum -= s.prompt
            self.join_sum -= s.join_step
            s.stalls_at_end = (self.stall_s - s.stall_mark, self.stall_count - s.stall_count_mark)
            s.done = True
            self.on_finish(s, t)

    def seq_stalls(self, s: Seq) -> tuple[float, int]:
        """Stall time (s) and number of stalled gaps a sequence saw while decoding."""
        if s.stalls_at_end is not None:
            return s.stalls_at_end
        return self.stall_s - s.stall_mark, self.stall_count - s.stall_count_mark

    def kill(self, t: float) -> list[Seq]:
        """The node failed: drop every sequence (returned so the simulator can fail or retry them)."""
        lost = self.pending + self.prefilling + [e[2] for e in self.heap]
        self.pending, self.prefilling, self.heap = [], [], []
        self.prefill_end, self.ctx_sum, self.join_sum = -1.0, 0.0, 0.0
        self.version += 1
        if self.busy_since >= 0:
            self.busy_s += t - self.busy_since
            self.busy_since = -1.0
            if self.meter is not None:
                self.meter.stop(self.gpu_ids, t)
        return lost

    def busy_until(self, t: float) -> float:
        """Seconds this replica has had work, up to ``t``."""
        return self.busy_s + (t - self.busy_since if self.busy_since >= 0 else 0.0)
