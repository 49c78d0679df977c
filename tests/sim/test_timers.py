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



def _engine(env, log, push: bool):
    """A replica engine on ``env`` whose wake-ups go through an ``arm`` callback making SimPy timeouts, or
    (``push``) are pushed by the engine itself; ``log`` records what happened when (the wake-ups: the arm
    callback's live ones, every pushed one whose callback ran)."""
    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline
    from controlplane.perf_rows import reference_gpus
    from sim.engine import ReplicaEngine

    spec = default_catalog()["@cf/meta/llama-3.1-8b-instruct"]
    finished = []

    def wake(version):
        if version == eng.version:
            log.append(("wake", env.now, version))
        else:
            log.append(("stale", env.now, version))
        eng.wake(env.now, version)

    def arm(_eng, t, version):
        env.timeout(max(0.0, t - env.now)).callbacks.append(lambda _ev: wake(version))

    def fire(ev):
        log.append(("wake", env.now, ev._value))
        eng.fire(ev)

    eng = ReplicaEngine(spec, "H100", Roofline(reference_gpus()), arm,
                        lambda s, t: log.append(("first", s.rec, t)),
                        lambda s, t: (finished.append(s), log.append(("done", s.rec, t))))
    if push:
        eng.push_timers(env, finished, finished.clear)
        eng._fire_cb, eng._fire_cbs = fire, [fire]
    return eng


def _engine_run(push: bool) -> list:
    """Prompts reaching the engine at awkward times, some together; returns what happened when."""
    from sim.engine import Seq

    env, log = simpy.Environment(), []
    eng = _engine(env, log, push)
    for k, (at, prompt, output) in enumerate([(0.1, 900, 7), (0.13, 300, 40), (0.7, 2000, 3), (1.1, 50, 90),
                                              (1.1, 700, 1), (2.3, 1200, 25)]):
        seq = Seq(k, prompt, output)
        env.timeout(at).callbacks.append(lambda _ev, s=seq: eng.join(s, env.now))
    env.run()
    return log


def _queued_after_join(push: bool, t: float) -> tuple[list, float]:
    """The queue's (time, priority, id) entries after a prompt joins an idle engine at ``t``, and its prefill's
    end."""
    from sim.engine import Seq

    env = simpy.Environment(t)
    env.timeout(0.0)  # an id drawn before: the wake-up must draw the next one
    eng = _engine(env, [], push)
    eng.join(Seq(0, 900, 7), t)
    return [e[:3] for e in sorted(env._queue)], eng.prefill_end


def test_an_engine_pushing_its_own_wake_ups_queues_them_as_its_arm_callbacks_timeouts():
    """Same times (``now + (t - now)``, as a timeout computes them), same priority, same ids, hence the same run;
    a pushed wake-up superseded by a prompt's arrival is popped without a call."""
    want, got = _engine_run(push=False), _engine_run(push=True)
    assert sum(e[0] == "stale" for e in want) >= 1  # a prompt arrived while a sequence decoded
    assert got == [e for e in want if e[0] != "stale"] and sum(e[0] == "done" for e in got) == 6
    for i in range(50):
        t = 0.1 + i * 0.0137
        assert _queued_after_join(True, t) == _queued_after_join(False, t)


class _NoSpares(list):
    """A spare-timer list that keeps none: every hop gets a new timer."""

    def append(self, _timer):
        pass


def test_a_simulation_pushing_popped_timers_again_runs_as_one_making_new_ones(monkeypatch):
    """Engines' wake-ups pushed once more after they fired, hops' timers taken from the spares: the same frame as
    a run with a new timer for every event (engines armed through the simulation's callback, no spares)."""
    import numpy as np
    from kit.sim import TokenClock, deployment, poisson, workload

    from controlplane.catalog import default_catalog
    from sim.engine import ReplicaEngine
    from sim.simulator import Simulation

    catalog = default_catalog()
    model = "@cf/meta/llama-3.1-8b-instruct"
    rng = np.random.default_rng(3)
    n = 400
    w = workload(poisson(40.0, n, rng), model, "text-generation", rng.integers(50, 3000, n),
                 rng.integers(1, 200, n), ingress=rng.integers(0, 2, n), access_ms=rng.uniform(0.0, 20.0, n))
    rtt = np.array([[0.0, 4.0, 9.0], [6.0, 0.0, 3.0]])  # most requests hop to a node away from their PoP

    def run():
        dep = deployment(catalog, model, 3, rtt, router="nearest-balanced", router_options={"window_ms": 10.0})
        sim = Simulation(dep, w, TokenClock(step_ms=8.0))
        return sim, sim.run().requests

    sim, reused = run()
    with monkeypatch.context() as m:
        m.setattr(ReplicaEngine, "push_timers", lambda self, env, finished, flush: None)
        orig_init = Simulation.__init__

        def init(self, *a, **kw):
            orig_init(self, *a, **kw)
            self._spare_timers = _NoSpares()

        m.setattr(Simulation, "__init__", init)
        _, fresh = run()
    assert (np.array(sim.backbone_ms) > 0).mean() > 0.3 and reused.outcome.eq("ok").all()
    assert reused.equals(fresh)
