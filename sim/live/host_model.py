"""The live host, modelled: what the simulator adds when it is asked to predict the emulation on this machine.

The plain simulator gives every replica a device of its own and a client nothing but network delay. The live
gateway runs every replica's engine as a thread of one process on a few shared cores, and serves tokens through
an event loop. With ``host_model`` on, the fidelity mirror (:mod:`sim.live.fidelity`) hands the simulation a
:class:`LiveHost` seam that models exactly that, from a profile measured on the host
(:func:`sim.live.host_profile.measure_host_profile`):

* **replica engines as the live engine iterates** (:class:`sim.live.host_engine.LiveHostEngine`, mirroring
  :class:`dataplane.engine_lm.LMEngine`): a request that arrives mid-iteration waits for it to end; prompts
  admitted together are prefilled in one call left padded to the longest (``prefill`` rows by batch and length);
  the iteration then runs one decode step for every running sequence, padded to the longest context (``decode``
  rows); prompts joining a running batch merge their KV into its (``kv_merge`` rows, measured inside the live
  engine; ``kv_copy`` rows' copying rate without them), and running sequences stall while others prefill and
  merge (prefill/decode interference);
* **the shared host** (:class:`HostCPU`): every engine iteration and every piece the event loop streams is a job
  on one processor-sharing host. k busy engines each run at the measured ``host_share`` slowdown of k engines
  decoding at once in one process (interpolated in k; past the largest k measured, grown as the fit grows), a
  merge or a trim at the measured ``host_share_merge`` slowdown of one merge beside k - 1 decoding engines; the
  event loop at the pace of the scarcer of the cores the process gets and the interpreter lock (an engine holds
  it part of its time, the event loop all of it), both fitted to the same rows
  (:func:`sim.live.host_params.fit_host_share`);
* **the gateway's own costs**: per request the HTTP hop in, validation and tokenizing, the control plane's
  decision, the hand-off to the engine; per piece the event loop's CPU (a FIFO job on the host) and its
  latency beyond the injected WAN delay; the stream's tail and the hop back to the client (``gw_*`` rows,
  measured through the live gateway's timelines).

Nothing here scales a result: every time comes from a measured service time and the simulated sequence of
iterations, jobs and delays, and the decomposition it reports (``c_*`` columns) adds up to its E2E.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pandas as pd

from sim.live.decompose import E2E_PARTS, PER_TOKEN
from sim.live.host_engine import LiveHostEngine
from sim.live.host_params import HostParams

ENGINE, LOOP, COPY = 0, 1, 2  # the kinds of HostCPU's jobs (indices of its rates)


class HostCPU:
    """Processor sharing of the live host among its busy threads (engines, the event loop), each at ``1 /
    slowdown`` of its measured speed. ``run(work_s, done)`` calls ``done()`` when the job's work is through; a
    ``copy`` job (an engine merging or trimming KV) is an engine's thread at :meth:`HostParams.copy_slowdown`."""

    def __init__(self, sim, params: HostParams):
        self.sim, self.env, self.params = sim, sim.env, params
        self.jobs: dict[int, list] = {}  # id -> [work left (s), done, kind: ENGINE, LOOP or COPY]
        self.loops = 0
        self.t = 0.0
        self.version = 0
        self._ids = itertools.count()

    def run(self, work_s: float, done, loop: bool = False, copy: bool = False) -> None:
        self._advance()
        self.jobs[next(self._ids)] = [max(work_s, 0.0), done, LOOP if loop else COPY if copy else ENGINE]
        self.loops += loop
        self._plan()

    def _rates(self) -> tuple[float, float, float]:
        """(engine, event loop, copy) speeds now. An engine's measured step already includes the event loop's
        work on its own batch's pieces (the profile is read inside the gateway), so engines slow down for each
        other only; the loop slows down for everything; a copy is an engine's thread, at its own pace."""
        engines = len(self.jobs) - self.loops
        return (1.0 / self.params.slowdown(engines), 1.0 / self.params.slowdown(engines, self.loops),
                1.0 / self.params.copy_slowdown(engines))

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.t
        if dt > 0 and self.jobs:
            rates = self._rates()
            for job in self.jobs.values():
                job[0] -= dt * rates[job[2]]
        self.t = now

    def _plan(self) -> None:
        self.version += 1
        if not self.jobs:
            return
        rates = self._rates()
        ev = self.env.timeout(min(max(job[0], 0.0) / rates[job[2]] for job in self.jobs.values()))
        ev.callbacks.append(lambda _e, v=self.version: self._fire(v))

    def _fire(self, version: int) -> None:
        if version != self.version:
            return
        self._advance()
        done = [jid for jid, job in self.jobs.items() if job[0] <= 1e-9]
        jobs = [self.jobs.pop(jid) for jid in done]
        self.loops -= sum(j[2] == LOOP for j in jobs)
        fns = [j[1] for j in jobs]
        for fn in fns:
            fn()
        self._plan()
        if self.sim._finished_buffer:
            self.sim._flush()


class Rec:
    """What the host model records of one request (simulated seconds)."""

    __slots__ = ("joined", "submitted", "admitted", "first_gen", "last_gen", "first_sent", "last_sent", "decode_s",
                 "stall_s", "stalls", "steps", "produced", "first_piece", "back_s", "batch_sum", "kv_len_sum")

    def __init__(self, first_piece: int, back_s: float):
        self.joined = self.submitted = self.admitted = math.nan
        self.first_gen = self.last_gen = self.first_sent = self.last_sent = math.nan
        self.decode_s = self.stall_s = 0.0
        self.stalls = self.steps = self.produced = self.batch_sum = self.kv_len_sum = 0
        self.first_piece, self.back_s = max(int(first_piece), 1), back_s


class EventLoop:
    """The gateway's event loop streaming pieces: a FIFO thread whose work runs on the shared host. Each piece
    costs it twice: when the engine hands it over (the hop onto the loop, the timer of the return delay) and
    when the delay is over (SSE framing, the socket write); each half of the measured CPU per piece."""

    def __init__(self, host: HostCPU, params: HostParams):
        self.host, self.params = host, params
        self.queue: collections.deque = collections.deque()
        self.busy = False
        self.pending = 0  # pieces produced and not yet written out
        self.drained = None  # an event to succeed when pending drops to 0

    def drain(self) -> None:
        """Run the simulation on until every piece produced is written out: the simulation ends when the last
        request finishes at its engine, but its last pieces are still on their way to the client then."""
        if self.pending:
            self.drained = self.host.env.event()
            self.host.env.run(until=self.drained)

    def piece(self, rec: Rec, t_gen: float, last: bool) -> None:
        """A piece produced now (``t_gen``) by an engine."""
        self.pending += 1
        self._work(lambda: self._handed_over(rec, t_gen, last))

    def _handed_over(self, rec: Rec, t_gen: float, last: bool) -> None:
        env = self.host.env
        ev = env.timeout(max(0.0, t_gen + rec.back_s - env.now))  # the injected return delay
        ev.callbacks.append(lambda _e: self._work(lambda: self._written(rec, last)))

    def _work(self, done) -> None:
        self.queue.append(done)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if not self.queue:
            self.busy = False
            return
        self.busy = True
        done = self.queue.popleft()
        self.host.run(self.params.gw["piece_cpu"] / 2e3, lambda: (done(), self._next()), loop=True)

    def _written(self, rec: Rec, last: bool) -> None:
        # The part of a piece's measured latency that is not loop CPU: thread hand-off and timer wake-ups.
        t = self.host.env.now + max(self.params.gw["piece"] - self.params.gw["piece_cpu"] / 2, 0.0) / 1e3
        if math.isnan(rec.first_sent):
            rec.first_sent = t
        if last:
            rec.last_sent = t
        self.pending -= 1
        if self.pending == 0 and self.drained is not None and not self.drained.triggered:
            self.drained.succeed()


class LiveHost:
    """The seam a :class:`sim.simulator.Simulation` takes as ``techniques``: live-host engines for every replica
    (one shared host and event loop), and the request frame's client-side times and components."""

    def __init__(self, params: HostParams, workload: pd.DataFrame, client_arrival: np.ndarray,
                 kv_bytes_per_token: dict[str, float]):
        self.params = params
        self.kv_bytes_per_token = kv_bytes_per_token  # catalog model id -> bytes of KV cache per token
        self.first_piece = (workload.first_piece_token.fillna(1).to_numpy(np.int64)
                            if "first_piece_token" in workload else np.ones(len(workload), np.int64))
        self.client_arrival = client_arrival
        self.recs: dict[int, Rec] = {}
        self.host: HostCPU | None = None
        self.loop: EventLoop | None = None
        self.sim = None

    def rec(self, k: int) -> Rec:
        rec = self.recs.get(k)
        if rec is None:
            sim = self.sim
            back_s = (sim.access_s[k] + sim.backbone_ms[k] / 1e3) / 2
            rec = self.recs[k] = Rec(self.first_piece[k], back_s)
        return rec

    def engine(self, sim, replica):
        if not replica.spec.generative:
            return None  # the live host model covers the LM engine; other tasks keep the plain engine
        if self.host is None:
            self.sim = sim
            self.host = HostCPU(sim, self.params)
            self.loop = EventLoop(self.host, self.params)
        return LiveHostEngine(self, sim, replica)

    def amend(self, sim, frame: pd.DataFrame) -> pd.DataFrame:
        """Client-side TTFT, TPOT and E2E from the modelled delivery of first and last pieces, the client's send
        time as ``arrival_s``, and every component as ``c_<name>`` (ms)."""
        if self.loop is not None:
            self.loop.drain()
        gw = self.params.gw
        n = len(frame)
        cols = {f"c_{k}": np.full(n, np.nan) for k in (*E2E_PARTS, "first_delivery", *PER_TOKEN)}
        ttft, e2e = np.full(n, np.nan), np.full(n, np.nan)
        ok = (frame.outcome == "ok").to_numpy()
        queue = frame.queue_ms.to_numpy() + frame.cold_start_ms.fillna(0.0).to_numpy()
        net = frame.network_rtt_ms.to_numpy()
        prompt = frame.prompt_tokens.to_numpy()
        for i in np.flatnonzero(ok):
            rec = self.recs.get(i)
            if rec is None or math.isnan(rec.last_sent):
                continue
            send = self.client_arrival[i]
            first_seen = rec.first_sent + gw["http_out"] / 1e3
            end = rec.last_sent + (gw["tail"] + gw["http_out"]) / 1e3
            ttft[i], e2e[i] = (first_seen - send) * 1e3, (end - send) * 1e3
            to_last = (rec.last_gen - rec.first_gen) * 1e3
            part = {
                "http_in": gw["http_in"], "prepare": self.params.prepare_ms(int(prompt[i])),
                "wan_in": net[i] / 2, "admission": gw["admission"], "queue": queue[i], "dispatch": gw["dispatch"],
                "engine_wait": (rec.admitted - rec.submitted) * 1e3, "prefill": (rec.first_gen - rec.admitted) * 1e3,
                "decode": min(rec.decode_s * 1e3, to_last), "stall": rec.stall_s * 1e3, "wan_out": rec.back_s * 1e3,
                "stream": (rec.last_sent - rec.last_gen - rec.back_s) * 1e3, "tail": gw["tail"],
                "http_out": gw["http_out"], "first_delivery": (first_seen - rec.first_gen) * 1e3,
                "step_ms": rec.decode_s * 1e3 / rec.steps if rec.steps else np.nan,
                "stream_per_piece_ms": gw["piece"],
                "step_batch": rec.batch_sum / rec.steps if rec.steps else np.nan,
                "step_kv_len": rec.kv_len_sum / rec.steps if rec.steps else np.nan,
            }
            part["stall"] = min(part["stall"], to_last - part["decode"])
            part["engine_loop"] = to_last - part["decode"] - part["stall"]
            for k, v in part.items():
                cols[f"c_{k}"][i] = v
        out = frame.copy()
        out["arrival_s"] = self.client_arrival
        out["ttft_ms"], out["e2e_ms"] = ttft, e2e
        tokens = out.output_tokens.to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            out["tpot_ms"] = np.where(tokens > 1, (e2e - ttft) / np.maximum(tokens - 1, 1), np.nan)
        for k, v in cols.items():
            out[k] = v
        return out
