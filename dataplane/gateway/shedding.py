"""Fast load shedding: refuse a request at once when its estimated wait exceeds a bound, and say when to retry.

Clock-free like the control plane (every method takes ``now``); :mod:`dataplane.gateway.admission` drives it.

What is counted. Work is counted per *engine*, the thing that really executes requests: every emulated replica has
an engine of its own, so the key is the replica. For each engine the shedder knows the requests admitted and not
yet finished (``outstanding``: waiting in a control-plane queue, inside the engine, or running) and measures

* its drain rate ``mu``: work finished per second of busy time (time with work outstanding), an exponentially
  weighted average over the last ``window_s`` busy seconds or ``WINDOW_LATENCIES`` mean request times,
  whichever is longer, so it is the rate at the load the engine is under now, batching included. Work is the
  request's size in the engine's own terms, given by the caller: decode steps for a generation (its
  ``max_tokens`` plus one for the prefill), items for an encoder;
* ``solo``: seconds per unit of work of a request with the engine to itself (the average over requests admitted
  to an idle engine that finished before any other was admitted); until one has been seen, ``1 / mu``;
* the mean absolute error of its own estimates (below), over about ``1 / ERROR_WEIGHT`` requests and over about
  ``1 / SLOW_ERROR_WEIGHT`` requests; the margin takes the larger, so it widens at once and narrows slowly.

Engines that share a host. On a CPU the stand-in engines of all replicas share the machine's cores
(``parallel``: how many engines it runs at full speed at once, cores / threads per engine), so a third busy
engine on two cores slows the two others to 2/3 at once, long before their measured rates show it. Busy time is
therefore counted at the host share the engine had (its rate is work per full-speed second) and an estimate
uses the share it will have, with the engine counting as busy and at least as many engines busy as the most
seen at once over the last ``BUSY_HOLD_S`` (a burst that wakes one engine soon wakes the others). On GPUs each
replica's engine is its own device: ``parallel`` is None and every share is 1.

What is estimated. A batching engine shares its rate among the requests it holds, so a request of ``work``
admitted now, with ``outstanding`` others, is done after about ``(outstanding + 1) * work / mu`` (Little's law
when all requests are alike), and never sooner than alone, ``solo * work``. Requests spread around that mean
(and one admitted just before a burst shares the engine with the burst), so a margin ``excess`` = ``SPREAD`` x
the mean absolute error is added (the 99th percentile of a Laplace spread, whose tail is heavier than a normal
one's, as the errors on a shared CPU are; at most half of ``max_wait_s``). A new request's *wait* is what the busy engine adds to its time alone::

    wait = max((outstanding + 1) * work / mu, solo * work) + excess - solo * work

This counts both ways a busy engine delays a request: waiting for a place in the batch, and running in a bigger
batch (on a CPU a decode step of 32 sequences costs several times one of a single sequence; on a GPU about the
same). A request is shed (429, code 3040) when ``wait`` exceeds ``max_wait_s``, so admitted requests take about
``solo + max_wait_s`` at most, up to their 99th percentile, by construction: rate, solo time and spread are
measured on the engine as it runs, and a faster or slower engine changes how many requests are admitted, not how
long they take. It holds while the engine's speed holds: when another process suddenly takes the cores, the rate
lags by about one window and the requests admitted meanwhile take longer. Requests of very different sizes on
one engine widen the spread, so fewer are admitted.

The rate is only known at the load it was measured at, so it is not extrapolated far: beyond the engine's batch
(``concurrency(key)``) outstanding requests may grow to at most ``GROWTH`` x their recent busy-time average (a slow
start, as TCP's). Otherwise a burst arriving at an engine measured under light load would all be admitted on a
rate the burst itself makes wrong. Before an engine has finished anything it admits up to its batch and sheds
beyond; an idle engine always admits.

``Retry-After``. A shed request is told when the backlog will have drained to the admission bound
(``wait - max_wait_s`` at the current rate), and successive shed requests get successive places after that,
``work / mu`` apart (a virtual queue ending at ``horizon_s`` at most), so clients that honour it come back at the
rate the engine can take them instead of all at once.

The design was checked on a simulated continuous-batching engine (CPU-like and GPU-like step costs, mixed request
sizes, 1 to 256 closed-loop clients; ``tests/dataplane/gateway/test_shedding.py``) and live with
``benchmarks/loadtest_gateway.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_WINDOW_S = 1.0
DEFAULT_HORIZON_S = 60.0
SOLO_WEIGHT = 0.2  # of a new solo sample in its running average
SPREAD = 4.0  # excess margin in mean absolute errors (the 99th percentile of a Laplace spread: ln(50) = 3.9 MAE)
ERROR_WEIGHT = 1 / 32  # of a new estimate error in its running mean
SLOW_ERROR_WEIGHT = 1 / 256  # the same over a longer memory: the margin takes the larger of the two
GROWTH = 1.5  # outstanding requests may grow to this times their measured average (beyond the batch)
BUSY_HOLD_S = 10.0  # a host share estimate assumes the most engines busy at once over this long
WINDOW_LATENCIES = 2.0  # the rate's averaging window spans at least this many mean request times


@dataclass(frozen=True)
class Ticket:
    """What the shedder noted when it admitted a request (hand it back to :meth:`LoadShedder.finished`)."""

    key: object
    at: float
    work: float
    epoch: int
    alone: bool
    estimate_s: float | None  # the time the request was expected to take (None: no rate yet)


@dataclass
class EngineLoad:
    """What the shedder knows about one engine (work in the caller's units: decode steps, items)."""

    outstanding: int = 0
    busy_s: float = 0.0  # exponentially weighted busy time
    done: float = 0.0  # exponentially weighted work finished over the same time
    finished: int = 0  # completions ever
    solo_s: float | None = None  # average seconds per unit of work of a request alone on the engine
    epoch: int = 0  # admissions ever
    last: float = 0.0  # time of the last update
    promised: float = -math.inf  # the end of the virtual retry queue
    mae_s: float = 0.0  # mean absolute error of the time estimates (recent requests)
    mae_slow_s: float = 0.0  # the same over about 256 requests
    latency_s: float = 0.0  # running mean time of a request (admitted to finished)
    n_weighted: float = 0.0  # exponentially weighted outstanding x busy time (/ busy_s: the average)

    def rate(self) -> float | None:
        """Work finished per busy second, or None before the first completion."""
        if self.finished == 0 or self.busy_s <= 0:
            return None
        return self.done / self.busy_s


class LoadShedder:
    """Per-engine backlog, drain rate and solo time; admits, sheds and answers ``Retry-After``.

    ``max_wait_s``: the bound on the estimated wait (0 turns shedding off; the control plane's own queue limits
    still apply). ``concurrency(key)``: requests the engine ``key`` runs at once, admitted before it has a rate.
    ``work``: a request's size in the engine's units (1 if all requests are alike).
    """

    def __init__(self, max_wait_s: float, concurrency=lambda key: 1, window_s: float = DEFAULT_WINDOW_S,
                 horizon_s: float = DEFAULT_HORIZON_S, parallel: float | None = None):
        self.max_wait_s, self.concurrency = max_wait_s, concurrency
        self.window_s, self.horizon_s = window_s, horizon_s
        self.parallel = parallel
        self.engines: dict = {}
        self.busy = 0  # engines with work outstanding
        self.busy_peak, self.busy_peak_at = 0, -math.inf  # the most engines busy at once lately, and when
        self.shed_count = 0

    @property
    def enabled(self) -> bool:
        return self.max_wait_s > 0

    def _engine(self, key, now: float) -> EngineLoad:
        e = self.engines.get(key)
        if e is None:
            e = self.engines[key] = EngineLoad(last=now)
        dt = now - e.last
        if dt > 0:
            if e.outstanding > 0:  # busy: age the averages by the busy time that passed, at the host share it had
                tau = max(self.window_s, WINDOW_LATENCIES * e.latency_s)
                f = math.exp(-dt / tau)
                held = self._share(self.busy) * tau * (1.0 - f)
                e.busy_s = e.busy_s * f + held
                e.n_weighted = e.n_weighted * f + e.outstanding * held
                e.done *= f
            e.last = now
        return e

    def _share(self, busy: int) -> float:
        """The share of full speed each of ``busy`` engines gets from the host (1 without a shared host)."""
        if self.parallel is None or busy <= self.parallel:
            return 1.0
        return self.parallel / busy

    def _share_for(self, e: EngineLoad, now: float) -> float:
        """The host share engine ``e`` would run at with one more request (it counts as busy). A burst that
        wakes one engine soon wakes the others, so the count is at least the most engines busy at once over the
        last ``BUSY_HOLD_S``: estimates made as the first engines wake do not assume the host to themselves."""
        busy = self.busy + (e.outstanding == 0)
        if now - self.busy_peak_at <= BUSY_HOLD_S:
            busy = max(busy, self.busy_peak)
        return self._share(busy)

    def _busy_changes(self, now: float, delta: int) -> None:
        """An engine turns busy (+1) or idle (-1): age every engine at the old share before the share changes."""
        if self.parallel is not None:
            for key in self.engines:
                self._engine(key, now)
        before, self.busy = self.busy, self.busy + delta
        if self.busy >= self.busy_peak:
            self.busy_peak, self.busy_peak_at = self.busy, now
        elif before >= self.busy_peak or now - self.busy_peak_at > BUSY_HOLD_S:
            self.busy_peak, self.busy_peak_at = before, now  # that many were busy until now

    def _estimate(self, e: EngineLoad, work: float, now: float) -> tuple[float, float] | None:
        """(expected time of a request of ``work`` admitted now, its time alone), or None before the engine has
        a rate. Each of the ``outstanding + 1`` requests gets its share of the engine's rate, which is its rate at
        full speed times the host share it runs at."""
        mu = e.rate()
        if mu is None:
            return None
        mu *= self._share_for(e, now)
        if mu <= 0:
            return math.inf, 0.0
        solo = (e.solo_s if e.solo_s is not None else 1.0 / mu) * work
        return max((e.outstanding + 1) * work / mu, solo), solo

    def excess_s(self, e: EngineLoad) -> float:
        return min(SPREAD * max(e.mae_s, e.mae_slow_s), self.max_wait_s / 2)

    def _latency_wait(self, e: EngineLoad, est) -> float:
        return max(0.0, est[0] + self.excess_s(e) - est[1])

    def wait_s(self, key, now: float, work: float = 1.0) -> float:
        """Estimated wait of a request of ``work`` admitted to ``key`` now (inf: refused before a rate is known,
        or beyond what the measured rate can vouch for)."""
        e = self._engine(key, now)
        if e.outstanding == 0:
            return 0.0
        batch = self.concurrency(key)
        est = self._estimate(e, work, now)
        if est is None:
            return 0.0 if e.outstanding < batch else math.inf
        measured_at = e.n_weighted / e.busy_s if e.busy_s > 0 else 0.0
        if e.outstanding + 1 > max(batch, GROWTH * measured_at):
            return math.inf
        return self._latency_wait(e, est)

    def check(self, keys, now: float, work: float = 1.0) -> float | None:
        """None if a request of ``work`` that any of ``keys`` can serve may be admitted now; else the seconds
        after which to retry (the request is shed)."""
        keys = list(keys)
        if not self.enabled or not keys:
            return None
        waits = [self.wait_s(k, now, work) for k in keys]
        best = min(range(len(keys)), key=waits.__getitem__)
        if waits[best] <= self.max_wait_s:
            return None
        self.shed_count += 1
        return self.retry_after(keys[best], now, work)

    def retry_after(self, key, now: float, work: float = 1.0) -> float:
        """Seconds until a request refused now (shed, or refused by the control plane for capacity) can expect to
        be admitted: the backlog's drain time to the admission bound, then a place in the virtual queue."""
        e = self._engine(key, now)
        mu = e.rate()
        if mu is None or mu <= 0:
            return max(self.max_wait_s, 1.0)
        mu *= self._share_for(e, now)
        # (Refused by the slow start alone, the latency estimate is within the bound: then only the next place.)
        excess = self._latency_wait(e, self._estimate(e, work, now)) - self.max_wait_s
        at = max(now + max(excess, 0.0), e.promised) + work / mu
        at = min(at, now + self.horizon_s)
        e.promised = at
        return at - now

    def admitted(self, key, now: float, work: float = 1.0) -> Ticket:
        e = self._engine(key, now)
        est = self._estimate(e, work, now)
        alone = e.outstanding == 0
        if alone:
            self._busy_changes(now, +1)
        e.outstanding += 1
        e.epoch += 1
        expected = est[0] if est is not None and math.isfinite(est[0]) else None
        return Ticket(key, now, work, e.epoch, alone, expected)

    def moved(self, ticket: Ticket, key, now: float) -> Ticket:
        """The request of ``ticket`` queued for one engine and started on another (a sibling replica sharing its
        site queue): it leaves the first unserved and counts on ``key``'s from its admission on."""
        self.finished(ticket, now, served=False)
        return replace(self.admitted(key, now, ticket.work), at=ticket.at)

    def finished(self, ticket: Ticket, now: float, served: bool = True) -> None:
        """The request of ``ticket`` left its engine: ``served`` if the engine finished it (a completion), not
        if it was abandoned or expired before running."""
        e = self._engine(ticket.key, now)
        if e.outstanding == 1:
            self._busy_changes(now, -1)
        e.outstanding -= 1
        if not served:
            return
        e.done += ticket.work
        e.finished += 1
        took = now - ticket.at
        if ticket.alone and e.epoch == ticket.epoch:  # nothing else was admitted while it ran
            per_work = took / ticket.work
            e.solo_s = per_work if e.solo_s is None else e.solo_s + SOLO_WEIGHT * (per_work - e.solo_s)
        e.latency_s = took if e.finished == 1 else e.latency_s + ERROR_WEIGHT * (took - e.latency_s)
        if ticket.estimate_s is not None:
            err = abs(took - ticket.estimate_s)
            e.mae_s += ERROR_WEIGHT * (err - e.mae_s)
            e.mae_slow_s += SLOW_ERROR_WEIGHT * (err - e.mae_slow_s)

    def describe(self, now: float) -> dict:
        """Per engine: outstanding requests, drain rate, solo time per unit of work, estimated wait of a unit
        request (for /metrics and tests)."""
        out = {}
        for key in list(self.engines):
            e = self._engine(key, now)
            wait = self.wait_s(key, now)
            out[str(key)] = {"outstanding": e.outstanding, "drain_per_s": e.rate(), "solo_s": e.solo_s,
                             "excess_s": self.excess_s(e), "wait_s": wait if math.isfinite(wait) else None}
        return out
