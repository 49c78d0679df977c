"""The simulator's bare timers take their place in SimPy's event queue exactly as ``env.timeout`` would, and
``run_until`` processes events as ``env.run`` does (they use SimPy internals: this test guards an upgrade)."""

from __future__ import annotations

import pytest
import simpy

from sim.timers import call_later, run_until


def _schedule(env, log, bare: set[int]):
    """Timers and timeouts at equal and different times, created in one order; ``bare``: which are timers."""
    delays = [1.0, 0.5, 1.0, 0.0, 1.0, 0.5, 2.0]
    for i, d in enumerate(delays):
        if i in bare:
            call_later(env, d, lambda ev, i=i: log.append((env.now, i, ev._value)), value=i)
        else:
            env.timeout(d, value=i).callbacks.append(lambda ev, i=i: log.append((env.now, i, ev.value)))


def test_timers_run_in_the_order_timeouts_would():
    ref, log = [], []
    env = simpy.Environment()
    _schedule(env, ref, set())
    env.run()
    env = simpy.Environment()
    _schedule(env, log, {0, 2, 3, 5})
    end = env.timeout(5.0)
    run_until(env, end)
    assert log == ref and [i for _, i, _ in ref] == [3, 1, 5, 0, 2, 4, 6]
    assert env.now == 5.0


def test_run_until_raises_a_failed_events_error_and_needs_its_until():
    env = simpy.Environment()
    ev = env.event()
    ev.fail(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        run_until(env, env.timeout(1.0))
    env = simpy.Environment()
    call_later(env, 1.0, lambda ev: None)
    with pytest.raises(RuntimeError, match="until"):
        run_until(env, env.event())
