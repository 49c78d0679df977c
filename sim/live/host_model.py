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
  rows); prompts joining a running batch copy its KV cache (``kv_copy``), and running sequences stall while
  others prefill (prefill/decode interference);
* **the shared host** (:class:`HostCPU`): every engine iteration and every piece the event loop streams is a job
  on one processor-sharing host. k busy engines each run at the measured ``host_share`` slowdown of k engines
  decoding at once in one process (interpolated in k); the event loop, and engine counts beyond the measured
  ones, at the pace of the scarcer of the cores the process gets and the interpreter lock (an engine holds it
  part of its time, the event loop all of it), both fitted to the same rows (:func:`fit_host_share`);
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

from edgepop.errors import UserError
from sim.live.decompose import E2E_PARTS, PER_TOKEN
from sim.live.host_engine import LiveHostEngine

GW_PARTS = ("http_in", "prepare", "admission", "dispatch", "piece", "piece_cpu", "tail", "http_out")


def fit_host_share(k: np.ndarray, slowdown: np.ndarray, max_cores: float, loop: np.ndarray | None = None,
                   client: np.ndarray | None = None) -> tuple[float, float]:
    """(cores, lock) of :func:`share_slowdown` closest (in log) to the measured slowdowns of ``k`` engines.

    ``loop`` and ``client``: the cores the gateway's event loop and the measuring client kept busy while each k was
    measured. They ran beside the engines (the loop holding the interpreter lock, the client in its own process),
    so they count as that many more busy threads; without them the fit reads their share as fewer cores. ``k[0]``
    is 1: the slowdowns are ratios to it."""
    loop = np.zeros(len(k)) if loop is None else np.asarray(loop, dtype=float)
    client = np.zeros(len(k)) if client is None else np.asarray(client, dtype=float)
    threads = np.asarray(k, dtype=float) + loop + client
    best = (np.inf, max_cores, 0.0)
    for cores in np.arange(0.5, max_cores + 1e-9, 0.05):
        for lock in np.arange(0.0, 2.0001, 0.01):
            model = np.array([share_slowdown(t, n * lock + u, cores, lock)
                              for t, n, u in zip(threads, k, loop, strict=True)])
            model = model / model[0]  # the measured slowdowns are ratios to k = 1
            err = float(np.sum((np.log(model) - np.log(slowdown)) ** 2))
            if err < best[0] - 1e-12:
                best = (err, float(cores), float(lock))
    return best[1], best[2]


def share_slowdown(threads: float, lock_demand: float, cores: float, lock: float) -> float:
    """How much slower than alone each busy thread runs: ``threads`` busy threads need ``threads / cores`` of
    the cores and ``lock_demand`` of the interpreter lock (each engine ``lock`` of its time, the event loop all
    of it); the scarcer one sets the pace. Relative to one engine alone (which the profile's times already are).
    """
    alone = max(1.0, 1.0 / cores, lock)
    return max(1.0, threads / cores, lock_demand) / alone


# How the engines' pace is read off the host_share rows: the rows themselves, or the cores-and-lock fit alone (the
# reading used before the rows were read directly; kept to reproduce and compare).
SHARE_READINGS = ("measured", "fitted")

# Rows the live-host model cannot do without: a table lacking one would model that part of the host as free (0 ms).
# (``iter_gap`` may be missing: an engine timed alone, ``--engine-profile alone``, has no loop between iterations.)
HOST_ROWS = {"host_share": "host_share", "kv_copy": "kv_copy", "gw_*": "gw_"}


def missing_host_rows(table: pd.DataFrame) -> list[str]:
    """The host-model row groups (:data:`HOST_ROWS`) that ``table`` has none of."""
    phases = pd.Series(table["phase"] if "phase" in table else [], dtype=object).astype(str)
    return [name for name, start in HOST_ROWS.items()
            if not (phases == start).any() and not (start.endswith("_") and phases.str.startswith(start).any())]


def require_host_rows(table: pd.DataFrame, source, engines: int = 2) -> None:
    """A one-line error when ``table`` (from ``source``, a path or a phrase) lacks host-model rows. ``engines``:
    the replicas of the replayed model sharing the host; with one, there is no sharing to measure (a served
    profile has no ``host_share`` rows then) and none is asked for."""
    missing = missing_host_rows(table)
    if engines < 2:
        missing = [name for name in missing if name != "host_share"]
    if missing:
        raise UserError(f"{source}: no {', '.join(missing)} rows, which the live-host model needs (a table of "
                        "`edgepop replay --profile-source host`, the default, has them); or pass --host-model off")


class HostParams:
    """The host-model figures of one profile table (``host_share``, ``kv_copy`` and ``gw_*`` rows).

    ``host_share`` rows give the slowdown of k engines decoding at once. The engines' pace is read off them
    directly (:meth:`slowdown`); :func:`fit_host_share` reads them as the cores this process gets and the share
    of an engine's time it holds the interpreter lock, for what the rows do not measure: the event loop's pace
    beside the engines, and more engines than were measured. (The two-figure fit alone could not follow the
    measured curve: on two cores the step of 4 engines at once is 2.2-2.6x that of one, more than the 2x that
    sharing two cores explains, and the fit, splitting the difference, read k = 2 9-16% and k = 4 2-14% too fast.)"""

    def __init__(self, table: pd.DataFrame, max_batch: int = 32, kv_budget_tokens: int = 32768,
                 max_cores: float = 2.0, share: str = "measured"):
        if share not in SHARE_READINGS:
            raise UserError(f"host share reading: unknown {share!r} (known: {', '.join(SHARE_READINGS)})")
        self.max_batch, self.kv_budget = int(max_batch), int(kv_budget_tokens)
        reading, share = share, table[table.phase == "host_share"].groupby("batch_size").ms.median().sort_index()
        self.cores, self.lock, self.max_cores = float(max_cores), 0.0, float(max_cores)
        self._share = None  # (k, measured slowdown of k engines at once, ratio to k = 1)
        if len(share) > 1 and 1 in share.index:
            share = share.loc[1:]
            if reading == "measured":
                self._share = (share.index.to_numpy(float), share.to_numpy() / share.loc[1])
            beside = {name: table[table.phase == f"host_share_{name}"].groupby("batch_size").ms.median()
                      .reindex(share.index).fillna(0.0).to_numpy() / 1e3 for name in ("loop", "client")}
            self.cores, self.lock = fit_host_share(share.index.to_numpy(float), share.to_numpy() / share.loc[1],
                                                   max_cores, beside["loop"], beside["client"])
        gap = table[table.phase == "iter_gap"].groupby("batch_size").ms.mean().sort_index()
        self._gap = (gap.index.to_numpy(float), gap.to_numpy(float)) if len(gap) else None
        copy = table[table.phase == "kv_copy"].groupby("tokens").ms.median().sort_index()
        self._copy = (copy.index.to_numpy(float), copy.to_numpy(float)) if len(copy) else None
        self.gw: dict[str, float] = {}
        self._prepare = None
        for part in GW_PARTS:
            rows = table[table.phase == f"gw_{part}"]
            self.gw[part] = float(rows.ms.median()) if len(rows) else 0.0
            if part == "prepare" and rows.tokens.nunique() > 1:
                g = rows.groupby("tokens").ms.median().sort_index()
                self._prepare = (g.index.to_numpy(float), g.to_numpy(float))

    def iter_gap_ms(self, batch: int) -> float:
        """The engine loop's time between two iterations of a ``batch``-row batch (interpolated in the measured
        batch sizes, the nearest one outside them; one measured size: that figure for every batch)."""
        if self._gap is None:
            return 0.0
        return float(np.interp(batch, *self._gap))

    def slowdown(self, engines: int, loops: int = 0) -> float:
        """Per-thread slowdown with ``engines`` engine threads and ``loops`` event-loop threads busy.

        Engines alone (``loops`` 0, the engines' own pace: their measured steps include the loop's work on their
        pieces) take the measured ``host_share`` ratio for that many engines; past the largest k measured, that
        ratio grown as the fit grows; never faster than ``engines`` sharing the host's cores allows (rows measured
        on another host, or by a loaded client, can say less). The event loop's pace (``loops`` > 0) is the fitted
        model's."""
        if engines + loops <= 1:
            return 1.0
        if loops == 0 and self._share is not None:
            ks, ratios = self._share
            if engines <= ks[-1]:
                measured = float(np.interp(engines, ks, ratios))
            else:
                measured = float(ratios[-1]) * self._fitted(engines, 0) / self._fitted(int(ks[-1]), 0)
            return max(measured, share_slowdown(engines, 0.0, self.max_cores, 0.0), 1.0)
        return self._fitted(engines, loops)

    def _fitted(self, engines: int, loops: int) -> float:
        if engines + loops <= 1:
            return 1.0
        return share_slowdown(engines + loops, engines * self.lock + loops, self.cores, self.lock)

    def copy_ms(self, mib: float) -> float:
        """Copying ``mib`` MiB of KV arrays (piecewise linear in the measured sizes, proportional below them)."""
        if self._copy is None or mib <= 0:
            return 0.0
        xs, ys = self._copy
        if mib <= xs[0] or len(xs) == 1:
            return float(ys[0] * mib / xs[0])
        if mib <= xs[-1]:
            return float(np.interp(mib, xs, ys))
        return float(ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (mib - xs[-1]))

    def prepare_ms(self, prompt_tokens: int) -> float:
        if self._prepare is None:
            return self.gw["prepare"]
        return float(np.interp(prompt_tokens, *self._prepare))

    def front_ms(self, prompt_tokens: int) -> float:
        """Client send -> the control plane decides, less the injected delay: HTTP in, prepare, admission."""
        return self.gw["http_in"] + self.prepare_ms(prompt_tokens) + self.gw["admission"]


class HostCPU:
    """Processor sharing of the live host among its busy threads (engines, the event loop), each at ``1 /
    slowdown`` of its measured speed. ``run(work_s, done)`` calls ``done()`` when the job's work is through."""

    def __init__(self, sim, params: HostParams):
        self.sim, self.env, self.params = sim, sim.env, params
        self.jobs: dict[int, list] = {}  # id -> [work left (s), done, is the event loop's]
        self.loops = 0
        self.t = 0.0
        self.version = 0
        self._ids = itertools.count()

    def run(self, work_s: float, done, loop: bool = False) -> None:
        self._advance()
        self.jobs[next(self._ids)] = [max(work_s, 0.0), done, loop]
        self.loops += loop
        self._plan()

    def _rates(self) -> tuple[float, float]:
        """(engine, event loop) speeds now. An engine's measured step already includes the event loop's work on
        its own batch's pieces (the profile is read inside the gateway), so engines slow down for each other
        only; the loop slows down for everything."""
        engines = len(self.jobs) - self.loops
        return 1.0 / self.params.slowdown(engines), 1.0 / self.params.slowdown(engines, self.loops)

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
        self.loops -= sum(j[2] for j in jobs)
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
