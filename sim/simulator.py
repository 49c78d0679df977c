"""The discrete-event simulation of one deployment (edge or central) on a fixed workload, on SimPy.

Request path: user -> entry point (half the access RTT) -> control-plane decision -> backbone to the serving site
(half its RTT) -> queue -> cold start -> prefill -> decode; every token travels back the same way, so the client
sees TTFT = network RTT + queue + cold start + prefill, and the server's inter-token gaps.

Actors are SimPy processes (the control plane's clock, faults, the utilisation sampler); arrivals
(``sim.arrival_feed``), a request reaching its node and the replica engines' wake-ups are bare timers
(``sim.timers``: the same event order as SimPy timeouts, at a fraction of the cost); each engine has one re-armable
timer (see ``sim.engine``), so events scale with requests, not tokens.

Invariant (checked at the end of every run, also under faults; ``sim.readouts``): every arrival ends exactly once
-- ok, rejected or failed.
"""

from __future__ import annotations

import gc
import time
from array import array
from dataclasses import dataclass, field
from heapq import heappush

import numpy as np
import pandas as pd
import simpy
from simpy.events import NORMAL

from controlplane.deployment import Deployment
from controlplane.outcomes import Code
from controlplane.routing import REJECT, START
from controlplane.state import Request
from sim.arrival_feed import ArrivalFeed
from sim.engine import ReplicaEngine, Seq
from sim.faults import FAULT_POLICIES
from sim.gpu_busy import GpuBusyMeter
from sim.node_faults import NodeFaults
from sim.readouts import ConservationError, Readouts
from sim.request_frame import OUT_FAILED, OUT_NONE, OUT_OK, OUT_REJECTED
from sim.timers import Timer, call_later, run_until

NAN = float("nan")


@dataclass
class SimResult:
    """What a simulation hands back: the per-request and utilisation frames, the control plane's counters
    and the simulated time it ended at."""
    deployment: str
    requests: pd.DataFrame
    utilisation: pd.DataFrame
    counters: dict = field(default_factory=dict)
    sim_end_s: float = 0.0


class Simulation(NodeFaults, Readouts):
    """Run ``workload`` (the frame from ``sim.workload``) through ``deployment``.

    ``techniques`` is the one seam for serving techniques that change how a replica runs (see
    ``sim.techniques``): ``techniques.engine(sim, replica)`` may return an engine to use instead of plain
    continuous batching, and ``techniques.amend(sim, frame)`` adds the techniques' columns to the request frame.
    Prefix caching and LoRA adapters need no hook here: their state belongs to the control plane, which the
    simulation drives like any other (``pin``/``unpin`` on start and finish, ``acquire``/``release`` adapters).
    """

    def __init__(self, deployment: Deployment, workload: pd.DataFrame, perf, faults=(), fault_policy: str = "retry",
                 sample_s: float = 60.0, progress=None, fault_handler=None, drain_s: float = 3600.0,
                 techniques=None):
        self.dep, self.plane, self.perf = deployment, deployment.plane, perf
        self.w = workload
        self.n = n = len(workload)
        self.env = simpy.Environment()
        self._queue, self._eid = self.env._queue, self.env._eid  # where sim.timers.Timer events go
        self._wake_cb, self._reach_node_cb = self._wake, self._reach_node  # bound once, used per event
        # Hops' timers that fired, pushed again with these callbacks (nothing appends to them): no new one per hop
        self._spare_timers, self._reach_node_cbs = [], [self._reach_node]
        self.faults, self.fault_handler = list(faults), fault_handler
        self.retry_unstreamed = FAULT_POLICIES.create(fault_policy)
        self.sample_s, self.progress, self.drain_s = sample_s, progress, drain_s
        self.techniques = techniques
        self.candidate_lists_s = 0.0  # wall seconds run() spent building candidate lists (set-up)
        self.arrival = workload.arrival_s.to_numpy(dtype=np.float64)
        self.key = workload[deployment.ingress_col].to_numpy(dtype=np.int64, copy=True)  # re-routed on PoP faults
        if deployment.access_col:
            access = workload[deployment.access_col].to_numpy(dtype=np.float64)
        elif "last_mile_ms" in workload:  # a last mile by country or continent (topology.last_mile)
            access = workload.last_mile_ms.to_numpy(dtype=np.float64)
        else:
            access = np.full(n, deployment.access_ms)
        # Per-request RTT variability (topology.jitter), when the scenario asks for it: scales both legs.
        self.rtt_factor = (workload.rtt_factor.to_numpy(dtype=np.float64) if "rtt_factor" in workload
                           else np.ones(n))
        self.access_s = np.array(access * self.rtt_factor / 1e3, dtype=np.float64)
        self._rtt_factor = memoryview(np.ascontiguousarray(self.rtt_factor))  # reads give plain floats
        # Model ids as codes into a short list: reading the column as Python strings would make one str per
        # request (tens of MB at a million requests, per deployment).
        codes, names = pd.factorize(workload.model)
        self.model_names = [str(m) for m in names]
        self.prompt = workload.prompt_tokens.to_numpy(dtype=np.int64)
        # Service times take the catalog's unit: speech prompts are audio seconds, priced and timed per minute.
        catalog = deployment.plane.catalog
        audio = workload.model.isin([s.id for s in catalog if s.unit == "audio-minute"]).to_numpy(dtype=bool)
        self.units = np.where(audio, self.prompt / 60.0, self.prompt)
        self.output = workload.output_tokens.to_numpy(dtype=np.int64)
        self.session = (workload.session_id.to_numpy(dtype=np.int64) if "session_id" in workload
                        else np.full(n, -1, np.int64))
        self.rib = (workload.reject_if_busy.to_numpy(dtype=bool) if "reject_if_busy" in workload
                    else np.zeros(n, bool))
        # Per-request state lives in typed arrays of the standard library: a store costs a fraction of a numpy
        # scalar store (the event loop writes each a few times per request) and memory stays 8 bytes a value.
        d, q = (lambda v: array("d", [v]) * n), (lambda v: array("q", [v]) * n)  # noqa: E731
        self.first_decision, self.decided, self.at_node, self.joined = d(NAN), d(NAN), d(NAN), d(NAN)
        self.first_token, self.finished, self.backbone_ms, self.cold_ms = d(NAN), d(NAN), d(NAN), d(0.0)
        self.stall_s, self.stalls = d(0.0), q(0)
        self.site, self.node = q(-1), q(-1)
        self.outcome, self.code, self.retries = array("b", [OUT_NONE]) * n, q(0), q(0)
        # Request fields as memoryviews of the arrays: a read gives a plain int/float/bool (numpy scalars would
        # cost more than the bookkeeping) and, unlike lists, they hold no Python object per request; the arrays
        # are mostly views of the workload, which every deployment shares.
        self._fields = tuple(memoryview(np.ascontiguousarray(a)) for a in (
            codes.astype(np.int64), self.key, self.prompt, self.output, self.arrival, self.session, self.rib))
        self._units = memoryview(np.ascontiguousarray(self.units))
        self.engines: dict[int, ReplicaEngine] = {}
        self._plain_stalls = True  # every engine's seq_stalls is ReplicaEngine's (read inline by _flush)
        self.gpu_meter = GpuBusyMeter(deployment.fleet)
        self._engine_caches: dict[tuple, tuple[dict, dict]] = {}  # (model, GPU) -> its engines' shared caches
        self.reqs: list[Request | None] = [None] * n
        self.seqs: list[Seq | None] = [None] * n
        self.remaining = n
        self.arrivals_done = False
        self.done = self.env.event()
        self._finished_buffer: list[Seq] = []
        self.samples: list[tuple] = []
        # Prefix caching and LoRA: the request fields the control plane reads (None when that technique is off).
        state = deployment.plane.state
        self.hash_ids = (workload.hash_ids.tolist() if state.prefix is not None and "hash_ids" in workload
                         else None)
        self.adapters = (workload.adapter.fillna("").astype(str).tolist()
                         if state.adapters is not None and "adapter" in workload else None)
        self.cached = array("q", [0]) * n
        if self.hash_ids is not None:
            # Engines report prefill ends, so blocks are hits only once computed (vLLM's automatic prefix caching).
            state.prefix.track_computing = True
            self._first_token = self._first_token_prefix
        self.adapter_wait_s, self.adapter_loaded = array("d", [0.0]) * n, array("b", [0]) * n
        self.arrived = array("d", [0.0]) * n  # when a request naming an adapter reached its replica

    # ---------------------------------------------------------------- bookkeeping
    def _end(self, k: int, outcome: int, code: int = 0) -> None:
        if self.outcome[k] != OUT_NONE:
            raise ConservationError(f"request {k} ended twice ({self.outcome[k]} then {outcome})")
        self.outcome[k], self.code[k] = outcome, code
        if self.adapters is not None and self.reqs[k] is not None:
            now = self.env.now
            for other, ready, loaded in self.plane.release_adapter(self.reqs[k], now):
                self._adapter_ready(other.payload, ready, loaded)
                self._join(other, self.seqs[other.payload], ready, now)
        self.reqs[k] = self.seqs[k] = None  # memory grows with in-flight requests only, not with the run
        self.remaining -= 1
        if self.remaining == 0 and self.arrivals_done and not self.done.triggered:
            self.done.succeed()

    def _engine(self, replica) -> ReplicaEngine:
        """The engine of ``replica`` (created on first use; a technique may supply its own)."""
        eng = self.engines.get(replica.id)
        if eng is None and self.techniques is not None:
            eng = self.techniques.engine(self, replica)
            if eng is not None:
                self.engines[replica.id] = eng
        if eng is None:
            caches = self._engine_caches.setdefault((replica.spec.id, replica.gpu), ({}, {}))
            eng = ReplicaEngine(replica.spec, replica.gpu, self.perf, self._arm, self._first_token, self._finish,
                                caches)
            self.engines[replica.id] = eng
        if self.hash_ids is not None and hasattr(eng, "lookup"):
            eng.lookup = self._prefix_lookup
        if getattr(type(eng), "seq_stalls", None) is not ReplicaEngine.seq_stalls:
            self._plain_stalls = False  # its stalls are not (only) those the sequence froze when it finished
        if isinstance(eng, ReplicaEngine) and eng.arm == self._arm and eng.env is None:
            eng.push_timers(self.env, self._finished_buffer, self._flush)  # what self._arm and _wake do, uncalled
        if isinstance(eng, ReplicaEngine) and eng.meter is None:
            self.gpu_meter.bind(eng, replica)
        return eng

    def _arm(self, eng: ReplicaEngine, t: float, version: int) -> None:
        now = self.env._now
        delay = t - now  # (the delay and the sum exactly as env.timeout(max(0.0, t - now)) computes them)
        heappush(self._queue, (now + (delay if delay > 0.0 else 0.0), NORMAL, next(self._eid),
                               Timer(self._wake_cb, (eng, version))))

    def _wake(self, ev) -> None:
        eng, version = ev._value
        eng.wake(self.env._now, version)
        if self._finished_buffer:
            self._flush()

    def _first_token(self, seq: Seq, t: float) -> None:
        self.first_token[seq.rec] = t

    def _first_token_prefix(self, seq: Seq, t: float) -> None:
        self.first_token[seq.rec] = t
        self.prefill_done(seq)

    def prefill_done(self, seq: Seq) -> None:
        """``seq``'s prefill ended: its prefix blocks become hits for requests whose prefill starts later."""
        if self.hash_ids is not None:
            req = self.reqs[seq.rec]
            if req is not None:
                self.plane.prefix_computed(req)

    def _prefix_lookup(self, seq: Seq) -> int:
        """``seq``'s prefill starts: its prefix-cache hit, counting blocks computed since it was routed."""
        k = seq.rec
        self.cached[k] = cached = self.plane.prefix_hit(self.reqs[k])
        return min(cached, max(0, seq.prompt - 1)) if cached else 0  # at least one token computed (its logits)

    def _finish(self, seq: Seq, t: float) -> None:
        self._finished_buffer.append(seq)

    def _flush(self) -> None:
        """Complete finished sequences outside the engine's own call (their slots may start queued requests)."""
        buf, env, reqs, engines, finish = self._finished_buffer, self.env, self.reqs, self.engines, self.plane.finish
        plain = self._plain_stalls and self.adapters is None
        while buf:
            seq = buf.pop()
            k = seq.rec
            now = env._now
            self.finished[k] = now
            req = reqs[k]
            if plain and seq.stalls_at_end is not None:
                # (what ReplicaEngine.seq_stalls returns for a finished sequence) and self._end(k, OUT_OK), inlined:
                # once per request
                self.stall_s[k], self.stalls[k] = seq.stalls_at_end
                if self.outcome[k] != OUT_NONE:
                    raise ConservationError(f"request {k} ended twice ({self.outcome[k]} then {OUT_OK})")
                self.outcome[k], self.code[k] = OUT_OK, 0
                reqs[k] = self.seqs[k] = None
                self.remaining -= 1
                if self.remaining == 0 and self.arrivals_done and not self.done.triggered:
                    self.done.succeed()
            else:
                self.stall_s[k], self.stalls[k] = engines[req.replica.id].seq_stalls(seq)
                self._end(k, OUT_OK)
            for started in finish(req, now):
                self._start(started, now)

    # ---------------------------------------------------------------- request path
    def _submit(self, k: int, now: float) -> None:
        req = self.reqs[k]
        handler = self.fault_handler
        if handler is not None and handler.down_pops:
            before = int(self.key[k])
            ingress = handler.reingress(self, k)
            if req is not None:
                req.ingress = ingress  # a retry: decided again where it entered, or at the next live PoP
            elif ingress != before:
                # Its PoP is down: the request enters at the next-nearest live one, which it reaches later than
                # the one it was sent to (the feed's time): decided there, at arrival + the new access / 2.
                due = float(self.arrival[k] + self.access_s[k] / 2)
                if due > now:
                    call_later(self.env, due - now, self._submit_due, k)
                    return
        if req is None:
            model, key, prompt, output, arrival, session, rib = self._fields
            s = session[k]
            # (id, model, ingress, prompt, output, arrival, session, reject_if_busy): positional is cheaper
            req = Request(k, self.model_names[model[k]], key[k], prompt[k], output[k], arrival[k],
                          None if s < 0 else s, rib[k], payload=k)
            if self.hash_ids is not None:
                req.hash_ids = self.hash_ids[k]
            if self.adapters is not None:
                req.adapter = self.adapters[k]
            self.reqs[k] = req
            self.first_decision[k] = now
        d = self.plane.submit(req, now)
        self.decided[k] = now
        action = d.action
        if action == REJECT:
            self._end(k, OUT_REJECTED, d.code or int(Code.OUT_OF_CAPACITY))
            return
        r = d.replica
        self.backbone_ms[k] = backbone = d.rtt_ms * self._rtt_factor[k]
        self.site[k], self.node[k] = r.site, r.node
        self.at_node[k] = now + backbone / 2e3
        if action == START:
            self._start(req, now)

    def _submit_due(self, ev) -> None:
        self._submit(ev._value, self.env._now)

    def _start(self, req: Request, now: float) -> None:
        """The control plane started ``req`` (now or from a queue): it joins its replica once it is there."""
        k = req.payload
        r = req.replica
        self.node[k] = r.node  # a site queue's head may start on any of the site's replicas
        # Its cold start is the load of the replica it starts on, not of the one it queued at: another replica of
        # the site may have freed a slot before that load ended.
        at = self.at_node[k]
        cold = r.ready_at - at
        self.cold_ms[k] = cold * 1e3 if cold > 0.0 else 0.0
        self.seqs[k] = seq = Seq(k, self._units[k], self._fields[3][k])
        self.cached[k] = cached = req.cached_tokens
        if cached:  # prefix-cache hit: prefill skips it, but computes at least one token (its logits)
            seq.cached = min(cached, max(0, seq.prompt - 1))
        if req.adapter:  # LoRA: wait for the adapter's copy, or for a free adapter slot (None: joins later)
            self.arrived[k] = at = max(at, now)
            got = self.plane.acquire_adapter(req, at)
            if got is None:
                return
            at = self._adapter_ready(k, *got)
            self._join(req, seq, at, now)
            return
        # self._join(req, seq, at, now), inlined: once per request
        eng = self.engines.get(r.id) or self._engine(r)
        if at > now:
            self.joined[k] = at
            if self._spare_timers:  # a hop's timer that fired, pushed once more
                timer = self._spare_timers.pop()
                timer.callbacks, timer._value = self._reach_node_cbs, (eng, seq)
            else:
                timer = Timer(self._reach_node_cb, (eng, seq))
            heappush(self._queue, (self.env._now + (at - now), NORMAL, next(self._eid), timer))
        else:
            self.joined[k] = now
            eng.join(seq, now)
            if self._finished_buffer:
                self._flush()

    def _adapter_ready(self, k: int, ready: float, loaded: bool) -> float:
        self.adapter_wait_s[k], self.adapter_loaded[k] = ready - self.arrived[k], loaded
        return ready

    def _join(self, req: Request, seq: Seq, at: float, now: float) -> None:
        """``seq`` joins its replica's batch at ``at`` (now or later)."""
        k = req.payload
        r = req.replica
        eng = self.engines.get(r.id) or self._engine(r)
        if at > now:
            self.joined[k] = at
            heappush(self._queue, (self.env._now + (at - now), NORMAL, next(self._eid),
                                   Timer(self._reach_node_cb, (eng, seq))))
        else:
            self.joined[k] = now
            eng.join(seq, now)
            if self._finished_buffer:
                self._flush()

    def _reach_node(self, ev) -> None:
        eng, seq = ev._value
        self._spare_timers.append(ev)  # popped (its callbacks taken): _start may push it again
        eng.join(seq, self.env._now)
        if self._finished_buffer:
            self._flush()

    # ---------------------------------------------------------------- processes
    def arrivals_finished(self) -> None:
        """The arrival feed (``sim.arrival_feed``) submitted its last request."""
        self.arrivals_done = True
        if self.remaining == 0 and not self.done.triggered:
            self.done.succeed()

    def _clock(self):
        """The control plane's timers: finished loads, queue timeouts, autoscaling."""
        env = self.env
        while True:
            started, expired = self.plane.poll(env.now)
            for req in started:
                self._start(req, env.now)
            for req in expired:
                self._end(req.payload, OUT_REJECTED, int(Code.TIMEOUT))
            nxt = min(self.plane.next_wakeup(), env.now + 1.0)
            yield env.timeout(max(nxt - env.now, 1e-3))

    # ---------------------------------------------------------------- run
    def run(self) -> SimResult:
        env = self.env
        ArrivalFeed(self).start()
        env.process(self._clock())
        env.process(self._sampler())
        for f in self.faults:
            env.process(self._faults(f))
        horizon = (float(self.arrival.max()) if self.n else 0.0) + self.drain_s
        # Everything built so far (topology, placement, candidate lists) lives for the whole run: frozen, the
        # garbage collector's full passes stop walking it (they cost 100+ ms each on a large deployment).
        gc.freeze()
        # The candidate lists of every (ingress, model) pair the workload names, built at once and frozen with the
        # rest: a central deployment answers tens of thousands of user cities, and built one miss at a time during
        # the run, with the collector walking them, they cost several times as much.
        t0 = time.perf_counter()
        self.plane.state.precompute_pairs(self.key, self._fields[0], self.model_names)
        self.candidate_lists_s = time.perf_counter() - t0
        gc.freeze()
        try:
            if self.n:
                run_until(env, simpy.AnyOf(env, [self.done, env.timeout(horizon)]))
        finally:
            gc.unfreeze()
        end = env.now
        if self.remaining:
            open_ = [k for k, o in enumerate(self.outcome) if o == OUT_NONE]
            # Requests still queued or running at the horizon are timed out, so that each ends exactly once.
            for k in open_:
                streamed = self.first_token[k] == self.first_token[k]
                self._end(k, OUT_FAILED if streamed else OUT_REJECTED, int(Code.TIMEOUT))
        self.check_conservation()
        return SimResult(self.dep.name, self.frame(), self.utilisation_frame(), dict(self.plane.counts), end)
