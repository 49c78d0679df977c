"""One replica's engine in the live-host model (:mod:`sim.live.host_model`), iterating as the live
:class:`dataplane.engine_lm.LMEngine` does: a request that arrives mid-iteration waits for it to end; prompts
admitted together are prefilled in one call left padded to the longest; every iteration then decodes every running
sequence padded to the longest context; joining prompts' KV is merged into the batch's (``kv_merge`` rows), which
stalls it; the rows that stay when others leave are copied out of the batch's arrays (``kv_trim`` rows); between
iterations the loop pauses for the measured gap of the running batch size. Every iteration is a job on the shared
host (:class:`sim.live.host_model.HostCPU`), every streamed piece goes to its event loop.
"""

from __future__ import annotations

import collections
import math

from dataplane.padded_kv import merge_positions


class _Row:
    __slots__ = ("seq", "rec", "length")

    def __init__(self, seq, rec):
        self.seq, self.rec, self.length = seq, rec, seq.prompt


class LiveHostEngine:
    """One replica's engine as the live LMEngine iterates, its work run on the shared :class:`HostCPU`."""

    def __init__(self, host_model, sim, replica):
        self.m, self.sim, self.env = host_model, sim, sim.env
        self.spec, self.gpu, self.perf = replica.spec, replica.gpu, sim.perf
        self.p = host_model.params
        self.waiting: collections.deque = collections.deque()
        self.running: list[_Row] = []
        self.reserved = 0
        self.iterating = False
        self.dead = False
        self.busy_since, self.busy_s = -1.0, 0.0
        self.kv_bytes = host_model.kv_bytes_per_token.get(self.spec.id, 0.0)

    # ---------------------------------------------------------------- the simulator's engine interface
    def join(self, seq, t: float) -> None:
        if self.dead or seq.done:
            return
        rec = self.m.rec(seq.rec)
        rec.joined = t
        ev = self.env.timeout(self.p.gw["dispatch"] / 1e3)  # slot granted -> handed to the engine
        ev.callbacks.append(lambda _e: self._submit(seq, rec))

    def seq_stalls(self, seq) -> tuple[float, int]:
        rec = self.m.recs.get(seq.rec)
        return (rec.stall_s, rec.stalls) if rec is not None else (0.0, 0)

    def kill(self, t: float) -> list:
        lost = [s for s, _ in self.waiting] + [r.seq for r in self.running]
        self.waiting.clear()
        self.running = []
        self._idle(t)
        return lost

    def busy_until(self, t: float) -> float:
        return self.busy_s + (t - self.busy_since if self.busy_since >= 0 else 0.0)

    # ---------------------------------------------------------------- iterations
    def _submit(self, seq, rec) -> None:
        if self.dead or seq.done:
            return
        rec.submitted = self.env.now
        self.waiting.append((seq, rec))
        if not self.iterating:  # the engine thread wakes: requests handed over at this same instant join too
            self.iterating = True
            self.env.timeout(0).callbacks.append(lambda _e: self._iterate())

    def _idle(self, t: float) -> None:
        self.iterating = False
        if self.busy_since >= 0:
            self.busy_s += t - self.busy_since
            self.busy_since = -1.0

    def _iterate(self) -> None:
        now = self.env.now
        joiners = []
        while self.waiting and len(self.running) + len(joiners) < self.p.max_batch:
            seq, rec = self.waiting[0]
            need = seq.prompt + seq.output
            if self.reserved + need > self.p.kv_budget and (self.running or joiners):
                break  # FIFO: the head waits for room
            self.waiting.popleft()
            self.reserved += need
            rec.admitted = now
            joiners.append(_Row(seq, rec))
        if not joiners and not self.running:
            self._idle(now)
            return
        self.iterating = True
        if self.busy_since < 0:
            self.busy_since = now
        if joiners:
            work = self.perf.prefill_batch_ms(self.spec, self.gpu, [r.seq.prompt for r in joiners]) / 1e3
            self.m.host.run(work, lambda: self._prefilled(joiners, now))
        else:
            self._decode()

    def _prefilled(self, joiners: list[_Row], t0: float) -> None:
        now = self.env.now
        for r in joiners:  # the first token of each comes from the prefill's logits
            self._token(r, now)
        keep = [r for r in joiners if r.rec.produced < r.seq.output]
        for r in joiners:
            if r.rec.produced >= r.seq.output:
                self._finish(r, now)
        stalled = list(self.running)
        if stalled and keep:  # their KV joins the running batch's
            self.m.host.run(self._merge_ms(stalled, keep, max(r.seq.prompt for r in joiners)) / 1e3,
                            lambda: self._merged(stalled, keep, t0), copy=True)
        else:
            self._merged(stalled, keep, t0)

    def _merge_ms(self, stalled: list[_Row], keep: list[_Row], joined_len: int) -> float:
        """The live merge: both sides left padded to the longer past (the shorter side first, in a copy of its
        own), then concatenated; from the ``kv_merge`` rows, else one concatenation at the ``kv_copy`` rows' rate."""
        past = max(r.length for r in stalled)
        written, padded = merge_positions((len(stalled), past), (len(keep), joined_len))
        ms = self.p.merge_ms(written, padded)
        if ms is None:
            ms = self.p.copy_ms(self._kv_mib(stalled + keep, max(past, joined_len)))
        return ms

    def _merged(self, stalled: list[_Row], keep: list[_Row], t0: float) -> None:
        dt = self.env.now - t0
        for r in stalled:
            r.rec.stall_s += dt
            r.rec.stalls += 1
        self.running.extend(keep)
        if self.running:
            self._decode()
        else:
            self._iterate()

    def _decode(self) -> None:
        t0 = self.env.now
        rows = list(self.running)
        ctx = max(r.length for r in rows)  # the batch's KV is left padded to its longest sequence
        work = self.perf.decode_step_ms(self.spec, self.gpu, len(rows), float(ctx)) / 1e3
        self.m.host.run(work, lambda: self._stepped(rows, t0, ctx + 1))

    def _stepped(self, rows: list[_Row], t0: float, kv_len: int) -> None:
        now = self.env.now
        b = len(rows)
        for r in rows:
            r.rec.decode_s += now - t0
            r.rec.steps += 1
            r.rec.batch_sum += b
            r.rec.kv_len_sum += kv_len  # the padded length it attended over, as the live engine counts it
            r.length += 1
            self._token(r, now)
        done = [r for r in rows if r.rec.produced >= r.seq.output]
        if not done:
            return self._next_iteration()
        for r in done:
            self._finish(r, now)
        self.running = [r for r in self.running if r.rec.produced < r.seq.output]
        if self.running:  # the rows that stay are copied out of the batch's arrays (trimmed): part of their step
            longest = max(r.length for r in self.running)
            ms = self.p.trim_ms(len(self.running) * longest)
            if ms is None:  # (no kv_trim rows: one copy at the kv_copy rows' rate)
                ms = self.p.copy_ms(self._kv_mib(self.running, longest))
            self.m.host.run(ms / 1e3, lambda: self._trimmed(list(self.running), now), copy=True)
        else:
            self._next_iteration()

    def _trimmed(self, rows: list[_Row], t0: float) -> None:
        dt = self.env.now - t0
        for r in rows:
            r.rec.decode_s += dt
        self._next_iteration()

    def _next_iteration(self) -> None:
        """The engine loop between iterations: its bookkeeping and, on a busy host, waiting to run again."""
        gap = self.p.iter_gap_ms(max(len(self.running), 1))
        if gap <= 0 or not (self.running or self.waiting):
            return self._iterate()
        ev = self.env.timeout(gap / 1e3)
        ev.callbacks.append(lambda _e: self._iterate())

    def _token(self, r: _Row, t: float) -> None:
        rec = r.rec
        rec.produced += 1
        if rec.produced == 1:
            self.sim._first_token(r.seq, t)
        last = rec.produced >= r.seq.output
        if rec.produced == rec.first_piece or (last and math.isnan(rec.first_gen)):
            rec.first_gen = t
        if rec.produced >= rec.first_piece:
            rec.last_gen = t
            self.m.loop.piece(rec, t, last)

    def _finish(self, r: _Row, t: float) -> None:
        self.reserved -= r.seq.prompt + r.seq.output
        r.seq.done = True
        self.sim._finish(r.seq, t)

    def _kv_mib(self, rows: list[_Row], length: int) -> float:
        return len(rows) * length * self.kv_bytes / (1 << 20)
