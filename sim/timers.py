"""One-shot timers pushed straight onto a SimPy environment's event queue.

``env.timeout(delay)`` builds a full :class:`simpy.Timeout` (argument checks, an instance dict, a schedule call);
the simulator makes several per request only to run one callback, so it pushes this slotted stand-in instead.
It takes its place in the queue exactly as a timeout created at the same moment would -- same time
(``now + delay``), same priority, the next id from the environment's own counter -- so the order of events, and
hence every result, is the same as with ``env.timeout``.
"""

from __future__ import annotations

from heapq import heappop, heappush

from simpy.core import StopSimulation
from simpy.events import NORMAL


class Timer:
    """What ``Environment.step`` reads of an event: its callbacks and success flag (``value``: the caller's)."""

    __slots__ = ("callbacks", "_value")
    _ok = True  # (a class attribute: one store less per timer)

    def __init__(self, callback, value):
        self.callbacks = [callback]
        self._value = value


def call_later(env, delay: float, callback, value=None) -> None:
    """Run ``callback(timer)`` after ``delay`` simulated seconds (``timer._value`` is ``value``)."""
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), Timer(callback, value)))


def run_until(env, until) -> None:
    """``env.run(until)`` for an ``until`` event that triggers once the run is over, with ``Environment.step``
    inlined: the loop runs a few times per request and the method call is a noticeable part of an event's cost.
    Events are processed exactly as ``step`` processes them (same order, same failure handling)."""
    until.callbacks.append(StopSimulation.callback)
    queue = env._queue
    try:
        while queue:
            env._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)  # as step: a copy, caused by the original
                exc.__cause__ = event._value
                raise exc
    except StopSimulation:
        return
    raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}')
