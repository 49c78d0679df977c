"""Autoscaling policies: load and unload model replicas on GPU nodes as demand moves.

A policy's ``tick(plane, now)`` is called by :meth:`ControlPlane.poll`; it acts at most every ``interval_s``.
Loading costs a cold start (weight bytes / load bandwidth + init, see ``AdmissionConfig``); unloading scales a
replica to zero and frees its GPU memory. Policies by name: ``reactive`` (queue depth and idleness) and
``scheduled`` (warm during local working hours at each site).
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from controlplane.state import COLD, READY
from edgepop.errors import UserError
from edgepop.registry import Registry
from topology.demand import utc_offset_hours

AUTOSCALERS = Registry("autoscaling policy")
# The shortest interval_s: a simulation's clock polls the control plane at most every millisecond, so a shorter
# interval would tick at 1 ms anyway (and cost a poll per millisecond of the run).
MIN_INTERVAL_S = 1e-3


@AUTOSCALERS.register("none")
def no_autoscaler() -> None:
    """A static placement: replicas stay where the placement put them."""
    return None


class Autoscaler:
    """Base: subclasses implement :meth:`act`. ``next_tick`` tells the caller when to poll next."""

    name = "?"

    def __init__(self, interval_s: float = 10.0):
        if not interval_s >= MIN_INTERVAL_S:  # (NaN fails too)
            raise UserError(f"autoscaler interval_s must be at least {MIN_INTERVAL_S:g} s (1 ms), got {interval_s}")
        self.interval_s = interval_s
        self.next_tick = 0.0
        self.loads = self.unloads = 0

    def tick(self, plane, now: float) -> None:
        if now < self.next_tick:
            return
        self.next_tick = now + self.interval_s
        self.act(plane, now)

    def act(self, plane, now: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def activity(self) -> dict:
        """What the policy did so far: ``scale_outs`` (replicas it loaded, a cold start each: new ones and cold
        ones reloaded) and ``scale_to_zero`` (idle replicas it unloaded)."""
        return {"scale_outs": self.loads, "scale_to_zero": self.unloads}

    def _unload_idle(self, plane, now: float, idle_s: float, keep=lambda r: False) -> None:
        for r in plane.state.replicas:
            if (r.status == READY and r.active == 0 and not r.queue and now - r.last_busy >= idle_s
                    and not keep(r)):
                plane.state.unload(r)
                self.unloads += 1


@AUTOSCALERS.register("reactive")
class Reactive(Autoscaler):
    """Scale out where queues build up, scale to zero where replicas sit idle.

    Every ``interval_s``: a READY replica idle for ``idle_s`` is unloaded, unless that would leave its model with
    fewer than ``min_ready`` ready replicas on nodes that are up, fleet-wide (replicas on down nodes neither count
    nor are kept). For each (site, model) whose live replicas on up nodes hold on average ``queue_high`` or more
    queued requests (and the queue is not empty), one more replica is loaded at that site (a COLD one reloaded
    first, else a new one on an up node with the most free memory), up to ``max_per_site``.
    """

    def __init__(self, interval_s: float = 10.0, idle_s: float = 300.0, queue_high: float = 4.0,
                 max_per_site: int = 16, min_ready: int = 0):
        super().__init__(interval_s)
        self.check_options(interval_s, idle_s, queue_high, max_per_site, min_ready)
        self.idle_s, self.queue_high, self.max_per_site, self.min_ready = idle_s, queue_high, max_per_site, min_ready

    @staticmethod
    def check_options(interval_s: float = 10.0, idle_s: float = 300.0, queue_high: float = 4.0,
                      max_per_site: int = 16, min_ready: int = 0) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        for name, value, ok, rule in (("interval_s", interval_s, interval_s >= MIN_INTERVAL_S,
                                       f"at least {MIN_INTERVAL_S:g} s (1 ms)"),
                                      ("idle_s", idle_s, idle_s >= 0, ">= 0"),
                                      ("queue_high", queue_high, queue_high >= 0, ">= 0"),
                                      ("max_per_site", max_per_site, max_per_site >= 1, "at least 1"),
                                      ("min_ready", min_ready, min_ready >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {value!r}")

    def act(self, plane, now: float) -> None:
        state = plane.state
        # Only replicas that can serve count towards min_ready: one on a down node is READY in name only.
        ready: dict[str, int] = {}
        for r in state.replicas:
            ready[r.model] = ready.get(r.model, 0) + (r.status == READY and r.up)

        def keep(r):
            if not r.up:
                return False  # not counted, so unloading it leaves the serving ones as they were
            if ready[r.model] <= self.min_ready:
                return True
            ready[r.model] -= 1
            return False

        self._unload_idle(plane, now, self.idle_s, keep)
        groups: dict[tuple[int, str], list] = {}
        for r in state.replicas:
            if r.up:
                groups.setdefault((r.site, r.model), []).append(r)
        for (site, model), reps in groups.items():
            live = [r for r in reps if r.status != COLD]
            if not live or len(live) >= self.max_per_site:
                continue
            queued = len(live[0].queue)  # the site queue, per live replica; never on an empty queue (queue_high 0)
            if not queued or queued / len(live) < self.queue_high:
                continue
            self._scale_out(plane, now, site, model, reps)

    def _scale_out(self, plane, now, site, model, reps) -> None:
        state = plane.state
        for r in reps:
            if r.status == COLD and state.begin_load(r, now, plane.admission.cold_start_s(r.spec)):
                self.loads += 1
                return
        spec = plane.catalog[model]
        nodes = np.flatnonzero((state.node_site == site) & state.node_up).tolist()
        # The node with the most free memory that can hold it (under one language model per GPU, the roomiest
        # node may already compute for another one).
        nodes.sort(key=lambda n: -(state.gpu_capacity[n] - state.gpu_used[n]).max())
        for node in nodes:
            if state.fits(spec, node) is not None:
                plane.add_replica(model, node, now, cold=True)
                self.loads += 1
                return


@AUTOSCALERS.register("scheduled")
class Scheduled(Autoscaler):
    """Keep replicas warm during local working hours at each site and scale them to zero at night.

    ``start_utc`` is the wall-clock time of simulated t=0 and ``day_s`` how many simulated seconds one day takes
    (86,400 for real time; less when the day is compressed). Outside ``warm_hours`` (local, [start, end); a start
    after the end wraps past midnight; equal ends are refused) idle replicas are unloaded; at the start of the window
    cold ones are loaded again (taking their cold start).
    """

    def __init__(self, interval_s: float = 60.0, warm_hours: list | tuple = (7, 23), start_utc: str | datetime | None = None,
                 day_s: float = 86_400.0):
        super().__init__(interval_s)
        try:
            self.check_options(interval_s, warm_hours, start_utc, day_s)
        except ValueError as exc:
            raise UserError(f"scheduled autoscaler: {exc}") from None
        self.warm_hours = warm_hours
        start = datetime.fromisoformat(start_utc) if isinstance(start_utc, str) else start_utc
        self.start = (start or datetime(2024, 1, 15, tzinfo=UTC))
        # UTC's clock: local_hours reads its hour (another zone's would be that zone's hour)
        self.start = self.start.replace(tzinfo=UTC) if self.start.tzinfo is None else self.start.astimezone(UTC)
        self.day_s = day_s
        self._offsets = None

    @staticmethod
    def check_options(interval_s: float = 60.0, warm_hours: list | tuple = (7, 23),
                      start_utc: str | datetime | None = None, day_s: float = 86_400.0) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be at least {MIN_INTERVAL_S:g} s (1 ms), got {interval_s!r}")
        if (not isinstance(warm_hours, list | tuple) or len(warm_hours) != 2
                or not all(isinstance(h, int | float) and not isinstance(h, bool) for h in warm_hours)
                or not (0 <= warm_hours[0] < 24 and 0 < warm_hours[1] <= 24)):
            raise ValueError(f"warm_hours must be [start, end], local hours within 0..24, got {warm_hours!r}")
        if warm_hours[0] == warm_hours[1]:  # an empty window would read as the whole day (the wrap-around rule)
            raise ValueError(f"warm_hours {list(warm_hours)!r} is an empty window (start = end): give start != end "
                             "([0, 24] keeps replicas warm all day)")
        if not day_s > 0:
            raise ValueError(f"day_s must be positive (simulated seconds per day), got {day_s!r}")
        if isinstance(start_utc, str):
            try:
                datetime.fromisoformat(start_utc)
            except ValueError:
                raise ValueError(f"start_utc must be an ISO date and time (2024-01-15T00:00), got {start_utc!r}") \
                    from None

    def local_hours(self, plane, now: float) -> np.ndarray:
        if self._offsets is None:
            self._offsets = utc_offset_hours(plane.state.fleet.sites.tz, self.start)
        utc_h = self.start.hour + self.start.minute / 60 + self.start.second / 3600 + 24.0 * now / self.day_s
        return (utc_h + self._offsets) % 24.0

    def warm(self, hour: float) -> bool:
        a, b = self.warm_hours
        return a <= hour < b if a < b else (hour >= a or hour < b)

    def act(self, plane, now: float) -> None:
        hours = self.local_hours(plane, now)
        self._unload_idle(plane, now, 0.0, keep=lambda r: self.warm(hours[r.site]))
        for r in plane.state.replicas:
            if r.status == COLD and r.up and self.warm(hours[r.site]):
                if plane.state.begin_load(r, now, plane.admission.cold_start_s(r.spec)):
                    self.loads += 1


def make_autoscaler(name: str | None, **options) -> Autoscaler | None:
    """An autoscaling policy by name (``none`` or None for a static placement)."""
    return AUTOSCALERS.create(name or "none", options=options)
