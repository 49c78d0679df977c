"""The simulator against closed-form queueing results, and its latency decomposition."""

import math

import numpy as np
import pandas as pd
import pytest
from kit.sim import TokenClock, deployment, one_slot_catalog, poisson, three_site_lm, workload

from controlplane.catalog import default_catalog
from sim.simulator import Simulation


def run(dep, frame, perf=None, **kw):
    return Simulation(dep, frame, perf or TokenClock(), **kw).run()


def erlang_c_wait(lam, mu, c):
    """Mean waiting time in queue of M/M/c (Erlang C)."""
    a = lam / mu
    rho = a / c
    tail = a**c / math.factorial(c) / (1 - rho)
    p_wait = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    return p_wait / (c * mu - lam)


@pytest.mark.parametrize("c, lam, mu", [(1, 5.0, 10.0), (3, 24.0, 10.0)])
def test_mmc_waiting_time_matches_closed_form(c, lam, mu):
    rng = np.random.default_rng(11)
    catalog, model = one_slot_catalog()
    n = 40_000
    service_tokens = np.maximum(1, rng.exponential(1e6 / mu, size=n)).astype(np.int64)  # 1 token = 1 us
    frame = workload(poisson(lam, n, rng), model, "text-embeddings", service_tokens)
    dep = deployment(catalog, model, c, np.zeros((1, 1)), sites=[0] * c)
    res = run(dep, frame)
    ok = res.requests[res.requests.outcome == "ok"]
    assert len(ok) == n
    wq = ok.queue_ms.to_numpy()[n // 10:].mean() / 1e3  # drop the warm-up
    assert wq == pytest.approx(erlang_c_wait(lam, mu, c), rel=0.12)
    service = ok.prefill_ms.mean() / 1e3
    assert service == pytest.approx(1 / mu, rel=0.03)


def test_sampled_waiting_counts_a_shared_site_queue_once():
    """Replicas of one model at one site share one queue: the sampled ``waiting`` is its length, once (Little's
    law: mean waiting = arrival rate x mean queueing time), not once per replica."""
    rng = np.random.default_rng(5)
    catalog, model = one_slot_catalog()
    n, lam, mu, c = 20_000, 27.0, 10.0, 3
    service_tokens = np.maximum(1, rng.exponential(1e6 / mu, size=n)).astype(np.int64)
    frame = workload(poisson(lam, n, rng), model, "text-embeddings", service_tokens)
    res = Simulation(deployment(catalog, model, c, np.zeros((1, 1)), sites=[0] * c), frame, TokenClock(),
                     sample_s=0.5).run()
    ok = res.requests[res.requests.outcome == "ok"]
    assert len(ok) == n
    waiting = res.utilisation.waiting.iloc[len(res.utilisation) // 10:].mean()  # past the warm-up
    little = lam * ok.queue_ms.to_numpy()[n // 10:].mean() / 1e3
    assert waiting == pytest.approx(little, rel=0.25)


def test_ttft_decomposition_adds_up():
    rng = np.random.default_rng(3)
    catalog = default_catalog()
    model = "@edgepop/gpt2-tiny"
    n = 3000
    frame = workload(poisson(40.0, n, rng), model, "text-generation", rng.integers(10, 300, n),
                     rng.integers(1, 60, n), ingress=rng.integers(0, 2, n), access_ms=rng.uniform(2, 30, n))
    rtt = np.array([[0.0, 25.0], [25.0, 0.0]])
    dep = deployment(catalog, model, 2, rtt, queue_limit=5)
    res = run(dep, frame, TokenClock(step_ms=20.0))
    f = res.requests
    ok = f[f.outcome == "ok"]
    assert len(ok) > n * 0.9
    total = ok.network_rtt_ms + ok.queue_ms + ok.cold_start_ms + ok.prefill_ms + ok.retry_lost_ms
    np.testing.assert_allclose(ok.ttft_ms, total, rtol=1e-9, atol=1e-6)
    assert (ok.queue_ms >= -1e-9).all() and (ok.prefill_ms > 0).all()
    # E2E = TTFT + (output - 1) inter-token gaps
    gen = ok[ok.output_tokens > 1]
    np.testing.assert_allclose(gen.e2e_ms, gen.ttft_ms + gen.tpot_ms * (gen.output_tokens - 1), rtol=1e-9)
    # network = access + backbone: requests served at their own ingress site pay only the access RTT
    local = ok[ok.serving_site == ok.ingress_pop]
    assert len(local) > 0


def test_decode_time_follows_the_step_time_and_prefill_stalls():
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=8)
    # two requests: the second joins while the first decodes, stalling it for one prefill iteration
    frame = workload([0.0, 0.5], model, "text-generation", [100_000, 50_000], [101, 11])
    dep = deployment(catalog, model, 1, np.zeros((1, 1)))
    f = run(dep, frame, TokenClock(step_ms=10.0)).requests.set_index("request_id")
    assert f.loc[0, "prefill_ms"] == pytest.approx(100.0)
    assert f.loc[0, "stalls"] == 1 and f.loc[0, "stall_ms"] == pytest.approx(50.0)
    # 100 gaps of 10 ms plus one 50 ms prefill stall
    assert f.loc[0, "tpot_ms"] * 100 == pytest.approx(100 * 10.0 + 50.0, rel=1e-6)
    assert f.loc[1, "tpot_ms"] == pytest.approx(10.0, rel=1e-6)


def test_same_seed_same_frame():
    def once():
        rng = np.random.default_rng(8)
        catalog, model = one_slot_catalog()
        frame = workload(poisson(20.0, 2000, rng), model, "text-embeddings", rng.integers(1, 90_000, 2000))
        dep = deployment(catalog, model, 2, np.array([[0.0, 5.0]]), router="p2c", rng=np.random.default_rng(1))
        return run(dep, frame).requests
    a, b = once(), once()
    assert a.equals(b)


class NodeFaults:
    """Minimal fault handler: GPU node ``target`` (an index) down for the interval."""

    down_pops = ()

    def apply(self, sim, fault, down):
        (sim.kill_node if down else sim.revive_node)(int(fault.target), sim.env.now)


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_every_request_ends_exactly_once_under_faults(policy):
    from sim.faults import Fault

    n = 4000
    model, frame, dep = three_site_lm(n, seed=4)
    faults = [Fault("node", "0", 20.0, 30.0), Fault("node", "1", 40.0, 20.0), Fault("node", "0", 100.0, 5.0)]
    sim = Simulation(dep, frame, TokenClock(step_ms=15.0), faults=faults, fault_policy=policy,
                     fault_handler=NodeFaults())
    f = sim.run().requests
    assert len(f) == n and f.request_id.is_unique
    counts = f.outcome.value_counts()
    assert counts.sum() == n and set(counts.index) <= {"ok", "rejected", "failed"}
    during = f[(f.arrival_s > 21) & (f.arrival_s < 49)]
    assert not (during.node == "N0").any()  # nothing starts on a dead node
    if policy == "fail":
        assert counts.get("failed", 0) > 0 and (f[f.outcome == "failed"].error_code == 3043).all()
    else:
        assert f.retries.sum() > 0
        assert counts.get("failed", 0) < counts.get("ok", 0) / 50  # only streams cut mid-way fail
    assert set(f[f.outcome == "rejected"].error_code) <= {3040, 3007}
    state = dep.plane.state
    assert (state.replicas[0].active, state.replicas[0].kv_used) == (0, 0)
    recount = sum(r.slots - r.active for r in state.replicas if r.up and r.status == "ready")
    assert state.stats[model].free == recount == sum(r.slots for r in state.replicas)


def test_a_retry_that_queues_again_is_held_to_the_timeout_from_then():
    """Request 2 queues at t=0.01, starts at t=1, loses its node at t=2 and queues at the other site behind a request
    running until t=6: with a 5 s timeout it waits there until 7 (so it is served at 6), not until 5.01."""
    from sim.faults import Fault

    catalog, model = one_slot_catalog()
    frame = workload([0.0, 0.0, 0.01], model, "text-embeddings", np.array([1_000_000, 6_000_000, 3_000_000]))
    dep = deployment(catalog, model, 2, np.array([[0.0, 10.0]]), timeout=5.0)
    sim = Simulation(dep, frame, TokenClock(), faults=[Fault("node", "0", 2.0, 100.0)], fault_handler=NodeFaults())
    f = sim.run().requests.set_index("request_id")
    assert f.node.tolist() == ["N0", "N1", "N1"] and f.retries.tolist() == [0, 0, 1]
    assert (f.outcome == "ok").all()
    # waited 4 s in its second queue (about 6 s since it first queued), then its 3 s prefill: done at t=9
    assert f.loc[2, "queue_ms"] == pytest.approx(4000.0) and f.loc[2, "ttft_ms"] == pytest.approx(9000.0)


def test_scale_to_zero_then_cold_start_shows_in_ttft():
    from controlplane.autoscale import Reactive

    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=4)
    # a burst, 60 s of silence (the replica is unloaded after 10 s idle), then another burst
    arrivals = [0.0, 0.1, 0.2, 70.0, 70.1, 70.2]
    frame = workload(arrivals, model, "text-generation", 2000, 5)
    dep = deployment(catalog, model, 1, np.zeros((1, 1)), autoscaler=Reactive(interval_s=1.0, idle_s=10.0))
    f = run(dep, frame, TokenClock(step_ms=10.0)).requests.set_index("request_id")
    assert (f.outcome == "ok").all()
    assert (f.loc[[0, 1, 2], "cold_start_ms"] == 0).all()
    cold = catalog[model].weight_bytes / 2e9 * 1e3 + 5000.0  # AdmissionConfig defaults: 2 GB/s + 5 s init
    assert f.loc[3, "cold_start_ms"] == pytest.approx(cold, rel=1e-6)
    assert f.loc[4, "cold_start_ms"] == pytest.approx(cold - 100.0, rel=1e-6)  # arrived 0.1 s into the load
    total = f.network_rtt_ms + f.queue_ms + f.cold_start_ms + f.prefill_ms + f.retry_lost_ms
    np.testing.assert_allclose(f.ttft_ms, total, atol=1e-6)


def test_cold_start_is_the_load_of_the_replica_a_request_starts_on():
    """A request queued behind a loading replica that starts on a sibling freed first waited in the queue, not
    for a cold start: its queue time never goes negative and TTFT still adds up."""
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=1)
    # Two replicas at one site; the second is scaled to zero. Request 0 takes the first for 0.5 s (a prefill of
    # 5 x 10^5 tokens at 1 us each); request 1 finds no free slot, wakes the second (a load of about 5 s) and queues
    # at the site, whose head starts on the first replica when request 0 ends.
    frame = workload([0.0, 0.1], model, "text-generation", np.array([500_000, 1_000]), 2)
    dep = deployment(catalog, model, 2, np.zeros((1, 1)), sites=[0, 0])
    dep.plane.state.unload(dep.plane.state.replicas[1])
    f = run(dep, frame, TokenClock(step_ms=10.0)).requests.set_index("request_id")
    assert (f.outcome == "ok").all()
    assert f.loc[1, "node"] == "N0"
    assert f.loc[1, "cold_start_ms"] == 0.0
    assert f.loc[1, "queue_ms"] == pytest.approx(f.loc[0, "e2e_ms"] - 100.0, abs=1e-6)  # until request 0 ended
    total = f.network_rtt_ms + f.queue_ms + f.cold_start_ms + f.prefill_ms + f.retry_lost_ms
    np.testing.assert_allclose(f.ttft_ms, total, atol=1e-6)


def test_gpu_busy_time_counts_a_shared_gpu_once():
    """An encoder beside a language model on one GPU: while both compute the GPU is busy once, not twice."""
    from kit.sim import fleet

    from controlplane.catalog import Catalog
    from controlplane.deployment import Deployment
    from controlplane.plane import ControlPlane

    lm_catalog, lm = one_slot_catalog("@edgepop/gpt2-tiny")
    enc_catalog, enc = one_slot_catalog("@cf/baai/bge-base-en-v1.5")
    catalog = Catalog([lm_catalog[lm], enc_catalog[enc]])
    f = fleet(1)
    plane = ControlPlane(catalog, f, pd.DataFrame({"model": [lm, enc], "node": [0, 0]}), np.zeros((1, 1)))
    dep = Deployment("edge", plane, f, ingress_col="ingress", access_col="access_rtt_ms")
    # Both start at 0 and compute for 0.5 s (prefills of 5 x 10^5 tokens at 1 us each), then the GPU idles.
    both = pd.concat([workload([0.0], lm, "text-generation", 500_000, 1),
                      workload([0.0], enc, "text-embeddings", 500_000)], ignore_index=True)
    both["request_id"] = [0, 1]
    sim = Simulation(dep, both, TokenClock())
    res = sim.run()
    assert (res.requests.outcome == "ok").all()
    assert sim.gpu_busy_seconds() == pytest.approx(0.5, abs=1e-9)
    assert sim.gpu_busy_seconds_by_type() == {"H100": pytest.approx(0.5, abs=1e-9)}


def test_fail_policy_fails_running_requests_and_reroutes_queued_ones():
    """``fault_policy = "fail"``: the request computing on the failed node fails (3043); the one queued there only
    lost its place in the queue and is routed again (to the other site, where it is served)."""
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=1)
    # r0 computes on node 0 (site 0), r1 on node 1 (site 1, 5 ms away); r2 finds both busy and queues at node 0.
    frame = workload([0.0, 0.01, 0.02], model, "text-generation", np.array([500_000, 300_000, 1_000]), 2)
    dep = deployment(catalog, model, 2, np.array([[0.0, 5.0]]))
    sim = Simulation(dep, frame, TokenClock(step_ms=10.0), fault_policy="fail")

    def fault(env):
        yield env.timeout(0.1)
        sim.kill_node(0, env.now)

    sim.env.process(fault(sim.env))
    f = sim.run().requests.set_index("request_id")
    assert (f.loc[0, "outcome"], f.loc[0, "error_code"]) == ("failed", 3043)
    assert f.loc[1, "outcome"] == f.loc[2, "outcome"] == "ok"
    assert f.loc[2, "node"] == "N1" and f.loc[2, "retries"] == 1
