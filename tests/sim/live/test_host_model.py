"""The live-host model on known service times: the live engine's iteration structure (a request arriving
mid-step waits for it, prompts admitted together are prefilled padded to the longest, a prefill stalls the
decoding batch), processor sharing of the host, and a decomposition that adds up. Simulated time only."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from kit.gateway import GEN

from dataplane.gateway.backend import Backend
from dataplane.gateway.config import GatewayConfig
from edgepop.errors import UserError
from sim.live.decompose import E2E_PARTS, TTFT_PARTS, sim_components
from sim.live.fidelity import simulate_like
from sim.live.host_params import HostParams, fit_host_share, share_slowdown
from sim.live.replay import ReplayOptions, build_requests
from sim.traces import read_trace

STEP_MS = 2.0


class ConstPerf:
    """Prefill: 1 ms per padded token (batch x longest); decode: 2 ms a step, whatever the batch."""

    def __init__(self, table=None):
        if table is not None:
            self.table = table

    def prefill_batch_ms(self, spec, gpu, tokens, **_):
        return float(len(tokens) * max(tokens))

    def prefill_ms(self, spec, gpu, tokens, **_):
        return float(tokens)

    def decode_step_ms(self, spec, gpu, batch, context, **_):
        return STEP_MS


@pytest.fixture(scope="module")
def desc(topo):
    return Backend(GatewayConfig(pops=["FRA", "SIN"], models=[GEN], delay=True), topo).describe()


def _live(tmp_path, topo, rows: list[tuple[float, int, int]]) -> pd.DataFrame:
    """A replay frame as the live side would leave it: (arrival s, prompt, output) per request, from Frankfurt."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": int(a * 1e3), "input_length": p, "output_length": o,
                                        "hash_ids": []}) + "\n" for a, p, o in rows))
    opts = ReplayOptions(url="http://127.0.0.1:1", trace=str(path), model=GEN, max_prompt=400, max_output=64)
    f = build_requests(read_trace(str(path))[0], topo, opts, np.random.default_rng(0))
    f["user_lat"], f["user_lon"] = 50.11, 8.68  # every client in Frankfurt: served at FRA
    ingress, access = topo.ingress(f.user_lat.to_numpy(), f.user_lon.to_numpy())
    f["ingress"], f["access_rtt_ms"] = ingress.astype(np.int64), access
    f["ingress_pop"] = topo.pops.id.to_numpy()[ingress]
    return f.assign(sent_lag_ms=0.0, completion_tokens=f.output_tokens, prompt_tokens_served=f.prompt_tokens,
                    status=200, error="")


def test_iterations_mirror_the_live_engine(desc, topo, tmp_path):
    # A alone; B arrives 1 ms into A's decoding (mid-step); C and D arrive together later.
    live = _live(tmp_path, topo, [(0.0, 40, 5), (0.0415, 10, 3), (1.0, 20, 2), (1.0, 60, 2)])
    sim = simulate_like(desc, live, topo, perf=ConstPerf(), host_model=True).set_index("request_id")
    parts = sim_components(sim.reset_index()).set_index("request_id")
    assert (sim.outcome == "ok").all()
    # A alone: prefill 40 ms, then 4 decode steps of 2 ms.
    assert parts.loc[0, "prefill"] == pytest.approx(40.0) and parts.loc[0, "engine_wait"] == 0.0
    # B waits for A's running step to end, and its 10 ms prefill stalls A.
    assert 0.0 < parts.loc[1, "engine_wait"] <= STEP_MS + 1e-9
    assert parts.loc[1, "prefill"] == pytest.approx(10.0)
    assert parts.loc[0, "stall"] == pytest.approx(10.0)
    # C and D are admitted together: one call padded to the longer prompt, 2 x 60 ms.
    assert parts.loc[2, "prefill"] == pytest.approx(120.0) and parts.loc[3, "prefill"] == pytest.approx(120.0)
    # Decode steps are the profile's; TTFT and E2E are the sums of their parts.
    assert parts.step_ms.to_numpy() == pytest.approx(STEP_MS)
    assert np.allclose(parts[list(E2E_PARTS)].sum(axis=1), sim.loc[parts.index, "e2e_ms"], atol=1e-6)
    assert np.allclose(parts[list(TTFT_PARTS)].sum(axis=1), sim.loc[parts.index, "ttft_ms"], atol=1e-6)
    tpot = (sim.e2e_ms - sim.ttft_ms) / (sim.output_tokens - 1)
    assert np.allclose(sim.tpot_ms, tpot)


def test_a_join_stalls_the_batch_for_its_prefill_and_the_measured_merge(desc, topo, tmp_path):
    # B (10 tokens) joins A (40 tokens, 2 tokens decoded): both rows at A's 41-token past, B padded to it first.
    merge = pd.DataFrame({"phase": "kv_merge", "batch_size": 1, "tokens": [100, 400, 800], "context": [0, 100, 400],
                          "ms": [0.5 + 0.01 * 100, 0.5 + 0.01 * 400 + 0.02 * 100, 0.5 + 0.01 * 800 + 0.02 * 400]})
    params = HostParams(merge)
    assert params.merge_ms(82, 41) == pytest.approx(0.5 + 0.01 * 82 + 0.02 * 41)
    assert HostParams(merge.iloc[:0]).merge_ms(82, 41) is None  # no rows: the kv_copy rows' rate instead
    live = _live(tmp_path, topo, [(0.0, 40, 5), (0.0415, 10, 3)])
    sim = simulate_like(desc, live, topo, perf=ConstPerf(merge), host_model=True)
    parts = sim_components(sim).set_index(sim.request_id)
    assert parts.loc[0, "stall"] == pytest.approx(10.0 + params.merge_ms(2 * 41, 41))
    assert parts.loc[1, "prefill"] == pytest.approx(10.0)  # its first token comes before the merge


def test_rows_that_stay_pay_the_measured_trim_in_their_step(desc, topo, tmp_path):
    # A (8 tokens, 3 out) and B (20 tokens, 6 out) arrive together: A leaves after 2 steps, B is copied out at
    # its 22 positions, and that copy is part of B's third step.
    trim = pd.DataFrame({"phase": "kv_trim", "batch_size": [1, 2], "tokens": [100, 400], "context": 0,
                         "ms": [0.3 + 0.002 * 100, 0.3 + 0.002 * 400]})
    params = HostParams(trim)
    assert params.trim_ms(22) == pytest.approx(0.3 + 0.002 * 22) and HostParams(trim.iloc[:0]).trim_ms(22) is None
    sim = simulate_like(desc, _live(tmp_path, topo, [(0.0, 8, 3), (0.0, 20, 6)]), topo, perf=ConstPerf(trim),
                        host_model=True)
    parts = sim_components(sim).set_index(sim.request_id)
    assert parts.loc[0, "decode"] == pytest.approx(2 * STEP_MS)
    assert parts.loc[1, "decode"] == pytest.approx(5 * STEP_MS + params.trim_ms(22))


def test_merge_fit_keeps_every_term_non_negative():
    from sim.live.host_params import fit_merge

    tokens, pad = np.array([100.0, 400, 800, 1600]), np.array([0.0, 400, 0, 1600])
    assert fit_merge(tokens, pad, 1.0 + 0.004 * tokens + 0.002 * pad) == pytest.approx([1.0, 0.004, 0.002])
    # a fall with the positions written is noise, not a negative rate: the fit drops the term
    coef = fit_merge(tokens, pad, np.array([5.0, 4.8, 4.0, 3.9]))
    assert (coef >= 0).all() and coef[0] > 0


def test_shared_host_slows_engines_busy_at_once(desc, topo, tmp_path):
    """Two replicas decoding at once on a host fitted to one core: each step takes twice as long."""
    table = pd.DataFrame({"phase": ["host_share", "host_share"], "batch_size": [1, 2], "tokens": [1, 1],
                          "ms": [2.0, 4.0]})
    assert HostParams(table, max_cores=2.0).slowdown(2) == pytest.approx(2.0)
    live = _live(tmp_path, topo, [(0.0, 8, 20), (0.0, 8, 20)])
    live.loc[1, ["user_lat", "user_lon"]] = 1.35, 103.82  # Singapore: served at SIN
    ingress, access = topo.ingress(live.user_lat.to_numpy(), live.user_lon.to_numpy())
    live["ingress"], live["access_rtt_ms"] = ingress.astype(np.int64), access
    alone = simulate_like(desc, live.iloc[:1], topo, perf=ConstPerf(table), host_model=True)
    both = simulate_like(desc, live, topo, perf=ConstPerf(table), host_model=True)
    assert set(both.serving_site) == {"FRA", "SIN"}
    step_alone = sim_components(alone).step_ms.iloc[0]
    steps_both = sim_components(both).step_ms.to_numpy()
    assert step_alone == pytest.approx(STEP_MS)
    assert steps_both.max() > 1.5 * STEP_MS  # while both decode, each runs at half speed


def test_host_share_fit_reads_cores_and_lock():
    k = np.array([1.0, 2.0, 3.0, 4.0])
    for cores, lock in ((2.0, 0.3), (1.0, 0.0), (2.0, 0.8)):
        s = np.array([share_slowdown(n, n * lock, cores, lock) for n in k])
        fc, fl = fit_host_share(k, s, 2.0)
        got = np.array([share_slowdown(n, n * fl, fc, fl) for n in k])
        assert np.allclose(got, s, rtol=0.03)
    # Alone, an engine and the event loop on two cores without lock contention run at full speed.
    assert share_slowdown(2, 1.0, 2.0, 0.0) == 1.0


def test_host_share_fit_counts_what_ran_beside_the_engines():
    """The measurement's own event loop and client took cores too: counted, the fit finds the host's two cores;
    ignored, it reads them as fewer cores for the engines."""
    k = np.array([1.0, 2.0, 3.0, 4.0])
    loop, client = np.array([0.05, 0.1, 0.15, 0.2]), np.array([0.2, 0.35, 0.5, 0.6])
    model = np.array([share_slowdown(n + u + c, n * 0.1 + u, 2.0, 0.1)
                      for n, u, c in zip(k, loop, client, strict=True)])
    s = model / model[0]
    cores, lock = fit_host_share(k, s, 2.0, loop, client)
    assert cores == pytest.approx(2.0, abs=0.05)
    blind, _ = fit_host_share(k, s, 2.0)
    assert blind < 1.8
    table = pd.DataFrame({"phase": ["host_share"] * 4 + ["host_share_loop"] * 4 + ["host_share_client"] * 4,
                          "batch_size": np.tile(k.astype(int), 3), "tokens": 1, "context": 128,
                          "ms": np.concatenate([3.0 * s, 1e3 * loop, 1e3 * client])})
    assert HostParams(table).cores == pytest.approx(2.0, abs=0.05)


def test_iteration_gap_follows_the_batch_size(desc, topo, tmp_path):
    """The engine loop's gap between iterations is the profile's figure for the running batch size: one request
    alone pays the batch-1 gap per step, two decoding together the batch-2 gap."""
    table = pd.DataFrame({"phase": ["iter_gap", "iter_gap"], "batch_size": [1, 4], "tokens": [0, 0],
                          "ms": [0.5, 2.0]})
    params = HostParams(table)
    assert params.iter_gap_ms(1) == pytest.approx(0.5) and params.iter_gap_ms(2) == pytest.approx(1.0)
    assert params.iter_gap_ms(16) == pytest.approx(2.0)  # the largest measured batch beyond it
    one = simulate_like(desc, _live(tmp_path, topo, [(0.0, 8, 6)]), topo, perf=ConstPerf(table), host_model=True)
    two = simulate_like(desc, _live(tmp_path, topo, [(0.0, 8, 6), (0.0, 8, 6)]), topo, perf=ConstPerf(table),
                        host_model=True)
    # 5 decode steps after the first token, each followed (but the last) by the loop's gap.
    assert sim_components(one).engine_loop.iloc[0] == pytest.approx(4 * 0.5, abs=1e-6)
    assert sim_components(two).engine_loop.to_numpy() == pytest.approx(4 * 1.0, abs=1e-6)


def test_the_served_hosts_cores_not_this_machines(desc, topo, tmp_path):
    """Host-sharing rows that show no slowdown for two engines: on a 1-core host that is impossible (the fit is
    bounded by the cores), on a 16-core host it is what the rows say; a saved run keeps the host's cores."""
    table = pd.DataFrame({"phase": ["host_share", "host_share"], "batch_size": [1, 2], "tokens": [1, 1],
                          "ms": [2.0, 2.0]})
    live = _live(tmp_path, topo, [(0.0, 8, 20), (0.0, 8, 20)])
    live.loc[1, ["user_lat", "user_lon"]] = 1.35, 103.82  # Singapore: served at SIN
    ingress, access = topo.ingress(live.user_lat.to_numpy(), live.user_lon.to_numpy())
    live["ingress"], live["access_rtt_ms"] = ingress.astype(np.int64), access

    def slowest_step(**kw):
        sim = simulate_like(kw.pop("d", desc), live, topo, perf=ConstPerf(table), host_model=True, **kw)
        return sim_components(sim).step_ms.max()

    assert desc["host_cores"] >= 1  # the gateway says what it ran on
    assert slowest_step(host_cores=16) == pytest.approx(STEP_MS)
    assert slowest_step(host_cores=1) > 1.5 * STEP_MS
    assert slowest_step(d=dict(desc, host_cores=1)) == slowest_step(host_cores=1)


def test_host_rows_pooled_per_k_as_the_median_over_profiles_other_rows_untouched():
    from sim.live.pooling import (
        HOST_ROWS,
        pooled_engine_rows,
        pooled_host_rows,
        pooled_profile,
        with_engine_rows,
        with_host_rows,
    )

    def profile(share3, step):
        rows = [("m", "decode", 1, 1, 128, step), ("m", "host_share", 1, 1, 128, 3.6),
                ("m", "host_share", 3, 1, 128, share3), ("m", "host_share_loop", 3, 0, 0, 80.0)]
        return pd.DataFrame(rows, columns=["model", "phase", "batch_size", "tokens", "context", "ms"]).assign(
            provider="cpu", host="h")

    profiles = [profile(7.6, 2.5), profile(6.4, 2.6), profile(6.7, 2.7)]
    pooled = pooled_host_rows(profiles)
    assert set(pooled.phase) <= set(HOST_ROWS) and len(pooled) == 3
    assert pooled.set_index(["phase", "batch_size"]).ms[("host_share", 3)] == pytest.approx(6.7)
    mixed = with_host_rows(profiles[0], pooled)
    assert list(mixed.columns) == list(profiles[0].columns) and len(mixed) == len(profiles[0])
    assert mixed[mixed.phase == "decode"].ms.tolist() == [2.5]  # the cell's own engine rows stay
    assert with_host_rows(profiles[0], None) is profiles[0]
    engines = pooled_engine_rows(profiles)  # the other way round: engine rows pooled, host rows the cell's
    assert engines.phase.tolist() == ["decode"] and engines.ms.iloc[0] == pytest.approx(2.6)
    pooled_both = with_engine_rows(mixed, engines)
    assert len(pooled_both) == len(profiles[0])
    assert pooled_both[pooled_both.phase == "decode"].ms.tolist() == [pytest.approx(2.6)]
    assert pooled_both.set_index(["phase", "batch_size"]).ms[("host_share", 3)] == pytest.approx(6.7)
    every = pooled_profile(profiles).set_index(["phase", "batch_size"]).ms  # replay --profile-repeats
    assert every[("decode", 1)] == pytest.approx(2.6) and every[("host_share", 3)] == pytest.approx(6.7)
    assert pooled_profile(profiles[:1]) is profiles[0]


def test_replay_takes_the_earliest_requests_of_a_trace_out_of_time_order(tmp_path, topo):
    from sim.workload import generate
    from sim.workload_config import WorkloadConfig

    # rows 0-9 at 100-109 s, rows 10-19 at 0-9 s: both sides take the five earliest (prompts 110..114)
    path = tmp_path / "unsorted.jsonl"
    rows = [(100 + i, 100 + i) for i in range(10)] + [(i, 110 + i) for i in range(10)]
    path.write_text("".join(json.dumps({"timestamp": int(a * 1e3), "input_length": p, "output_length": 8,
                                        "hash_ids": []}) + "\n" for a, p in rows))
    opts = ReplayOptions(url="http://127.0.0.1:1", trace=str(path), model=GEN, requests=5)
    live = build_requests(read_trace(str(path))[0], topo, opts, np.random.default_rng(0))
    sim = generate(WorkloadConfig.from_dict({"kind": "mooncake", "trace": str(path), "trace_limit": 5}), topo)
    assert live.prompt_tokens.tolist() == sim.requests.prompt_tokens.tolist() == [110, 111, 112, 113, 114]
    assert live.arrival_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_engines_take_the_measured_host_share_curve_not_the_fit():
    """Four engines on two cores measured 2.57x one engine's step: more than sharing two cores explains, which a
    cores-and-lock fit cannot follow. The engines' pace is the measured ratio (interpolated in k), the event
    loop's the fit's; past the largest k measured the ratio grows as the fit does; the cores bound it below."""
    ratios = np.array([1.0, 1.296, 1.733, 2.566])
    table = pd.DataFrame({"phase": "host_share", "batch_size": [1, 2, 3, 4], "tokens": 1, "context": 128,
                          "ms": 2.99 * ratios})
    params = HostParams(table, max_cores=2.0)
    assert [params.slowdown(k) for k in (1, 2, 3, 4)] == pytest.approx(ratios)
    fitted = [share_slowdown(k, k * params.lock, params.cores, params.lock)
              / share_slowdown(1, params.lock, params.cores, params.lock) for k in (2, 4)]
    assert fitted != pytest.approx(ratios[[1, 3]], rel=0.03)  # what the fit alone would give
    assert params.slowdown(2, 1) == pytest.approx(share_slowdown(3, 2 * params.lock + 1, params.cores, params.lock)
                                                  / max(1.0, 1 / params.cores, params.lock))
    assert params.slowdown(6) > params.slowdown(4)
    assert params.slowdown(6) == pytest.approx(ratios[3] * params._fitted(6, 0) / params._fitted(4, 0))
    fit_only = HostParams(table, max_cores=2.0, share="fitted")
    assert [fit_only.slowdown(k) for k in (2, 4)] == pytest.approx(fitted)
    with pytest.raises(UserError, match="unknown 'fit'"):
        HostParams(table, share="fit")
    flat = pd.DataFrame({"phase": "host_share", "batch_size": [1, 2], "tokens": 1, "context": 128, "ms": 2.0})
    assert HostParams(flat, max_cores=1.0).slowdown(2) == pytest.approx(2.0)  # two engines cannot share one core
    assert HostParams(flat, max_cores=16.0).slowdown(2) == pytest.approx(1.0)


def _shared(merge_ratios=None) -> pd.DataFrame:
    ratios = [1.0, 1.3, 1.7, 2.6]
    rows = [("host_share", k, 1, 128, 3.0 * r) for k, r in zip((1, 2, 3, 4), ratios, strict=True)]
    if merge_ratios is not None:
        rows += [("host_share_merge", k, 448, 0, 9.0 * r) for k, r in zip((1, 2, 4), merge_ratios, strict=True)]
    return pd.DataFrame(rows, columns=["phase", "batch_size", "tokens", "context", "ms"])


def test_merges_and_trims_take_the_measured_merge_share_not_the_engines():
    """A merge need not slow down as a decode step does on a busy host (measured 1.46x at k = 4 against 2.73x
    once). The copy's pace is its own ratio (interpolated in k, never below 1, grown past
    the largest k as the fit grows); a profile without those rows keeps the engines' pace for it."""
    params = HostParams(_shared([1.0, 0.97, 1.46]), max_cores=2.0)
    assert params.copy_slowdown(1) == 1.0 and params.copy_slowdown(2) == 1.0  # 0.97: a copy never runs faster
    assert params.copy_slowdown(3) == pytest.approx((0.97 + 1.46) / 2)
    assert params.copy_slowdown(4) == pytest.approx(1.46) and params.slowdown(4) == pytest.approx(2.6)
    assert params.copy_slowdown(6) == pytest.approx(1.46 * params._fitted(6, 0) / params._fitted(4, 0))
    older = HostParams(_shared(), max_cores=2.0)
    assert [older.copy_slowdown(k) for k in (1, 2, 4)] == pytest.approx([older.slowdown(k) for k in (1, 2, 4)])


def test_a_copy_beside_three_busy_engines_runs_at_the_copy_pace():
    import types

    import simpy

    from sim.live.host_model import HostCPU

    def finish_times(table):
        sim = types.SimpleNamespace(env=simpy.Environment(), _finished_buffer=[])
        host, done = HostCPU(sim, HostParams(table, max_cores=2.0)), {}
        for i in range(3):
            host.run(0.004, lambda i=i: done.setdefault(f"engine{i}", sim.env.now))
        host.run(0.002, lambda: done.setdefault("copy", sim.env.now), copy=True)
        sim.env.run()
        return done

    measured = finish_times(_shared([1.0, 1.0, 1.46]))
    assert measured["copy"] == pytest.approx(0.002 * 1.46)  # four engine threads busy: the copy at 1 / 1.46
    assert measured["engine0"] > 0.002 * 1.46
    older = finish_times(_shared())
    assert older["copy"] == pytest.approx(0.002 * 2.6)  # without the rows: an engine's pace
