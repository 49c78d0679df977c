"""The fleet samples (``utilisation.parquet``) read the control plane's running totals of running sequences,
queued requests and ready slots; these must equal a count over every replica and queue at every sample, through
queueing, time-outs, node faults (queues evicted, replicas reloaded) and scale-to-zero."""

import numpy as np
import pytest
from kit.sim import TokenClock, deployment, fleet, one_slot_catalog, poisson, three_site_lm, workload

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
    _, frame, dep = three_site_lm(3000, seed=4, autoscaler=Reactive(interval_s=1.0, idle_s=20.0))
    frame.loc[frame.arrival_s > 70, "arrival_s"] += 60.0  # a quiet minute: idle replicas scale to zero
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


def _checked_busy_counts(monkeypatch) -> list:
    """Wrap ``BusyEngines.count`` to assert it equals a read of every engine's flag; returns the (count, whether
    the meter's total answered) pairs seen."""
    from sim.readouts import BusyEngines

    seen, original = [], BusyEngines.count

    def checked(self):
        n = original(self)
        assert n == self.count_plain(), (n, self.count_plain())
        seen.append((n, self.metered == self.meter.bound))
        return n

    monkeypatch.setattr(BusyEngines, "count", checked)
    return seen


def test_busy_engines_from_the_meter_equal_a_recount_through_faults(monkeypatch):
    """The sampled busy-engine count comes from the GPU meter's running total: the same as reading every engine's
    flag at every sample, through busy periods, node failures (engines killed mid-work) and revivals."""
    seen = _checked_busy_counts(monkeypatch)
    _, frame, dep = three_site_lm(2000, seed=5)
    faults = [Fault("node", "0", 20.0, 10.0), Fault("node", "2", 35.0, 10.0)]
    sim = Simulation(dep, frame, TokenClock(step_ms=15.0), faults=faults, fault_policy="retry",
                     fault_handler=NodeFaults(), sample_s=0.25)
    res = sim.run()
    counts = np.array([c for c, _ in seen])
    assert len(seen) == len(res.utilisation) > 200
    assert all(fast for _, fast in seen)  # every engine reports to the meter: its total answered
    assert counts.max() == 3 and counts.min() == 0 and (res.utilisation.busy_replicas.to_numpy() == counts).all()


def test_busy_engines_of_disaggregated_replicas_are_read_one_by_one(monkeypatch):
    """A disaggregated replica's halves are bound to the meter each, but it is one engine of the simulation: the
    meter's total would count two, so every engine's flag is read instead (the same counts as before)."""
    from dataclasses import replace
    from pathlib import Path

    import pandas as pd

    from controlplane.catalog import Catalog, default_catalog
    from controlplane.perf import Roofline, gpu_table
    from sim.techniques import Techniques
    from sim.techniques.disagg import Disaggregation
    from sim.techniques.runtime import SimulationSeam

    seen = _checked_busy_counts(monkeypatch)
    spec = replace(default_catalog()["@cf/meta/llama-3.1-8b-instruct"], max_batch=8)
    roof = Roofline(gpu_table(pd.read_csv(Path(__file__).resolve().parents[2] / "topology" / "data" / "gpus.csv")))
    rng = np.random.default_rng(6)
    n = 200
    frame = workload(poisson(5.0, n, rng), spec.id, "text-generation", 1000, output=20)
    seam = SimulationSeam("edge", [Disaggregation(Techniques(disaggregation=True, prefill_fraction=0.5,
                                                             kv_link_gbps=25.0))])
    dep = deployment(Catalog([spec]), spec.id, 2, [[0.0]], sites=[0, 0])
    res = Simulation(dep, frame, roof, techniques=seam, sample_s=0.5).run()
    assert len(seen) == len(res.utilisation) > 10
    # (before the first request no engine exists, and the meter's total of none answers)
    assert not any(fast for c, fast in seen if c) and max(c for c, _ in seen) >= 1


def test_busy_and_shared_gpu_counts_of_the_meter_equal_a_recount(monkeypatch):
    """The GPU-busy samples read the meter's running counts of GPUs with work and of GPUs with more than one busy
    engine: the same as counting its per-GPU engine counts at every sample, with replicas sharing a GPU, through
    node failures."""
    import pandas as pd

    from controlplane.deployment import Deployment
    from controlplane.plane import AdmissionConfig, ControlPlane
    from sim.capacity import GpuBusySampler
    from sim.gpu_busy import GpuBusyMeter

    seen = []
    original = GpuBusySampler._run

    def run(self):
        meter = self.sim.gpu_meter
        for step in original(self):
            counts = meter.counts()
            assert (self.busy[-1], self.shared[-1]) == (np.count_nonzero(counts), np.count_nonzero(counts > 1))
            seen.append((self.busy[-1], self.shared[-1]))
            yield step

    monkeypatch.setattr(GpuBusySampler, "_run", run)
    rng = np.random.default_rng(7)
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=2)
    f = fleet(2, None, gpu="H100")
    table = pd.DataFrame({"model": [model] * 4, "node": [0, 0, 1, 1]})  # two replicas per node
    rtt = np.array([[0.0, 10.0], [10.0, 0.0]])
    plane = ControlPlane(catalog, f, table, rtt, router="nearest-balanced",
                         admission=AdmissionConfig(queue_limit=8, queue_timeout_s=5.0))
    shares = {r.node: set() for r in plane.state.replicas}
    for r in plane.state.replicas:
        shares[r.node] |= set(r.gpu_index)
    dep = Deployment("edge", plane, f, ingress_col="ingress", access_col="access_rtt_ms")
    n = 1500
    frame = workload(poisson(25.0, n, rng), model, "text-generation", rng.integers(1000, 30_000, n),
                     rng.integers(1, 40, n), ingress=rng.integers(0, 2, n), access_ms=5.0)
    sim = Simulation(dep, frame, TokenClock(step_ms=15.0), faults=[Fault("node", "1", 15.0, 10.0)],
                     fault_policy="retry", fault_handler=NodeFaults(), sample_s=0.25)
    GpuBusySampler(sim, 0.25)
    sim.run()
    assert isinstance(sim.gpu_meter, GpuBusyMeter) and len(seen) > 100
    assert max(b for b, _ in seen) >= 1 and min(b for b, _ in seen) == 0
    assert all(len(g) == 1 for g in shares.values())  # a node's two replicas on its one GPU: shared at times
    assert max(s for _, s in seen) >= 1
