"""A replica's idle time after it (re)loads, a retried request's queue deadline, and billing's refusals: the
real plane and autoscaler driven by hand, with the time passed in."""

import numpy as np
import pandas as pd
import pytest
from kit.controlplane import TINY, make_fleet, placement

from controlplane.autoscale import Reactive
from controlplane.billing import Ledger, invoice_requests
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.state import COLD, READY, Request
from edgepop.errors import UserError

T = 100.0  # the run has been going for a while: a replica's initial last_busy (0) is long past idle_s
IDLE_S = 60.0


def scaled_plane(catalog, nodes=1, timeout=1e9):
    scaler = Reactive(interval_s=1.0, idle_s=IDLE_S, queue_high=1.0, max_per_site=3)
    cp = ControlPlane(catalog, make_fleet([1] * nodes, sites=[0] * nodes), placement([(TINY, 0)]),
                      np.zeros((1, 1)), autoscaler=scaler, admission=AdmissionConfig(queue_timeout_s=timeout))
    cp.set_slots(1)
    return cp


def scale_out(cp):
    """Three requests at T on one one-slot replica: two queue, the autoscaler adds a replica; they are all served
    by the first replica before the new one has loaded."""
    reqs = [Request(i, TINY, 0, 10, 5) for i in range(3)]
    for r in reqs:
        cp.submit(r, T)
    cp.poll(T)
    assert cp.autoscaler.activity()["scale_outs"] == 1
    new = cp.state.replicas[-1]
    for t in (T + 1, T + 2, T + 3):
        running = next(r for r in reqs if r.replica is not None and r in r.replica.running)
        cp.finish(running, t)
    assert not cp.state.replicas[0].queue and new.ready_at > T + 3
    return new


def router_reload(cp):
    """A cold replica that a request is routed to loads; the request times out while it loads."""
    r = cp.state.replicas[0]
    cp.state.unload(r)
    cp.submit(Request(0, TINY, 0, 10, 5), T)
    assert cp.counts["router_loads"] == 1 and cp.autoscaler.activity()["scale_outs"] == 0
    assert cp.poll(T + 1.5)[1]  # (timeout 1 s: expired while loading)
    return r


def fault_recovery(cp):
    """A node fails while its replica runs a request, and comes back later: the replica loads again."""
    r = cp.state.replicas[0]
    cp.submit(Request(0, TINY, 0, 10, 5), T)
    lost, _ = cp.set_node_up(0, False, T + 1)
    assert len(lost) == 1
    cp.set_node_up(0, True, T + 2)
    return r


@pytest.mark.parametrize("load", [scale_out, router_reload, fault_recovery])
def test_a_replica_that_finished_loading_is_idle_from_then(catalog, load):
    """Idle time counts from when a replica became ready, not from its last request before it loaded (0 for a
    new one): it is not scaled to zero as soon as it finishes loading, and is after idle_s."""
    cp = scaled_plane(catalog, timeout=1.0 if load is router_reload else 1e9)
    r = load(cp)
    ready_at = r.ready_at
    cp.poll(ready_at + 0.01)
    assert r.status == READY
    cp.poll(ready_at + IDLE_S - 1.0)
    assert r.status == READY
    cp.poll(ready_at + IDLE_S + 1.0)
    assert r.status == COLD and cp.autoscaler.activity()["scale_to_zero"] >= 1


def test_a_retried_request_is_held_to_the_timeout_from_its_new_queue():
    """Queued at t=0, started at t=1, lost to a node failure at t=2 and queued again at another site at t=2: with
    a 5 s timeout it expires at t=7, not at t=5 (its first queue's deadline)."""
    from controlplane.catalog import default_catalog

    cp = ControlPlane(default_catalog(), make_fleet([1, 1]), placement([(TINY, 0), (TINY, 1)]),
                      np.array([[0.0, 10.0]]), admission=AdmissionConfig(queue_timeout_s=5.0))
    cp.set_slots(1)
    a, b, x = (Request(i, TINY, 0, 10, 5) for i in range(3))
    assert [cp.submit(r, 0.0).action for r in (a, b, x)] == ["start", "start", "queue"]
    near = x.replica
    assert near.node == 0 and cp.finish(a if a.replica is near else b, 1.0) == [x]
    lost, _ = cp.set_node_up(0, False, 2.0)
    assert lost == [x]
    d = cp.submit(x, 2.0)
    assert d.action == "queue" and d.replica.node == 1
    assert cp.poll(5.0) == ([], [])
    assert cp.next_wakeup() == 7.0
    assert cp.poll(7.0)[1] == [x] and cp.counts["expired"] == 1


def test_an_invoice_refuses_rows_without_an_account():
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0], "neurons": [6000.0, 6000.0], "account": ["a", None]})
    with pytest.raises(UserError, match=r"^invoice: row 1: account is missing \(None or NaN\)"):
        invoice_requests(frame)
    frame.loc[1, "account"] = "b"
    assert invoice_requests(frame).neurons.tolist() == [6000.0, 6000.0]
    assert invoice_requests(frame.drop(columns="account")).account.tolist() == ["default"]  # no column: one account


@pytest.mark.parametrize("free", [float("nan"), -1000, float("inf"), "10"])
def test_the_free_allowance_must_be_a_finite_non_negative_number(free):
    frame = pd.DataFrame({"arrival_s": [0.0], "neurons": [6000.0]})
    message = "free_per_day must be a finite non-negative number of neurons"
    with pytest.raises(UserError, match=f"^invoice: {message}"):
        invoice_requests(frame, free_per_day=free)
    with pytest.raises(UserError, match=f"^ledger: {message}"):
        Ledger(free_per_day=free)
    assert invoice_requests(frame, free_per_day=0).billable_neurons.tolist() == [6000.0]
