"""Speculative decoding, P/D disaggregation and quantization in the simulator."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kit.sim import deployment, workload

from controlplane.catalog import Catalog, default_catalog
from controlplane.perf import Roofline, gpu_table, with_precision
from sim.simulator import Simulation
from sim.techniques import Techniques
from sim.techniques.disagg import Disaggregation, kv_transfer_s
from sim.techniques.metrics import itl_percentiles
from sim.techniques.quantization import quantize_catalog
from sim.techniques.runtime import SimulationSeam
from sim.techniques.speculative import SpeculativePerf, expected_tokens

LLAMA = "@cf/meta/llama-3.1-8b-instruct"
GPUS = Path(__file__).resolve().parents[2] / "topology" / "data" / "gpus.csv"


@pytest.fixture(scope="module")
def roof():
    return Roofline(gpu_table(pd.read_csv(GPUS)))


def disagg(prefill_fraction, kv_link_gbps):
    """The seam a run with only disaggregation on hands to Simulation, and the technique (for its stats)."""
    part = Disaggregation(Techniques(disaggregation=True, prefill_fraction=prefill_fraction,
                                     kv_link_gbps=kv_link_gbps))
    return SimulationSeam("edge", [part]), part


def llama(max_batch=32):
    spec = replace(default_catalog()[LLAMA], max_batch=max_batch)
    return Catalog([spec]), spec


def test_expected_tokens_per_step_is_the_geometric_sum():
    for a in (0.0, 0.3, 0.7, 0.95):
        for k in (1, 4, 8):
            assert expected_tokens(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert expected_tokens(0.7, 4) == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert expected_tokens(0.0, 4) == 1.0


def test_single_request_tpot_equals_the_analytic_speculative_step(roof):
    cat, spec = llama()
    k, a, c = 4, 0.7, 0.1
    sp = SpeculativePerf(roof, k, {"text-generation": a}, c)
    w = workload([0.0], spec.id, "text-generation", 100, output=33)
    tpot = Simulation(deployment(cat, spec.id, 1, [[0.0]]), w, sp).run().requests.tpot_ms[0]
    plain = Simulation(deployment(cat, spec.id, 1, [[0.0]]), w, roof).run().requests.tpot_ms[0]
    ctx = 96.0  # the engine times a 100-token context in its 64-token bucket's centre
    one = roof.decode_step_ms(spec, "H100", 1, ctx)
    verify = sp.verify_ms(spec, "H100", 1, ctx)
    assert tpot == pytest.approx((k * c * one + verify) / expected_tokens(a, k), rel=1e-9)
    assert plain == pytest.approx(one, rel=1e-9)
    # verifying k+1 positions costs more than one step, less than k+1 independent sequences
    assert one < verify < roof.decode_step_ms(spec, "H100", k + 1, ctx)
    assert tpot < plain


def test_disaggregated_ttft_is_colocated_ttft_plus_kv_transfer(roof):
    cat, spec = llama()
    w = workload([0.0], spec.id, "text-generation", 2000, output=20)
    colo = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof).run().requests
    seam, part = disagg(prefill_fraction=0.5, kv_link_gbps=25.0)
    dis = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof, techniques=seam).run().requests
    fac = part.factories["edge"]
    transfer_ms = kv_transfer_s(spec, 2000, 25.0) * 1e3
    assert transfer_ms == pytest.approx(2000 * spec.kv_bytes_per_token * 8 / 25e9 * 1e3)
    assert dis.ttft_ms[0] == pytest.approx(colo.ttft_ms[0] + transfer_ms, rel=1e-9)
    assert dis.tpot_ms[0] == pytest.approx(colo.tpot_ms[0], rel=1e-9)
    assert fac.stats()["pools"] == 1 and fac.stats()["kv_transfers"] == 1


def test_kv_transfers_share_their_site_link_one_at_a_time(roof):
    # Two prompts prefill side by side on the two prefill replicas and end together: the second KV transfer waits
    # for the first on the site's link, so its first token comes one transfer later.
    cat, spec = llama()
    w = workload([0.0, 0.0], spec.id, "text-generation", 2000, output=20)
    seam, part = disagg(prefill_fraction=0.5, kv_link_gbps=1.0)
    dis = Simulation(deployment(cat, spec.id, 4, [[0.0]], sites=[0] * 4), w, roof, techniques=seam).run().requests
    transfer_ms = kv_transfer_s(spec, 2000, 1.0) * 1e3
    assert sorted(dis.ttft_ms)[1] - sorted(dis.ttft_ms)[0] == pytest.approx(transfer_ms, rel=1e-6)
    st = part.factories["edge"].stats()
    assert st["kv_transfers"] == 2 and st["kv_link_queued"] == 1
    assert st["kv_link_wait_ms_mean"] == pytest.approx(transfer_ms / 2, abs=1e-3)
    assert st["kv_link_wait_ms_max"] == pytest.approx(transfer_ms, abs=1e-3)


def test_a_wait_for_decode_room_is_one_stalled_gap(roof):
    # One decode replica whose KV pool holds one sequence: the second waits there after its first token until the
    # first one ends. That wait is one long gap (a stall), not a slower decode over all its gaps.
    spec = replace(default_catalog()[LLAMA], kv_pool_tokens=3000)
    w = workload([0.0, 0.0], spec.id, "text-generation", 2000, output=20)
    dis = Simulation(deployment(Catalog([spec]), spec.id, 2, [[0.0]], sites=[0, 0]), w, roof,
                     techniques=disagg(0.5, 100.0)[0]).run().requests
    assert (dis.outcome == "ok").all()
    first, second = (0, 1) if dis.ttft_ms[0] < dis.ttft_ms[1] else (1, 0)
    wait = dis.e2e_ms[first] - dis.ttft_ms[second]
    assert wait > 10 * dis.tpot_ms[first]
    assert dis.stalls[first] == 0 and dis.stall_ms[first] == 0
    assert dis.stalls[second] == 1 and dis.stall_ms[second] == pytest.approx(wait, rel=1e-6)
    # its 19 decode steps take as long as the first sequence's did; the wait sits in the gap of its second token
    base = (dis.tpot_ms[second] * 19 - dis.stall_ms[second]) / 19
    assert base == pytest.approx(dis.tpot_ms[first], rel=0.05)
    assert itl_percentiles(dis.iloc[[second]], pcts=(100,))["p100"] == pytest.approx(base + wait, abs=1e-3)


def test_a_decode_replica_runs_at_most_max_batch_sequences(roof):
    # KV room for all four, slots for two: the other two wait in the pool, in order, for a slot (one stall each)
    cat, spec = llama(max_batch=2)
    w = workload([0.0] * 4, spec.id, "text-generation", 200, output=50)
    seam, part = disagg(0.5, 100.0)
    dis = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof, techniques=seam).run().requests
    assert (dis.outcome == "ok").all()
    assert (dis.stalls == 1).sum() == 2 and (dis.stalls == 0).sum() == 2
    ends = sorted(dis.e2e_ms)  # all arrived at 0
    # the two that waited started decoding when the first two ended
    waited = dis[dis.stalls == 1]
    assert (waited.ttft_ms + waited.stall_ms).min() == pytest.approx(ends[0], rel=1e-6)
    st = part.factories["edge"].stats()
    assert st["decode_queued"] == 2 and st["decode_wait_ms_max"] > 0


def test_disaggregation_lowers_itl_p99_on_a_mixed_load(roof):
    cat, spec = llama()
    rng = np.random.default_rng(5)
    n = 300
    arrivals = np.cumsum(rng.exponential(1 / 4.0, n))
    prompt = rng.integers(300, 4000, n)
    output = rng.integers(50, 300, n)
    w = workload(arrivals, spec.id, "text-generation", prompt, output=output)
    colo = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof).run().requests
    dis = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof,
                     techniques=disagg(0.5, 100.0)[0]).run().requests
    assert (colo.outcome == "ok").all() and (dis.outcome == "ok").all()
    assert dis.stalls.sum() == 0 and colo.stalls.sum() > 0  # decode replicas never run a prefill
    assert itl_percentiles(dis)["p99"] < itl_percentiles(colo)["p99"]


def test_quantized_decode_is_faster_and_a_big_model_fits_after_quantization(roof):
    _, spec = llama()
    bf16 = with_precision(spec, "bf16")
    for p in ("fp8", "int4"):
        assert roof.decode_step_ms(with_precision(spec, p), "H100", 8, 1000) < roof.decode_step_ms(bf16, "H100", 8,
                                                                                                      1000)
    # compute-bound prefill runs on the FP8 tensor cores of an H100, not on an A100 (weight-only there)
    assert roof.prefill_ms(with_precision(spec, "fp8"), "H100", 4000) < 0.8 * roof.prefill_ms(bf16, "H100", 4000)
    big = default_catalog()["@cf/meta/llama-3.3-70b-instruct-fp8-fast"]
    big = replace(with_precision(big, "bf16"), tensor_parallel=1)
    h100 = roof.gpu("H100").memory_bytes
    assert big.bytes_per_gpu > h100
    q = quantize_catalog(Catalog([big]), "int4")[big.id]
    assert q.precision == "int4" and q.weight_bytes == big.weight_bytes / 4
    assert q.bytes_per_gpu <= h100


def test_disaggregation_splits_every_gpu_type_and_decodes_where_steps_are_shortest(roof):
    from types import SimpleNamespace

    from sim.techniques.disagg import split_pools

    reps = [SimpleNamespace(gpu=g) for g in ["H100"] * 8 + ["H200"] * 8 + ["L40S"] * 4]
    pre, dec = split_pools(reps, 0.5)
    for pool in (pre, dec):
        assert [sum(r.gpu == g for r in pool) for g in ("H100", "H200", "L40S")] == [4, 4, 2]
    pre, dec = split_pools([SimpleNamespace(gpu=g) for g in ["H100"] * 3 + ["L40S"]], 0.25)
    assert [r.gpu for r in pre] == ["H100"] and sorted(r.gpu for r in dec) == ["H100", "H100", "L40S"]

    # One site with two H100s and two L40Ss: each pool gets one of each, and decoding goes to the H100 (a step
    # there with a second sequence is still far shorter than an idle L40S's), so TPOT is the H100's. (Split by
    # list order, the prefill pool would have taken both H100s and left decoding to the L40Ss.)
    cat, spec = llama()
    dep = deployment(cat, spec.id, 4, [[0.0]], sites=[0, 0, 0, 0], gpu=["H100", "H100", "L40S", "L40S"])
    w = workload([0.0, 0.05, 3.0], spec.id, "text-generation", 500, output=40)
    out = Simulation(dep, w, roof, techniques=disagg(0.5, 100.0)[0]).run().requests
    assert (out.outcome == "ok").all()
    h100 = roof.decode_step_ms(spec, "H100", 2, 544.0)
    l40s = roof.decode_step_ms(spec, "L40S", 1, 544.0)
    assert out.tpot_ms.max() < (h100 + l40s) / 2 < l40s


def test_kv_transfers_the_run_end_cuts_off_are_not_counted(roof):
    # One prefill and one decode replica, a link so slow that each transfer takes minutes: the first lands, the
    # two booked behind it would land after the drain horizon. Only the one that landed counts, and no wait
    # reported outlasts the run.
    cat, spec = llama()
    w = workload([0.0, 0.0, 0.0], spec.id, "text-generation", 2000, output=20)
    transfer_s = kv_transfer_s(spec, 2000, 0.01)
    assert 100 < transfer_s < 400
    seam, part = disagg(prefill_fraction=0.5, kv_link_gbps=0.01)
    drain = 1.5 * transfer_s
    sim = Simulation(deployment(cat, spec.id, 2, [[0.0]], sites=[0, 0]), w, roof, techniques=seam, drain_s=drain)
    res = sim.run()
    req = res.requests
    assert (req.outcome == "ok").sum() == 1 and (req.error_code == 3007).sum() == 2
    # the run ends at its drain horizon, not at the last ok completion (the window GPU utilisation divides by)
    assert res.sim_end_s == pytest.approx(drain) and req.e2e_ms.max() / 1e3 < 0.9 * drain
    st = part.factories["edge"].stats()
    assert st["kv_transfers"] == 1 and st["kv_link_queued"] == 0
    assert st["kv_link_wait_ms_max"] == 0.0 and st["kv_link_wait_ms_mean"] == 0.0
    assert st["kv_transfer_ms_mean"] == pytest.approx(transfer_s * 1e3, abs=1e-3)
