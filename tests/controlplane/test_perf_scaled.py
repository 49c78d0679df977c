"""A service-time model with its prefill and decode times scaled (controlplane/perf_scaled.py)."""

import pytest

from controlplane.perf import Roofline, capacity_rps
from controlplane.perf_scaled import ScaledPerf, scaled_perf

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def roof(topo):
    return Roofline.from_topology(topo)


def test_each_phase_takes_its_own_factor_options_passed_through(roof, catalog):
    spec = catalog[LLAMA]
    s = ScaledPerf(roof, prefill=1.5, decode=2.0)
    assert s.prefill_ms(spec, "L4", 700) == pytest.approx(1.5 * roof.prefill_ms(spec, "L4", 700))
    assert s.prefill_ms(spec, "H100", 700, tp=2) == pytest.approx(1.5 * roof.prefill_ms(spec, "H100", 700, tp=2))
    both = [300, 500]
    assert s.prefill_batch_ms(spec, "L4", both) == pytest.approx(1.5 * roof.prefill_batch_ms(spec, "L4", both))
    assert s.decode_step_ms(spec, "L4", 8, 900.0) == pytest.approx(2.0 * roof.decode_step_ms(spec, "L4", 8, 900.0))
    # a mixed iteration: the decode rows' step at x2, the rest (the prompts' part) at x1.5
    whole = roof.mixed_step_ms(spec, "L4", [256], 8, 900.0, prior=[0])
    step = roof.decode_step_ms(spec, "L4", 8, 900.0)
    assert 0 < step < whole
    assert s.mixed_step_ms(spec, "L4", [256], 8, 900.0, prior=[0]) == pytest.approx(2.0 * step + 1.5 * (whole - step))
    assert ScaledPerf(roof, 3.0, 3.0).mixed_step_ms(spec, "L4", [256], 8, 900.0) == pytest.approx(
        3.0 * roof.mixed_step_ms(spec, "L4", [256], 8, 900.0))
    # memory is not a time: the wrapped model's
    assert s.memory_per_gpu(spec, "L4") == roof.memory_per_gpu(spec, "L4")


def test_a_replica_at_twice_the_times_serves_half_the_requests(roof, catalog):
    spec = catalog[LLAMA]
    assert capacity_rps(ScaledPerf(roof, 2.0, 2.0), spec, "L40S") == pytest.approx(capacity_rps(roof, spec, "L40S") / 2)
    # slower decode alone: less capacity, but more than half (the prefill keeps its speed)
    one = capacity_rps(roof, spec, "L40S")
    assert one / 2 < capacity_rps(ScaledPerf(roof, 1.0, 2.0), spec, "L40S") < one


def test_at_one_it_is_the_model_itself_and_bad_factors_are_refused(roof):
    assert scaled_perf(roof, 1.0, 1.0) is roof
    assert isinstance(scaled_perf(roof, 1.0, 1.2), ScaledPerf)
    for bad in (0.0, -1.0, 101.0, float("nan"), "2"):
        with pytest.raises(ValueError, match="time scale must be in"):
            ScaledPerf(roof, prefill=bad)


def test_only_what_the_wrapped_model_has_and_no_unscaled_breakdowns(roof, catalog):
    class Plain:  # a model with the two required methods only
        def prefill_ms(self, spec, gpu, tokens):
            return 10.0

        def decode_step_ms(self, spec, gpu, batch, context):
            return 2.0

    s = ScaledPerf(Plain(), 2.0, 3.0)
    assert getattr(s, "prefill_batch_ms", None) is None and getattr(s, "mixed_step_ms", None) is None
    assert (s.prefill_ms(None, "L4", 5), s.decode_step_ms(None, "L4", 1, 10.0)) == (20.0, 6.0)
    with pytest.raises(AttributeError, match="not scaled"):
        ScaledPerf(roof, 2.0, 2.0).prefill_breakdown(catalog[LLAMA], "L4", [100])


def test_a_scenario_with_slower_service_is_slower_and_says_so():
    from dataclasses import replace

    from sim.report import title_line
    from sim.run import run_scenario
    from sim.scenario import load_scenario

    sc = load_scenario("small")
    base = run_scenario(sc, requests=400, deployments=("edge",))
    slow = run_scenario(replace(sc, prefill_time_scale=2.0, decode_time_scale=2.0), requests=400,
                        deployments=("edge",))
    assert "service_time_scale" not in base.summary
    assert slow.summary["service_time_scale"] == {"prefill": 2.0, "decode": 2.0}
    assert "service times x2" in title_line(slow.summary)
    def gen(out):
        return out.requests[(out.requests.task == "text-generation") & (out.requests.outcome == "ok")]

    b, s = gen(base), gen(slow)
    assert len(b) > 50 and len(s) > 50
    # the same arrivals; TPOT and TTFT (network included) slower
    assert s.tpot_ms.median() > 1.6 * b.tpot_ms.median()
    assert s.ttft_ms.median() > b.ttft_ms.median()
