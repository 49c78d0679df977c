"""The simulation's arrivals: each request is submitted when it reaches its entry point, in that order (ties: the
workload's order).

A chain of timers (``sim.timers``) rather than a SimPy process, with the process's event order: the first timer is
queued where ``env.process`` would queue the process's start (urgent, at the current time) and each wait is a timer
where the process would yield a timeout. An arrival that comes before every queued event needs no timer at all:
its timer would be the very next event popped, so the clock moves to it and the feed goes on.
"""

from __future__ import annotations

from heapq import heappush

import numpy as np
from simpy.events import NORMAL, URGENT

from sim.timers import Timer


class ArrivalFeed:
    """Submits ``sim``'s requests at ``arrival + access / 2`` through ``sim._submit`` and reports progress."""

    def __init__(self, sim):
        self.sim, self.env, self.n = sim, sim.env, sim.n
        t_dec = sim.arrival + sim.access_s / 2
        self.order = np.argsort(t_dec, kind="stable").tolist()
        self.t_dec = t_dec.tolist()
        self.next = 0  # position in ``order`` of the next request to submit
        self._arrive_cb = self._arrive  # bound once, used per arrival
        self._arrive_cbs = [self._arrive]  # the callbacks of its timer pushed again (nothing appends to them)

    def start(self) -> None:
        env = self.env
        heappush(env._queue, (env._now, URGENT, next(env._eid), Timer(self._arrive_cb, False)))

    def _arrive(self, ev) -> None:
        """Submit the requests due now; ``ev._value``: this timer was the wait for the next one (submit it
        without comparing times again, as the process did after its timeout)."""
        sim, env, order, t_dec, n = self.sim, self.env, self.order, self.t_dec, self.n
        submit, progress, queue = sim._submit, sim.progress, env._queue
        i, waited = self.next, ev._value
        while i < n:
            k = order[i]
            if not waited:
                dt = t_dec[k] - env._now
                if dt > 0:
                    at = env._now + dt  # (as env.timeout(dt) computes its time)
                    if queue and at < queue[0][0]:
                        env._now = at  # every queued event comes later: no timer needed
                    else:
                        self.next = i
                        # this timer (popped: its callbacks taken) waits for the next arrival: no new one
                        ev.callbacks, ev._value = self._arrive_cbs, True
                        heappush(queue, (at, NORMAL, next(env._eid), ev))
                        return
            waited = False
            submit(k, env._now)
            if progress is not None and i % max(1, n // 200) == 0:
                progress(i, n)
            i += 1
        self.next = n
        sim.arrivals_finished()
