"""Routing policies: true nearest feasible replica (property test vs brute force), spillover, 3040, affinity."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.controlplane import LLAMA, TINY, line_rtt, make_fleet, placement

from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.routing import QUEUE, REJECT, START, make_router
from controlplane.state import COLD, LOADING, READY, Request
from edgepop.errors import UserError


def plane(catalog, n_sites=5, n_ingress=5, router="nearest-with-capacity", models=(TINY,), queue_limit=4, **opt):
    fleet = make_fleet([1] * n_sites)
    table = placement([(m, n) for n in range(n_sites) for m in models])
    return ControlPlane(catalog, fleet, table, line_rtt(n_ingress, n_sites), router=router, router_options=opt,
                        admission=AdmissionConfig(queue_limit=queue_limit), rng=np.random.default_rng(0))


def fill(replica, now=0.0):
    """Occupy every slot of a replica with dummy running requests."""
    for i in range(replica.slots - replica.active):
        replica._start(Request(-1 - i, replica.model, 0, 1), now)


def brute_force(state, req):
    """Reference for nearest-with-capacity, written independently: scan all replicas, keep the best by (rtt, id)."""
    reps = [r for r in state.replicas if r.model == req.model]
    key = lambda r: (state.rtt[req.ingress, r.site], r.site, r.id)  # noqa: E731  (documented tie-break)
    can = [r for r in reps if r.up and r.status == READY and r.active < r.slots
           and r.kv_used + req.kv_tokens <= r.kv_capacity]
    if can:
        return START, min(can, key=key)
    if req.reject_if_busy:  # nothing warm can start it: no wait of any kind, cold loads included
        return REJECT, None
    room = lambda r: len(r.queue) < r.queue_limit * sum(o.site == r.site for o in reps)  # noqa: E731 (shared queue)
    cold = [r for r in reps if r.up and r.status in (COLD, LOADING) and r.active + len(r.queue) < r.slots
            and room(r) and (r.status == LOADING or state.fits_back(r))]
    if cold:
        return QUEUE, min(cold, key=key)
    room = [r for r in reps if r.up and r.status == READY and room(r)]
    return (QUEUE, min(room, key=key)) if room else (REJECT, None)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_nearest_with_capacity_matches_brute_force(catalog, data):
    n_sites = data.draw(st.integers(1, 7))
    sites = data.draw(st.lists(st.integers(0, n_sites - 1), min_size=1, max_size=9))
    fleet = make_fleet([1] * len(sites), sites=sites)
    rtt = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 5.0, 10.0, 20.0, 35.0]), min_size=n_sites,
                                                max_size=n_sites), min_size=3, max_size=3)))
    cp = ControlPlane(catalog, fleet, placement([(TINY, n) for n in range(len(sites))]), rtt,
                      admission=AdmissionConfig(queue_limit=2),
                      max_candidates=data.draw(st.sampled_from([None, 1, 2, 4])))  # truncated lists too
    for r in cp.state.replicas:  # random occupancy, health and queues
        r.up = data.draw(st.booleans()) or data.draw(st.booleans())
        status = data.draw(st.sampled_from([READY, READY, READY, COLD, LOADING]))
        if status == COLD:
            cp.state.unload(r)
        r.status = status
        for _ in range(data.draw(st.sampled_from([0, 1, r.slots, r.slots]))):
            r._start(Request(-1, TINY, 0, data.draw(st.integers(1, 9000))), 0.0)
        for _ in range(data.draw(st.integers(0, 2))):
            r.queue.append(Request(-2, TINY, 0, 1))
    cp.state.refresh()  # the test edited statuses and occupancy behind the state's back
    for m, stats in cp.state.stats.items():  # ... and the running totals must agree with a recount
        reps = cp.state.by_model[m]
        assert stats.free == sum(r.slots - r.active for r in reps if r.up and r.status == READY)
    req = Request(1, TINY, data.draw(st.integers(0, 2)), data.draw(st.integers(1, 400)),
                  data.draw(st.integers(0, 100)), reject_if_busy=data.draw(st.booleans()))
    want_action, want = brute_force(cp.state, req)
    got = cp.router.route(req, 0.0)
    assert got.action == want_action
    assert got.replica is want
    if want is not None:
        assert got.rtt_ms == cp.state.rtt[req.ingress, want.site]


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_decision_of_a_saturated_plane_through_its_life_matches_brute_force(catalog, data):
    """Submits, finishes, cancellations, queue timeouts, node failures and repairs, in random order, on a fleet
    of one-slot replicas that saturates: every decision is the full scan's. A saturated model's rejection is
    remembered (no queue with room) until a request leaves a queue or a status, health or replica changes; a
    remembered rejection that outlived such an event would show here as a REJECT where a queue has room."""
    n_sites = data.draw(st.integers(2, 4))
    sites = data.draw(st.lists(st.integers(0, n_sites - 1), min_size=2, max_size=5))
    cp = ControlPlane(catalog, make_fleet([1] * len(sites), sites=sites),
                      placement([(TINY, n) for n in range(len(sites))]), line_rtt(3, n_sites),
                      admission=AdmissionConfig(queue_limit=data.draw(st.integers(1, 2)), queue_timeout_s=5.0),
                      max_candidates=data.draw(st.sampled_from([None, 1, 2])))
    cp.set_slots(1)
    now, running, rejected = 0.0, [], 0
    for k in range(data.draw(st.integers(10, 60))):
        op = data.draw(st.sampled_from(["submit"] * 5 + ["finish", "cancel", "poll", "node"]))
        if op == "submit":
            req = Request(k, TINY, data.draw(st.integers(0, 2)), data.draw(st.integers(1, 50)))
            want_action, want = brute_force(cp.state, req)
            d = cp.submit(req, now)
            assert (d.action, d.replica) == (want_action, want)
            running += [req] if d.action == START else []
            rejected += d.action == REJECT
        elif op == "finish" and running:
            running += cp.finish(running.pop(data.draw(st.integers(0, len(running) - 1))), now)
        elif op == "cancel":
            queued = [q for queue in cp.state.site_queues.values() for q in queue]
            if queued:
                running += cp.cancel(queued[data.draw(st.integers(0, len(queued) - 1))], now)
        elif op == "poll":
            now += data.draw(st.sampled_from([1.0, 6.0, 60.0]))  # (60 s: past every cold start)
            running += cp.poll(now)[0]
        elif op == "node":
            node = data.draw(st.integers(0, len(sites) - 1))
            lost, _ = cp.set_node_up(node, not cp.state.node_up[node], now)
            running = [r for r in running if r not in lost]
    assert cp.counts["rejected"] == rejected


def brute_force_balanced(state, req, window_ms):
    """Reference for nearest-balanced: among the replicas that can start ``req`` at the nearest one's site (window
    0) or within ``window_ms`` of it, the least (running + 1) x typical request time, ties by (rtt, site, id);
    nothing can start it: nearest-with-capacity."""
    key = lambda r: (state.rtt[req.ingress, r.site], r.site, r.id)  # noqa: E731
    can = sorted((r for r in state.replicas if r.model == req.model and r.up and r.status == READY
                  and r.active < r.slots and r.kv_used + req.kv_tokens <= r.kv_capacity), key=key)
    if not can:
        return brute_force(state, req)
    near = key(can[0])[0]
    pool = [r for r in can if (key(r)[0] <= near + window_ms if window_ms > 0 else r.site == can[0].site)]
    return START, min(pool, key=lambda r: ((r.active + 1) * (r.est_request_ms or 1.0), *key(r)))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_nearest_balanced_matches_brute_force_with_and_without_a_window(catalog, data):
    """Least expected work at the nearest site, or within ``window_ms`` of the nearest replica that can start the
    request, over truncated candidate lists too; the window never reaches past its bound."""
    _balanced_case(catalog, data, n_sites=data.draw(st.integers(1, 6)), max_replicas=10)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_nearest_balanced_matches_brute_force_over_many_sites(catalog, data):
    """The same over more sites than share their candidate lists (FEW_SITES): the RTTs come as plain lists."""
    from controlplane.candidates import FEW_SITES

    n_sites = data.draw(st.integers(FEW_SITES + 1, FEW_SITES + 8))
    # few RTT values and windows that end on one of them: replicas at the window's very edge are common
    cp = _balanced_case(catalog, data, n_sites=n_sites, min_sites=FEW_SITES + 1, max_replicas=40,
                        rtts=(0.0, 5.0, 10.0, 35.0), windows=(5.0, 10.0))
    assert type(cp.state.candidates(0, TINY)[1]) is list


def _balanced_case(catalog, data, n_sites: int, max_replicas: int, min_sites: int = 1,
                   rtts=(0.0, 3.0, 5.0, 9.0, 10.0, 12.0, 35.0), windows=(0.0, 5.0, 10.0, 40.0)):
    hosts = data.draw(st.lists(st.integers(0, n_sites - 1), min_size=min_sites, max_size=n_sites, unique=True))
    sites = hosts + data.draw(st.lists(st.sampled_from(hosts), max_size=max(0, max_replicas - len(hosts))))
    fleet = make_fleet([1] * len(sites), sites=sites)
    rtt = np.array(data.draw(st.lists(st.lists(st.sampled_from(rtts), min_size=n_sites, max_size=n_sites),
                                      min_size=2, max_size=2)))
    window = data.draw(st.sampled_from(windows))
    cp = ControlPlane(catalog, fleet, placement([(TINY, n) for n in range(len(sites))]), rtt,
                      router="nearest-balanced", router_options={"window_ms": window},
                      admission=AdmissionConfig(queue_limit=2), max_candidates=data.draw(st.sampled_from([None, 1, 3])))
    for r in cp.state.replicas:  # random load, health and readiness
        r.up = data.draw(st.booleans()) or data.draw(st.booleans())
        r.est_request_ms = data.draw(st.sampled_from([None, 100.0, 250.0]))
        if data.draw(st.integers(0, 5)) == 0:
            cp.state.unload(r)
            r.status = COLD
        for _ in range(data.draw(st.sampled_from([0, 0, 1, 2, 5, r.slots]))):
            r._start(Request(-1, TINY, 0, data.draw(st.integers(1, 900))), 0.0)
    cp.state.refresh()
    req = Request(1, TINY, data.draw(st.integers(0, 1)), data.draw(st.integers(1, 400)), data.draw(st.integers(0, 50)))
    want_action, want = brute_force_balanced(cp.state, req, window)
    for _ in range(2):  # the second reads the window's end its list remembered from the first
        got = cp.router.route(req, 0.0)
        assert (got.action, got.replica) == (want_action, want)
        if want is not None:
            assert got.rtt_ms == cp.state.rtt[req.ingress, want.site]
    return cp


def test_nearest_balanced_trades_a_few_milliseconds_for_an_idle_replica_only_within_its_window(catalog):
    fleet = make_fleet([1, 1, 1])
    rtt = np.array([[0.0, 8.0, 15.0]])
    for window, want in ((0.0, 0), (10.0, 1), (14.9, 1), (15.0, 2)):  # the nearest, the less loaded within reach
        cp = ControlPlane(catalog, fleet, placement([(TINY, 0), (TINY, 1), (TINY, 2)]), rtt,
                          router="nearest-balanced", router_options={"window_ms": window})
        for r, n in zip(cp.state.replicas, (3, 1, 0), strict=True):  # the nearest busy, the next less, the far idle
            for _ in range(n):
                r._start(Request(-1, TINY, 0, 10), 0.0)
        cp.state.refresh()
        got = cp.router.route(Request(1, TINY, 0, 10), 0.0)
        assert got.replica is cp.state.replicas[want] and got.rtt_ms == rtt[0, want], window
    # the window is measured from the nearest replica that can start the request, not from the nearest one
    cp = ControlPlane(catalog, make_fleet([1, 1, 1]), placement([(TINY, 0), (TINY, 1), (TINY, 2)]),
                      np.array([[0.0, 5.0, 12.0]]), router="nearest-balanced", router_options={"window_ms": 10.0})
    down, busy, idle = cp.state.replicas
    down.up = False
    for _ in range(3):
        busy._start(Request(-1, TINY, 0, 10), 0.0)
    cp.state.refresh()
    assert cp.router.route(Request(2, TINY, 0, 10), 0.0).replica is idle  # 12 ms is within 10 ms of 5 ms
    for bad in (-1.0, float("nan"), 1e9):
        with pytest.raises(UserError, match=r"routing policy 'nearest-balanced': (window_ms must be in \[0, 1000\]|"
                                            r"option 'window_ms' must be a number, got nan)"):
            make_router("nearest-balanced", cp.state, window_ms=bad)


def test_spillover_order_then_queue_then_3040(catalog):
    cp = plane(catalog, n_sites=3, n_ingress=1, queue_limit=2)
    order = []
    for k in range(3):
        d = cp.router.route(Request(k, TINY, 0, 10), 0.0)
        assert d.action == START
        order.append(d.replica.site)
        fill(d.replica)
    assert order == [0, 1, 2]  # nearest first, then the next nearest
    queued = [cp.submit(Request(10 + k, TINY, 0, 10), 0.0) for k in range(2 * 3)]
    assert all(d.action == QUEUE for d in queued)
    assert [d.replica.site for d in queued] == [0, 0, 1, 1, 2, 2]  # queue at the nearest with room
    d = cp.submit(Request(99, TINY, 0, 10), 0.0)
    assert d.action == REJECT and d.code == 3040


def test_reject_if_busy_gives_3040_instead_of_queueing(catalog):
    cp = plane(catalog, n_sites=2, n_ingress=1)
    for r in cp.state.replicas:
        fill(r)
    d = cp.submit(Request(1, TINY, 0, 10, reject_if_busy=True), 0.0)
    assert d.action == REJECT and d.code == 3040
    assert cp.submit(Request(2, TINY, 0, 10), 0.0).action == QUEUE


def test_kv_budget_limits_admission(catalog):
    cp = plane(catalog, n_sites=1, n_ingress=1)
    r = cp.state.replicas[0]
    r._start(Request(-1, TINY, 0, r.kv_capacity - 100), 0.0)
    assert cp.router.route(Request(1, TINY, 0, 50, 40), 0.0).action == START
    assert cp.router.route(Request(2, TINY, 0, 80, 40), 0.0).action == QUEUE


def test_down_nodes_are_never_chosen(catalog):
    cp = plane(catalog, n_sites=3, n_ingress=1)
    cp.set_node_up(0, False, 0.0)
    for name in ("nearest-with-capacity", "p2c", "latency-load", "session-affinity"):
        router = make_router(name, cp.state, np.random.default_rng(1))
        for k in range(50):
            d = router.route(Request(k, TINY, 0, 10, session=k % 3), 0.0)
            assert d.replica is not None and d.replica.node != 0


def test_p2c_balances_load_among_the_k_nearest(catalog):
    cp = plane(catalog, n_sites=5, n_ingress=1, router="p2c", k=3)
    for k in range(120):
        cp.submit(Request(k, TINY, 0, 10), 0.0)
    active = [r.active for r in cp.state.replicas]
    assert sum(active[:3]) == 120 and active[3:] == [0, 0]  # only the 3 nearest
    assert max(active[:3]) - min(active[:3]) <= 12  # and roughly balanced


def test_a_wrapped_policys_option_named_like_the_wrappers_is_set_under_base_options(catalog):
    """adapter-aware has a ``k`` of its own: the base p2c's ``k`` goes under ``base_options`` (a plain ``k`` is the
    wrapper's), and an option given both ways is refused."""
    cp = plane(catalog, n_sites=5, n_ingress=1, router="adapter-aware", base="p2c", k=8, base_options={"k": 3})
    assert cp.router.k == 8 and cp.router.base.k == 3
    for k in range(120):
        cp.submit(Request(k, TINY, 0, 10), 0.0)
    assert sum(r.active for r in cp.state.replicas[:3]) == 120  # the base balanced over its 3 nearest only
    plain = plane(catalog, n_sites=5, n_ingress=1, router="adapter-aware", base="p2c", k=2)
    assert plain.router.k == 2 and plain.router.base.k == 4  # the base's own default
    sticky = plane(catalog, n_sites=3, n_ingress=1, router="session-affinity", fallback="p2c",
                   fallback_options={"k": 2})
    assert sticky.router.fallback.k == 2
    with pytest.raises(UserError, match="'k' given both directly and in fallback_options"):
        plane(catalog, router="session-affinity", fallback="p2c", k=2, fallback_options={"k": 3})
    with pytest.raises(UserError, match="routing policy 'p2c' has no option 'window_ms'"):
        plane(catalog, router="adapter-aware", base="p2c", base_options={"window_ms": 3.0})
    from controlplane.routing.adapter import AdapterAware

    with pytest.raises(ValueError, match="cannot be given with a Router instance"):
        AdapterAware(cp.state, base=cp.router.base, base_options={"k": 2})


def test_p2c_is_deterministic_for_a_seed(catalog):
    picks = []
    for _ in range(2):
        cp = plane(catalog, n_sites=5, n_ingress=1, router="p2c", k=4)
        picks.append([cp.submit(Request(k, TINY, 0, 10), 0.0).replica.id for k in range(60)])
    assert picks[0] == picks[1]


def test_latency_load_prefers_a_farther_idle_replica_over_a_long_queue(catalog):
    from controlplane.perf import Roofline, gpu_table
    from topology import load_gpus

    fleet = make_fleet([1, 1])
    cp = ControlPlane(catalog, fleet, placement([(LLAMA, 0), (LLAMA, 1)]), np.array([[0.0, 30.0]]),
                      router="latency-load", perf=Roofline(gpu_table(load_gpus())),
                      admission=AdmissionConfig(queue_limit=100))
    near = cp.state.replicas[0]
    assert cp.router.route(Request(0, LLAMA, 0, 100, 50), 0.0).replica is near  # idle: nearest wins
    fill(near)
    for _ in range(60):
        near.queue.append(Request(-5, LLAMA, 0, 100))
    d = cp.router.route(Request(1, LLAMA, 0, 100, 50), 0.0)
    assert d.replica is cp.state.replicas[1] and d.action == START


def test_session_affinity_is_sticky_and_gated(catalog):
    cp = plane(catalog, n_sites=3, n_ingress=3, router="session-affinity", gate=1.0)
    first = cp.submit(Request(0, TINY, 0, 10, session="s"), 0.0).replica
    assert first.site == 0
    # from another ingress the nearest replica is elsewhere, but the session stays where its prefix is
    again = cp.submit(Request(1, TINY, 2, 10, session="s"), 0.0)
    assert again.replica is first and cp.router.sticky_hits == 1
    # without a session the same request goes to its own nearest replica
    assert cp.submit(Request(2, TINY, 2, 10), 0.0).replica.site == 2
    fill(first)  # the pinned replica is full: the gate re-pins instead of queueing behind it
    moved = cp.submit(Request(3, TINY, 0, 10, session="s"), 0.0)
    assert moved.action == START and moved.replica is not first and cp.router.gated == 1
    assert cp.router.pins["s", TINY] is moved.replica


def test_session_affinity_pins_each_model_of_a_session_apart(catalog):
    """A session that calls two models: each request goes to a replica of its own model, and each model's turns
    stay on that model's replica."""
    cp = plane(catalog, n_sites=3, n_ingress=3, router="session-affinity", models=(TINY, LLAMA))
    tiny = cp.submit(Request(0, TINY, 0, 10, session="s"), 0.0).replica
    llama = cp.submit(Request(1, LLAMA, 2, 10, session="s"), 0.0).replica
    assert tiny.model == TINY and llama.model == LLAMA and llama.site == 2  # not the session's TINY replica
    assert cp.submit(Request(2, TINY, 2, 10, session="s"), 0.0).replica is tiny
    assert cp.submit(Request(3, LLAMA, 0, 10, session="s"), 0.0).replica is llama
    assert cp.router.sticky_hits == 2


def test_prefix_aware_keeps_a_session_pin_per_model(catalog):
    """prefix-aware's session bonus: a session's call to another model does not move its chat's replica."""
    cp = plane(catalog, n_sites=3, n_ingress=3, router="prefix-aware", models=(TINY, LLAMA))
    first = cp.submit(Request(0, TINY, 0, 10, session="s"), 0.0).replica
    assert cp.submit(Request(1, LLAMA, 2, 10, session="s"), 0.0).replica.model == LLAMA
    assert cp.submit(Request(2, TINY, 2, 10, session="s"), 0.0).replica is first


def test_session_affinity_queues_below_the_gate(catalog):
    cp = plane(catalog, n_sites=2, n_ingress=1, router="session-affinity", gate=1.5, queue_limit=10)
    pinned = cp.submit(Request(0, TINY, 0, 10, session=7), 0.0).replica
    fill(pinned)
    d = cp.submit(Request(1, TINY, 0, 10, session=7), 0.0)
    assert d.action == QUEUE and d.replica is pinned


def test_unknown_router_or_option_is_one_clear_error(catalog):
    cp = plane(catalog)
    with pytest.raises(UserError, match="unknown routing policy 'fastest'"):
        make_router("fastest", cp.state)
    with pytest.raises(UserError, match="has no option .kk. \\(options: k\\)"):
        make_router("p2c", cp.state, kk=3)


@pytest.mark.parametrize("router", ["nearest-with-capacity", "nearest-balanced", "latency-load"])
def test_slots_lowered_below_the_running_count_hide_no_other_replica(catalog, router):
    """A live host learns its engine's limit: the replica that runs more than it now may keeps no negative count
    of free slots that would make the model look saturated."""
    cp = ControlPlane(catalog, make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]), line_rtt(1, 2), router=router)
    a, b = cp.state.replicas
    reqs = [Request(i, TINY, 0, 10) for i in range(10)]
    for q in reqs:
        assert cp.submit(q, 0.0).replica is a  # the nearest
    cp.set_slots(2, [a])
    assert a.stats.free == b.slots and a not in a.stats.free_set
    d = cp.submit(Request(100, TINY, 0, 10), 0.0)
    assert d.action == START and d.replica is b
    for q in reqs[:8]:  # a is still over its limit: its finishes free no slot
        cp.finish(q, 1.0)
    assert a.stats.free == b.slots - 1 and a not in a.stats.free_set
    cp.finish(reqs[8], 1.0)  # one running of two: one free
    assert a.stats.free == b.slots and a in a.stats.free_set


def test_latency_load_without_estimates_starts_where_it_can_before_it_queues(catalog):
    """No performance model, no predicted waits: a busy replica's wait is unknown, not zero."""
    cp = ControlPlane(catalog, make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]), np.array([[0.0, 10.0]]),
                      router="latency-load")
    cp.set_slots(1)
    a, b = cp.state.replicas
    assert cp.submit(Request(1, TINY, 0, 10), 0.0).replica is a
    d = cp.submit(Request(2, TINY, 0, 10), 0.0)
    assert d.action == START and d.replica is b  # 10 ms away and idle, not queued behind request 1
    assert cp.submit(Request(3, TINY, 0, 10), 0.0).action == QUEUE  # both busy: nearest-with-capacity queues it


def test_session_affinity_follows_a_pin_only_within_the_fallbacks_distance_bound(catalog):
    cp = ControlPlane(catalog, make_fleet([1, 1, 1]), placement([(TINY, 0), (TINY, 1), (TINY, 2)]), line_rtt(3, 3),
                      router="session-affinity", router_options={"max_rtt_ms": 5.0})
    pinned = cp.submit(Request(1, TINY, 0, 10, session="s"), 0.0)
    assert pinned.replica.site == 0
    assert cp.submit(Request(2, TINY, 0, 10, session="s"), 0.0).replica is pinned.replica  # sticky nearby
    far = cp.submit(Request(3, TINY, 2, 10, session="s"), 0.0)  # site 0 is 20 ms from ingress 2
    assert far.replica.site == 2 and far.rtt_ms <= 5.0
