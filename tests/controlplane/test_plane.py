"""Admission, queues and timeouts, cold starts and autoscaling, faults, memory accounting and billing."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.controlplane import LLAMA, TINY, line_rtt, make_fleet, placement

from controlplane.autoscale import Reactive, Scheduled, make_autoscaler
from controlplane.billing import (
    FREE_NEURONS_PER_DAY,
    Ledger,
    fleet_cost,
    invoice_requests,
    neurons,
    neurons_array,
)
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.routing import QUEUE, REJECT, START
from controlplane.state import COLD, LOADING, READY, ClusterState, Request
from edgepop.errors import UserError


def one_node(catalog, model=TINY, **adm):
    return ControlPlane(catalog, make_fleet([1]), placement([(model, 0)]), np.zeros((1, 1)),
                        admission=AdmissionConfig(**adm))


def test_admission_codes(catalog):
    cp = one_node(catalog)
    assert cp.submit(Request(0, "@cf/no/such", 0, 10), 0.0).code == 5007
    ctx = catalog[TINY].context_window
    assert cp.submit(Request(1, TINY, 0, ctx + 1), 0.0).code == 3006
    assert cp.submit(Request(2, TINY, 0, ctx - 10, 20), 0.0).code == 3006  # prompt + output over the window
    assert cp.submit(Request(3, TINY, 0, ctx - 10, 10), 0.0).action == START


def test_every_language_model_admits_a_request_of_its_whole_window(catalog):
    # A replica reserves a request's prompt + output in its KV pool; a pool smaller than the window refused
    # (3006) requests the catalog's context window promised, on every replica.
    for spec in catalog.by_task("text-generation"):
        cp = ControlPlane(catalog, make_fleet([spec.tensor_parallel], gpu_memory_gb=141.0),
                          placement([(spec.id, 0)]), np.zeros((1, 1)))
        assert cp.submit(Request(0, spec.id, 0, spec.context_window - 100, 100), 0.0).action == START, spec.id
        assert cp.submit(Request(1, spec.id, 0, spec.context_window, 1), 0.0).code == 3006, spec.id


def test_finish_starts_queued_requests_in_fifo_order(catalog):
    cp = one_node(catalog, queue_limit=10)
    slots = cp.state.replicas[0].slots
    running = [Request(k, TINY, 0, 5) for k in range(slots)]
    for r in running:
        assert cp.submit(r, 0.0).action == START
    waiting = [Request(100 + k, TINY, 0, 5) for k in range(3)]
    for r in waiting:
        assert cp.submit(r, 0.1).action == QUEUE
    assert cp.finish(running[0], 1.0) == [waiting[0]]
    assert waiting[0].started_at == 1.0 and waiting[0].replica is cp.state.replicas[0]
    assert cp.finish(running[1], 2.0) == [waiting[1]]


def test_queue_timeout_is_3007_and_each_request_leaves_once(catalog):
    cp = one_node(catalog, queue_limit=10, queue_timeout_s=5.0)
    r0 = cp.state.replicas[0]
    for k in range(r0.slots):
        cp.submit(Request(k, TINY, 0, 5), 0.0)
    late = Request(500, TINY, 0, 5)
    cp.submit(late, 1.0)
    assert cp.next_wakeup() == pytest.approx(6.0)
    assert cp.poll(5.9) == ([], [])
    started, expired = cp.poll(6.0)
    assert expired == [late] and not r0.queue
    assert cp.poll(100.0) == ([], [])  # never expired twice


B3 = "@cf/meta/llama-3.2-3b-instruct"  # a KV pool of 80,000 tokens: a 50,000 and a 40,000-token request cannot share it


def test_the_next_head_of_a_site_queue_starts_when_the_head_leaves(catalog):
    """Head-of-line blocking holds a queue behind a head that fits nowhere; when that head leaves (expires, is
    cancelled, starts), the next one starts wherever it fits, at once (it was left waiting, then dropped 3007)."""
    for leave in ("expire", "cancel"):
        cp = ControlPlane(catalog, make_fleet([1]), placement([(B3, 0)]), np.zeros((1, 1)),
                          admission=AdmissionConfig(queue_timeout_s=30.0))
        cp.set_slots(2)
        long, short, big, small = (Request(1, B3, 0, 50_000), Request(2, B3, 0, 100), Request(3, B3, 0, 40_000),
                                   Request(4, B3, 0, 100))
        assert [cp.submit(q, t).action for q, t in ((long, 0.0), (short, 0.0), (big, 1.0), (small, 2.0))] == [
            START, START, QUEUE, QUEUE]
        assert cp.state.totals() == cp.state.recount() == (2, 2, 2)  # (running, queued, slots)
        assert cp.finish(short, 3.0) == []  # big heads the queue and does not fit beside long
        if leave == "expire":
            started, expired = cp.poll(31.0)
            assert expired == [big] and started == [small]
        else:
            assert cp.cancel(big, 10.0) == [small]
        assert small.started_at >= 0 and not cp.state.replicas[0].queue
        assert cp.state.totals() == cp.state.recount() == (2, 0, 2)
    # Two replicas share the site queue: the head starts on the one that freed, the next on its sibling.
    cp = ControlPlane(catalog, make_fleet([1, 1], sites=[0, 0]), placement([(B3, 0), (B3, 1)]), np.zeros((1, 1)))
    cp.set_slots(2)
    a, b = cp.state.replicas
    reqs = [Request(i, B3, 0, kv) for i, kv in enumerate((50_000, 100, 50_000, 100, 40_000, 100))]
    assert [cp.submit(q, 0.0).replica for q in reqs[:4]] == [a, a, b, b]
    assert [cp.submit(q, 1.0).action for q in reqs[4:]] == [QUEUE, QUEUE]
    assert cp.finish(reqs[3], 2.0) == []  # the 40,000-token head does not fit b
    assert cp.finish(reqs[0], 3.0) == [reqs[4], reqs[5]]  # it starts on a; the next fits b and starts there
    assert reqs[4].replica is a and reqs[5].replica is b


def test_a_node_fault_evicts_a_site_queue_whose_other_replicas_are_all_cold(catalog):
    """The only other replica of the site is scaled to zero (its GPU since holds another model): nothing would start
    the queue's requests, so they are evicted for the caller to send elsewhere instead of expiring with 3007."""
    # 18 GB GPUs: the 3B (16.7 GB) fits one, but not beside the tiny model (1.7 GB)
    cp = ControlPlane(catalog, make_fleet([1, 1, 1], gpu_memory_gb=18.0, sites=[0, 0, 1]),
                      placement([(TINY, 0), (TINY, 1), (TINY, 2)]), np.array([[0.0, 10.0]]),
                      admission=AdmissionConfig(queue_timeout_s=30.0))
    cp.set_slots(1)
    a, b, _ = cp.state.replicas
    cp.state.unload(b)
    cp.add_replica(B3, 1, 0.0, cold=False)  # b cannot load again
    reqs = [Request(i, TINY, 0, 10) for i in range(4)]
    assert [cp.submit(q, 0.0).action for q in reqs] == [START, START, QUEUE, QUEUE]
    assert reqs[2].replica is a and reqs[3].replica is a
    lost, evicted = cp.set_node_up(0, False, 1.0)
    assert lost == [reqs[0]] and evicted == [reqs[2], reqs[3]] and not a.queue


def test_cold_start_then_ready(catalog):
    adm = AdmissionConfig(load_gbs=2.0, init_s=5.0)
    cp = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), np.zeros((1, 1)), admission=adm)
    r = cp.state.replicas[0]
    cp.state.unload(r)
    assert r.status == COLD and cp.state.gpu_used[0].sum() == 0
    req = Request(0, LLAMA, 0, 100, 10)
    d = cp.submit(req, 10.0)
    assert d.action == QUEUE and d.cold and r.status == LOADING
    load_s = catalog[LLAMA].weight_bytes / 2e9 + 5.0
    assert cp.next_wakeup() == pytest.approx(10.0 + load_s)
    started, _ = cp.poll(10.0 + load_s)
    assert started == [req] and r.status == READY


def reactive_plane(catalog, **options):
    """A llama replica on a 2-GPU node beside a 1-GPU node at one site, under a reactive autoscaler."""
    scaler = Reactive(interval_s=1.0, **options)
    cp = ControlPlane(catalog, make_fleet([2, 1], sites=[0, 0]), placement([(LLAMA, 0)]), np.zeros((1, 1)),
                      autoscaler=scaler, admission=AdmissionConfig(queue_limit=50, queue_timeout_s=1e9))
    return cp, scaler, cp.state.replicas[0]


def test_reactive_autoscaler_scales_to_zero_and_out(catalog):
    cp, scaler, r0 = reactive_plane(catalog, idle_s=30.0, queue_high=2.0)
    cp.poll(31.0)
    assert r0.status == COLD and scaler.unloads == 1  # idle for 30 s: scaled to zero
    cp.poll(32.0)  # wake it again through a request
    reqs = [Request(k, LLAMA, 0, 100, 10) for k in range(r0.slots + 10)]
    for q in reqs:
        cp.submit(q, 40.0)
    assert r0.status == LOADING
    cp.poll(41.0)  # queue is deep: the scaler adds a replica on the node with free memory
    assert len(cp.state.replicas) == 2 and cp.state.replicas[1].status == LOADING
    assert scaler.loads >= 1


def test_runtime_loads_keep_one_language_model_per_gpu(catalog):
    # One 80 GB GPU holding a language model has memory for another, but under one_llm_per_gpu a second one may not
    # compute there; an encoder may. Without the rule (a gateway's explicit table) memory alone decides.
    emb = "@cf/baai/bge-base-en-v1.5"
    for rule in (True, False):
        cp = ControlPlane(catalog, make_fleet([1, 1], sites=[0, 0]), placement([(LLAMA, 0)]), np.zeros((1, 1)),
                          one_llm_per_gpu=rule)
        state = cp.state
        assert (state.fits(catalog[LLAMA], 0) is None) is rule
        assert state.fits(catalog[emb], 0) is not None
        assert state.fits(catalog[LLAMA], 1) is not None
    # A reactive scale-out skips the roomier node whose GPU already computes for a language model.
    fleet = make_fleet([1, 1], sites=[0, 0], gpu_memory_gb=80.0)
    scaler = Reactive(interval_s=1.0, idle_s=1e9, queue_high=1.0, max_per_site=4)
    cp = ControlPlane(catalog, fleet, placement([(LLAMA, 0), (TINY, 1)]), np.zeros((1, 1)), autoscaler=scaler,
                      admission=AdmissionConfig(queue_limit=500, queue_timeout_s=1e9), one_llm_per_gpu=True)
    r0 = cp.state.replicas[0]
    for k in range(r0.slots + 10):
        cp.submit(Request(k, LLAMA, 0, 100, 10), 0.0)
    for t in range(1, 6):
        cp.poll(float(t))
    llms = [r for r in cp.state.replicas if r.spec.generative and r.status != COLD]
    per_gpu = pd.Series([(r.node, g) for r in llms for g in r.gpu_index]).value_counts()
    assert per_gpu.max() == 1  # node 1 holds the tiny model: its GPU took no llama either
    assert len([r for r in llms if r.model == LLAMA]) == 1


def test_reactive_min_ready_counts_only_replicas_on_up_nodes(catalog):
    """A replica on a down node serves nothing: idle unloading keeps ``min_ready`` replicas ready on up nodes."""
    scaler = Reactive(interval_s=1.0, idle_s=0.0, min_ready=1)
    cp = ControlPlane(catalog, make_fleet([1, 1], sites=[0, 1]), placement([(LLAMA, 0), (LLAMA, 1)]),
                      np.zeros((1, 2)), autoscaler=scaler)
    up, down = cp.state.replicas
    cp.set_node_up(down.node, False, 0.5)
    cp.poll(2.0)
    assert up.status == READY and up.up  # the last replica that can serve stays
    assert down.status == COLD and scaler.unloads == 1  # the idle one on the down node counted for nothing
    cp.poll(4.0)
    assert up.status == READY


def test_reactive_scale_out_needs_a_queue_even_at_queue_high_zero(catalog):
    """``queue_high = 0`` scales out on any wait, never on an empty queue (it loaded every free slot of memory)."""
    cp, scaler, r0 = reactive_plane(catalog, idle_s=1e9, queue_high=0.0)
    cp.submit(Request(0, LLAMA, 0, 100, 10), 0.0)  # starts at once: nothing waits
    for t in range(1, 4):
        cp.poll(float(t))
    assert len(cp.state.replicas) == 1 and scaler.loads == 0
    for k in range(1, r0.slots + 1):  # the last one waits
        cp.submit(Request(k, LLAMA, 0, 100, 10), 4.0)
    assert len(r0.queue) == 1
    cp.poll(5.0)
    assert scaler.loads == 1


def test_a_plan_placed_by_memory_alone_is_not_held_to_one_language_model_per_gpu_when_it_reloads(topo):
    """Its replicas share GPUs by the plan's own rule: scaled to zero, each loads again where it was."""
    from controlplane.catalog import default_catalog
    from controlplane.deployment import DeploymentConfig, build_deployment

    for policy, rule in (("everywhere-fits", False), ("greedy-demand", True)):
        dep = build_deployment("edge", DeploymentConfig(placement=policy, pops=("FRA", "LHR")), topo,
                               default_catalog(), demand_rps=5.0)
        state = dep.plane.state
        assert state.one_llm_per_gpu is rule
        if not rule:
            r = next(r for r in state.replicas if r.spec.generative
                     and sum(bool(o.spec.generative and o.node == r.node and set(o.gpu_index) & set(r.gpu_index))
                             for o in state.replicas) > 1)  # a language model sharing its GPU with another
            state.unload(r)
            assert state.begin_load(r, 0.0, 1.0)


def test_a_node_back_up_loads_its_replicas_again(catalog):
    adm = AdmissionConfig(load_gbs=2.0, init_s=5.0)
    cp = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), np.zeros((1, 1)), admission=adm)
    r = cp.state.replicas[0]
    cp.set_node_up(0, False, 10.0)
    assert cp.submit(Request(0, LLAMA, 0, 100, 10), 11.0).action == REJECT  # nothing up
    cp.set_node_up(0, True, 20.0)
    load_s = catalog[LLAMA].weight_bytes / 2e9 + 5.0
    assert r.status == LOADING and r.ready_at == pytest.approx(20.0 + load_s)
    d = cp.submit(Request(1, LLAMA, 0, 100, 10), 21.0)
    assert d.action == QUEUE and d.cold
    started, _ = cp.poll(20.0 + load_s)
    assert [q.id for q in started] == [1] and r.status == READY


def test_unloading_a_replica_empties_its_prefix_cache(catalog):
    from controlplane.prefix_index import PrefixIndex

    cp = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), np.zeros((1, 1)),
                      prefix=PrefixIndex(block_tokens=16, fraction=0.5))
    req = Request(0, LLAMA, 0, 64, 4)
    req.hash_ids = (1, 2, 3, 4)
    assert cp.submit(req, 0.0).action == START
    cp.finish(req, 1.0)
    again = Request(1, LLAMA, 0, 64, 4)
    again.hash_ids = (1, 2, 3, 4)
    assert cp.submit(again, 2.0).action == START and again.cached_tokens > 0
    cp.finish(again, 3.0)
    r = cp.state.replicas[0]
    cp.state.unload(r)
    cp.submit(Request(2, LLAMA, 0, 64, 4), 4.0)  # wakes it: a cold load
    cp.poll(1e6)
    late = Request(3, LLAMA, 0, 64, 4)
    late.hash_ids = (1, 2, 3, 4)
    assert cp.submit(late, 1e6).action == START and late.cached_tokens == 0  # the blocks left with its memory


def test_scheduled_autoscaler_follows_local_time(catalog):
    fleet = make_fleet([1, 1])
    fleet.sites["tz"] = ["Asia/Tokyo", "America/New_York"]
    scaler = Scheduled(interval_s=60, warm_hours=(7, 23), start_utc="2024-01-15T12:00:00+00:00")
    cp = ControlPlane(catalog, fleet, placement([(TINY, 0), (TINY, 1)]), line_rtt(1, 2), autoscaler=scaler)
    cp.poll(0.0)  # 21:00 in Tokyo (warm), 07:00 in New York (warm)
    assert [r.status for r in cp.state.replicas] == [READY, READY]
    cp.poll(3 * 3600.0)  # 00:00 in Tokyo: cold; 10:00 in New York: warm
    assert [r.status for r in cp.state.replicas] == [COLD, READY]
    cp.poll(10 * 3600.0)  # 07:00 in Tokyo again: loading back
    assert cp.state.replicas[0].status == LOADING


def test_scheduled_autoscaler_refuses_an_empty_warm_window():
    # equal ends fell into the wrap-around branch: [9, 9] kept every replica warm all day
    with pytest.raises(UserError, match=r"^scheduled autoscaler: warm_hours \[9, 9\] is an empty window"):
        Scheduled(warm_hours=[9, 9])
    assert Scheduled(warm_hours=[0, 24]).warm(3.0) and not Scheduled(warm_hours=[22, 6]).warm(12.0)


def test_unknown_autoscaler():
    with pytest.raises(UserError, match="unknown autoscaling policy"):
        make_autoscaler("magic")
    assert make_autoscaler("none") is None


def test_node_failure_releases_everything_and_routes_around(catalog):
    cp = ControlPlane(catalog, make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]), line_rtt(1, 2),
                      admission=AdmissionConfig(queue_limit=5))
    r0 = cp.state.replicas[0]
    running = [Request(k, TINY, 0, 5) for k in range(r0.slots)]
    for q in running:
        cp.submit(q, 0.0)
    for r in cp.state.replicas:
        for k in range(r.slots - r.active):
            cp.submit(Request(1000 + k, TINY, 0, 5), 0.0)
    queued = Request(7, TINY, 0, 5)
    assert cp.submit(queued, 0.0).replica is r0
    lost, evicted = cp.set_node_up(0, False, 1.0)
    assert lost == running and evicted == [queued]  # in start order (a set's would follow memory addresses)
    assert r0.active == 0 and r0.kv_used == 0 and not r0.queue
    assert cp.submit(Request(8, TINY, 0, 5), 1.0).replica is cp.state.replicas[1]
    cp.set_node_up(0, True, 2.0)
    assert cp.submit(Request(9, TINY, 0, 5), 2.0).replica is r0


def test_a_request_lost_to_a_node_fault_and_queued_again_is_held_to_the_queue_timeout(catalog):
    """A lost request had started: once re-queued it must count as waiting (it waited for ever past its timeout)."""
    cp = ControlPlane(catalog, make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]), line_rtt(1, 2),
                      admission=AdmissionConfig(queue_limit=5, queue_timeout_s=4.0))
    r0, r1 = cp.state.replicas
    lost = Request(0, TINY, 0, 5)
    assert cp.submit(lost, 0.0).replica is r0
    for k in range(1, r0.slots + r1.slots):  # both nodes full: the retry queues
        cp.submit(Request(k, TINY, 0, 5), 0.0)
    assert r1.active == r1.slots
    assert lost in cp.set_node_up(0, False, 1.0)[0]
    assert lost.started_at < 0
    assert cp.submit(lost, 1.0).action == QUEUE
    assert cp.poll(4.9) == ([], [])
    assert cp.poll(5.0)[1] == [lost]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from([TINY, LLAMA, "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
                                               "@cf/baai/bge-base-en-v1.5"]), st.integers(0, 2),
                              st.booleans()), max_size=40))
def test_gpu_memory_is_never_over_committed(catalog, ops):
    fleet = make_fleet([1, 2, 4], gpu_memory_gb=48.0)
    state = ClusterState(catalog, fleet, pd.DataFrame(columns=["model", "node"]), np.zeros((1, 3)))
    for model, node, unload in ops:
        spec = catalog[model]
        try:
            r = state.add_replica(spec, node)
        except ValueError:
            assert state.fits(spec, node) is None
            continue
        assert len(set(r.gpu_index)) == spec.tensor_parallel
        if unload:
            state.unload(r)
        for used, cap in zip(state.gpu_used, state.gpu_capacity, strict=True):
            assert np.all(used <= cap + 1.0) and np.all(used >= -1.0)


def test_bad_placement_row_is_one_clear_error(catalog):
    with pytest.raises(UserError, match="placement row 0: .*does not fit on node N0"):
        ControlPlane(catalog, make_fleet([1], gpu_memory_gb=16.0), placement([(LLAMA, 0)]), np.zeros((1, 1)))


def test_neurons_and_invoice(catalog):
    llama = catalog[LLAMA]
    assert neurons(llama, 1e6, 0) == llama.neurons_per_m_input
    n = neurons(llama, 1000, 200)
    assert n == pytest.approx((1000 * 25608 + 200 * 75147) / 1e6)
    arr = neurons_array(catalog, [LLAMA, "@cf/microsoft/resnet-50"], [1000, 1], [200, 0])
    assert arr[0] == pytest.approx(n) and arr[1] == pytest.approx(228055 / 1e6)
    ledger = Ledger()
    ledger.charge("a", 0, 4000)
    ledger.charge("a", 0, 8000)
    ledger.charge("b", 0, 500)
    ledger.charge("a", 1, 9000)
    inv = ledger.invoice().set_index(["account", "day"])
    assert inv.loc[("a", 0)].billable_neurons == 2000 and inv.loc[("a", 0)].usd == pytest.approx(0.022)
    assert inv.loc[("b", 0)].usd == 0 and inv.loc[("a", 1)].usd == 0
    frame = pd.DataFrame({"neurons": [6000.0, 6000.0, 6000.0], "arrival_s": [0.0, 10.0, 90_000.0]})
    by_day = invoice_requests(frame).set_index("day")
    assert by_day.loc[0].billable_neurons == 12000 - FREE_NEURONS_PER_DAY and by_day.loc[1].usd == 0
    # Started at noon UTC, the first two fall on one UTC day and 50,000 s later is the next: each within the
    # free allowance (counted from time 0, the three made one billable day)
    noon = pd.DataFrame({"neurons": [10_000.0, 10_000.0], "arrival_s": [0.0, 50_000.0]})
    days = invoice_requests(noon, start_utc="2024-03-20T12:00:00Z")
    assert days.day.tolist() == [19802, 19803] and days.usd.sum() == 0
    assert invoice_requests(noon).usd.sum() > 0
    # a compressed day (600 s) started at 23:00 UTC: its midnight comes 25 simulated seconds in
    late = pd.DataFrame({"neurons": [1.0, 1.0], "arrival_s": [20.0, 30.0]})
    assert invoice_requests(late, day_s=600.0, start_utc="2024-03-20T23:00:00+00:00").day.tolist() == [19802, 19803]


def test_fleet_cost(catalog):
    fleet = make_fleet([8, 2])
    cost = fleet_cost(fleet, 7200)
    assert cost["gpu_hours"] == 20 and cost["usd"] == pytest.approx(60.0)


def test_decisions_and_counts_add_up(catalog):
    cp = ControlPlane(catalog, make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]), line_rtt(2, 2),
                      admission=AdmissionConfig(queue_limit=3))
    rng = np.random.default_rng(5)
    actions = {START: 0, QUEUE: 0, REJECT: 0}
    for k in range(400):
        d = cp.submit(Request(k, TINY, int(rng.integers(0, 2)), int(rng.integers(1, 200))), 0.0)
        actions[d.action] += 1
    c = cp.counts
    assert c["submitted"] == 400 and c["started"] == actions[START] and c["queued"] == actions[QUEUE]
    assert c["rejected"] == actions[REJECT] > 0
    snap = cp.snapshot()
    assert snap["running"] + snap["waiting"] + c["rejected"] == 400


def test_submit_avoiding_replicas_spills_over_and_restores_the_state(catalog):
    cp = ControlPlane(catalog, make_fleet([1, 1, 1]), placement([(TINY, 0), (TINY, 1), (TINY, 2)]), line_rtt(3, 3))
    near, mid, far = cp.state.replicas
    stats = near.stats
    before = (stats.free, set(stats.free_set), stats.cold)
    d = cp.submit(Request(0, TINY, 0, 5), 0.0, avoid=[near])
    assert d.action == START and d.replica is mid  # the next nearest, as if the nearest were full
    assert near.up and near.active == 0 and mid.active == 1
    assert (stats.free, stats.cold) == (before[0] - 1, before[2]) and stats.free_set == before[1]
    d = cp.submit(Request(1, TINY, 0, 5), 0.0, avoid=[near, mid, far])
    assert d.action == REJECT and d.code == 3040  # nothing left to take it
    assert all(r.up for r in cp.state.replicas) and stats.free == before[0] - 1
    assert cp.submit(Request(2, TINY, 0, 5), 0.0).replica is near  # without avoid: the nearest again
