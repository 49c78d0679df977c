"""One-shot timers pushed straight onto a SimPy environment's event queue.

``env.timeout(delay)`` builds a full :class:`simpy.Timeout` (argument checks, an instance dict, a schedule call);
the simulator makes several per request only to run one callback, so it pushes this slotted stand-in instead.
It takes its place in the queue exactly as a timeout created at the same moment would -- same time
(``now + delay``), same priority, the next id from the environment's own counter -- so the order of events, and
hence every result, is the same as with ``env.timeout``.
"""

from __future__ import annotations

from heapq import heappush

from simpy.events import NORMAL


class Timer:
    """What ``Environment.step`` reads of an event: its callbacks and success flag (``value``: the caller's)."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, callback, value):
        self.callbacks = [callback]
        self._ok = True
        self._value = value


def call_later(env, delay: float, callback, value=None) -> None:
    """Run ``callback(timer)`` after ``delay`` simulated seconds (``timer._value`` is ``value``)."""
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), Timer(callback, value)))
