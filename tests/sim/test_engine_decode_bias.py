"""The engine keeps a decode step's time while the batch is unchanged, though the context grows: a known bias,
documented in docs/simulate.md with these figures (benchmarks/decode_context_bias.py prints them)."""

import pytest

from sim.decode_bias import decode_bias


@pytest.mark.parametrize("gpu, short_pct", [("H100", 8.7), ("L4", 10.5)])
def test_engine_decode_of_a_long_steady_batch_is_short_by_the_documented_bias(gpu, short_pct):
    r = decode_bias(gpu, n=4, prompt=100, output=7000)
    assert r["simulated_s"] < r["stepwise_s"]  # the step is timed at the 100-token context it started with
    assert r["short_pct"] == pytest.approx(short_pct, abs=0.1)
    assert r["short_pct"] < 11.0  # the bound docs/simulate.md states for this case


def test_engine_decode_bias_vanishes_for_short_outputs():
    assert abs(decode_bias("H100", n=4, prompt=100, output=100)["short_pct"]) < 1.0
