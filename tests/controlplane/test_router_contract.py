"""The routing contract: a router edgepop does not ship is checked decision by decision (one-line UserError naming
it); the shipped routers keep the contract (forced through the same check on the small scenario)."""

from dataclasses import replace

import numpy as np
import pytest
from kit.controlplane import LLAMA, TINY, line_rtt, make_fleet, placement

from controlplane.plane import ControlPlane
from controlplane.routing import QUEUE, ROUTERS, START, Decision, Router, router_names
from controlplane.state import Request
from edgepop.errors import UserError


@pytest.fixture
def register(monkeypatch):
    """Register an outside router for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(ROUTERS, "_entries", dict(ROUTERS._entries))

    def add(name, cls):
        ROUTERS.register(name)(cls)
        return name
    return add


def plane(catalog, router, **options):
    fleet = make_fleet([1] * 3)
    table = placement([(TINY, 0), (LLAMA, 1), (TINY, 2)])
    return ControlPlane(catalog, fleet, table, line_rtt(3, 3), router=router, router_options=options,
                        rng=np.random.default_rng(0))


class OtherModel(Router):
    """STARTs every request on a replica of another model."""

    def route(self, req, now):
        r = next(r for r in self.state.replicas if r.model != req.model)
        return Decision(START, r, float(self.state.rtt[req.ingress, r.site]))


class AlwaysFirst(Router):
    """STARTs every request on the model's first replica, full or not."""

    def route(self, req, now):
        r = self.state.by_model[req.model][0]
        return Decision(START, r, float(self.state.rtt[req.ingress, r.site]))


class NoReplica(Router):
    def route(self, req, now):
        return Decision(START, None, 0.0)


class Raises(Router):
    def route(self, req, now):
        raise RuntimeError("my router blew up")


class WrongRtt(Router):
    def route(self, req, now):
        cands, _ = self.state.candidates(req.ingress, req.model)
        return Decision(START, cands[0], 1.0)


class Polite(Router):
    """Keeps the contract: the shipped rule, from a class defined outside edgepop."""

    def route(self, req, now):
        cands, rtts = self.state.candidates(req.ingress, req.model)
        return self.nearest_with_capacity(req, cands, rtts)


def test_start_on_another_models_replica_is_refused(catalog, register):
    cp = plane(catalog, register("t-other-model", OtherModel))
    with pytest.raises(UserError, match=r"^router 't-other-model' \(.*\.OtherModel\) on request 7 \(model "
                                        rf"{TINY}\): START on replica 1 \(node row 1\), a replica of {LLAMA}, not of "
                                        "the request's model$"):
        cp.submit(Request(7, TINY, 0, 100, 10), 0.0)
    assert cp.counts["started"] == 0


def test_start_on_a_replica_that_cannot_start_it_is_refused(catalog, register):
    cp = plane(catalog, register("t-always-first", AlwaysFirst))
    first = cp.state.by_model[TINY][0]
    for i in range(first.slots):  # fills its slots, each a valid START
        cp.submit(Request(i, TINY, 0, 10, 1), 0.0)
    assert first.active == first.slots
    with pytest.raises(UserError, match=rf"on request {first.slots} .*START on replica 0 \(node row 0\), which "
                                        rf"cannot start it now \({first.slots} of its {first.slots} slots are busy\)"):
        cp.submit(Request(first.slots, TINY, 0, 10, 1), 0.0)
    assert first.active == first.slots  # not overfilled


def test_start_with_no_replica_is_refused(catalog, register):
    cp = plane(catalog, register("t-no-replica", NoReplica))
    with pytest.raises(UserError, match=r"^router 't-no-replica' \(.*\.NoReplica\) on request 3 .*START with replica "
                                        "None"):
        cp.submit(Request(3, TINY, 0, 10, 1), 0.0)


def test_a_router_that_raises_is_one_user_error_naming_it(catalog, register):
    cp = plane(catalog, register("t-raises", Raises))
    with pytest.raises(UserError) as err:
        cp.submit(Request(5, TINY, 0, 10, 1), 0.0)
    assert str(err.value) == (f"router 't-raises' ({__name__}.Raises) failed on request 5: RuntimeError: my router "
                              "blew up (EDGEPOP_TRACEBACK=1 shows where)")
    assert isinstance(err.value.__cause__, RuntimeError)


def test_a_wrong_rtt_and_a_reject_naming_a_replica_are_refused(catalog, register):
    cp = plane(catalog, register("t-wrong-rtt", WrongRtt))
    with pytest.raises(UserError, match=r"with rtt_ms 1.0; the RTT from ingress 2 to its site is 0 ms"):
        cp.submit(Request(1, TINY, 2, 10, 1), 0.0)

    class RejectOn(Router):
        def route(self, req, now):
            return Decision("reject", self.state.replicas[0], code=3040)
    cp = plane(catalog, register("t-reject-on", RejectOn))
    with pytest.raises(UserError, match=r"rejected it but named replica 0 \(node row 0\); a REJECT names no replica"):
        cp.submit(Request(1, TINY, 0, 10, 1), 0.0)


def test_an_outside_router_inside_a_shipped_one_is_checked(catalog, register):
    name = register("t-other-model-2", OtherModel)
    cp = plane(catalog, "session-affinity", fallback=name)
    with pytest.raises(UserError, match="'t-other-model-2'.*not of the request's model"):
        cp.submit(Request(1, TINY, 0, 10, 1), 0.0)


def test_shipped_routers_are_not_wrapped_and_a_polite_outside_one_runs(catalog, register):
    from controlplane.routing.checked import CheckedRouter
    for name in router_names():
        assert not isinstance(plane(catalog, name).router, CheckedRouter), name
    cp = plane(catalog, register("t-polite", Polite))
    assert isinstance(cp.router, CheckedRouter) and cp.router.name == "t-polite"
    decisions = [cp.submit(Request(i, TINY, i % 3, 10, 1), 0.0) for i in range(200)]
    assert {d.action for d in decisions} == {START, QUEUE}  # 128 slots, then queues


@pytest.mark.parametrize("router", router_names())
def test_every_shipped_router_keeps_the_contract_on_the_small_scenario(router, monkeypatch):
    """Every shipped router forced through the check (edge and central, small scenario at a load that fills the
    edge's slots, so requests queue too): no decision breaks the contract."""
    from controlplane.routing import checked
    from sim.run import run_scenario
    from sim.scenario import load_scenario

    actions = []
    real = checked.check_outside

    def force(router, state=None, force=False):
        out = real(router, state, force=True)
        assert isinstance(out, checked.CheckedRouter)
        route = out.route

        def counted(req, now):
            d = route(req, now)
            actions.append(d.action)
            return d
        out.route = counted
        return out
    monkeypatch.setattr("controlplane.plane.check_outside", force)
    sc = load_scenario("small")
    sc = replace(sc, workload=replace(sc.workload, rps=3000.0),
                 edge=replace(sc.edge, router=router, router_options={}),
                 central=replace(sc.central, router=router, router_options={}))
    out = run_scenario(sc, requests=1500, seed=3)
    assert {START, QUEUE} <= set(actions) and len(actions) >= 3000
    for side in ("edge", "central"):
        assert out.summary["deployments"][side]["outcomes"]["ok"] > 0
