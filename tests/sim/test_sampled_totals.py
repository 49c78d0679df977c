"""The fleet samples (``utilisation.parquet``) read the control plane's running totals of running sequences,
queued requests and ready slots; these must equal a count over every replica and queue at every sample, through
queueing, time-outs, node faults (queues evicted, replicas reloaded) and scale-to-zero."""

import numpy as np
import pytest
from kit.sim import TokenClock, deployment, one_slot_catalog, poisson, workload

from controlplane.autoscale import Reactive
from controlplane.state import ClusterState
from sim.faults import Fault
from sim.simulator import Simulation


class NodeFaults:
    """GPU node ``target`` (an index) down for the fault's interval."""

    down_pops = ()

    def apply(self, sim, fault, down):
        (sim.kill_node if down else sim.revive_node)(int(fault.target), sim.env.now)


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_sampled_totals_equal_a_recount_at_every_sample(monkeypatch, policy):
    seen = []

    def checked(state):
        totals = original(state)
        assert totals == state.recount(), (totals, state.recount())
        seen.append(totals)
        return totals

    original = ClusterState.totals
    monkeypatch.setattr(ClusterState, "totals", checked)
    rng = np.random.default_rng(4)
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=4)
    n = 3000
    frame = workload(poisson(30.0, n, rng), model, "text-generation", rng.integers(1000, 60_000, n),
                     rng.integers(1, 40, n), ingress=rng.integers(0, 3, n), access_ms=5.0)
    frame.loc[frame.arrival_s > 70, "arrival_s"] += 60.0  # a quiet minute: idle replicas scale to zero
    rtt = 10.0 * np.abs(np.subtract.outer(np.arange(3), np.arange(3)))
    dep = deployment(catalog, model, 3, rtt, queue_limit=8, timeout=5.0,
                     autoscaler=Reactive(interval_s=1.0, idle_s=20.0))
    faults = [Fault("node", "0", 20.0, 30.0), Fault("node", "1", 40.0, 20.0), Fault("node", "0", 150.0, 5.0)]
    sim = Simulation(dep, frame, TokenClock(step_ms=15.0), faults=faults, fault_policy=policy,
                     fault_handler=NodeFaults(), sample_s=0.25)
    res = sim.run()
    running, waiting, slots = (np.array(c) for c in zip(*seen, strict=True))
    assert len(seen) == len(res.utilisation) > 400
    # every path the totals follow was taken: queues formed, a node's slots left and came back, replicas unloaded
    assert waiting.max() > 0 and running.max() > 0 and slots.min() < slots.max()
    assert dep.plane.autoscaler.activity()["scale_to_zero"] > 0
    assert (res.requests.outcome == "rejected").any()
