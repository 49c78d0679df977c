"""The host-speed probe beside every profile and replay: a real engine's decode step, and profiles rescaled by
the probes' ratio (durations only, pooled profiles brought to one speed first)."""

from __future__ import annotations

import pandas as pd
import pytest

from dataplane.session import SessionConfig
from sim.live.host_speed import (
    HostSpeedProbe,
    at_speed,
    common_speed,
    replay_speed,
    span_speed,
    speed_change_pct,
)
from sim.live.pooling import pooled_profile


def _profile(step: float, share2: float, loop: float = 80.0) -> pd.DataFrame:
    rows = [("m", "decode", 1, 1, 128, step), ("m", "host_share", 1, 1, 128, step),
            ("m", "host_share", 2, 1, 128, share2), ("m", "host_share_loop", 2, 0, 0, loop),
            ("m", "gw_piece", 1, 0, 0, 0.5)]
    return pd.DataFrame(rows, columns=["model", "phase", "batch_size", "tokens", "context", "ms"]).assign(
        provider="cpu", host="h")


def test_probe_times_a_real_engine_step_and_repeats_the_same_work():
    probe = HostSpeedProbe("gpt2-tiny", SessionConfig(intra_op_threads=1), steps=8, repeats=2)
    try:
        first, second = probe.probe(), probe.probe()
        assert first > 0 and second > 0
        assert probe.timed()["ms"] > 0
    finally:
        probe.close()


def test_probe_refuses_a_context_beyond_the_models_window():
    with pytest.raises(ValueError, match="window"):
        HostSpeedProbe("gpt2-tiny", context=10_000)


def test_durations_scale_by_the_probes_ratio_rates_do_not():
    slow = at_speed(_profile(2.0, 3.0), measured_at=2.0, speed=2.5)
    ms = slow.set_index(["phase", "batch_size"]).ms
    assert ms[("decode", 1)] == pytest.approx(2.5) and ms[("gw_piece", 1)] == pytest.approx(0.625)
    assert ms[("host_share", 2)] / ms[("host_share", 1)] == pytest.approx(1.5)  # the k-engine slowdown kept
    assert ms[("host_share_loop", 2)] == 80.0  # cores busy per second: not a duration
    assert _profile(2.0, 3.0).ms.tolist()[0] == 2.0  # the input is not modified
    with pytest.raises(ValueError, match="positive"):
        at_speed(_profile(2.0, 3.0), 0.0, 2.0)


def test_pooled_profiles_are_brought_to_one_speed_then_to_each_replays():
    # The same engine measured on a fast and a slow host (probe 2.0 vs 2.4 ms): at one speed, the rows agree,
    # so pooling sees no scatter; the median of the profile speeds is that speed.
    probes = [{"profile": [2.0, 2.0], "replay": [2.0, 2.2]}, {"profile": [2.4, 2.4], "replay": [2.4, 2.2]},
              {"profile": [2.2, 2.2], "replay": [2.2, 2.2]}]
    profiles = [_profile(1.0 * p["profile"][0], 1.5 * p["profile"][0]) for p in probes]
    matched, ref = common_speed(profiles, probes)
    assert ref == pytest.approx(2.2)
    for m in matched:
        assert m.set_index(["phase", "batch_size"]).ms[("decode", 1)] == pytest.approx(2.2)
    pooled = pooled_profile(matched)
    first = at_speed(pooled, ref, replay_speed(probes[0]))  # the first cell's replay ran at 2.1
    assert first.set_index(["phase", "batch_size"]).ms[("decode", 1)] == pytest.approx(2.1)
    assert [speed_change_pct(p) for p in probes] == [5.0, -4.2, 0.0]


def test_span_speed_refuses_a_missing_probe():
    assert span_speed(2.0, 3.0) == 2.5
    with pytest.raises(ValueError, match="positive"):
        span_speed(2.0, None)
