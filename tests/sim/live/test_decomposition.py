"""Where the time goes, live and simulated: a short trace replayed against a real ``edgepop serve`` process on
127.0.0.1; for every request the live components (client stamps chained with the gateway's timeline on one
monotonic clock) add up to the E2E and TTFT the client measured, and the live-host simulation's components add
up to its own. Nothing here asserts how long anything took."""

from __future__ import annotations

import asyncio
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from kit.gateway import GEN

from dataplane.engine_profile import engine_profile
from dataplane.gateway.server import spawn_serve
from sim.live.client import fetch_deployment, fetch_timings
from sim.live.decompose import E2E_PARTS, TTFT_PARTS, live_frame, side_by_side, sim_components
from sim.live.fidelity import simulate_like
from sim.live.host_params import HostParams
from sim.live.host_profile import gateway_costs
from sim.live.replay import ReplayOptions, build_requests, send_all
from sim.traces import read_trace


def _trace(path, n=8):
    with open(path, "w") as fh:
        for i in range(n):  # pairs arrive together: prompts join running batches, prefills stall decodes
            fh.write(json.dumps({"timestamp": (i // 2) * 120, "input_length": 12 + 9 * i, "output_length": 3 + i,
                                 "hash_ids": []}) + "\n")
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real ``edgepop serve`` subprocess: two PoPs (one engine each), WAN delays on, one intra-op thread; no
    load shedding or rate limit (as a replay serves it: on a loaded machine the shedder refused a request, 429)."""
    d = tmp_path_factory.mktemp("decomp")
    proc, url = spawn_serve(["--no-auth", "--threads", "1", "--pops", "FRA,SIN", "--models", GEN,
                             "--max-wait", "0", "--no-rate-limit",
                             "--db", str(d / "b.sqlite")], log=d / "serve.log")
    yield url, d
    proc.terminate()
    proc.wait(timeout=30)


def test_live_decomposition_adds_up_for_every_request(served, topo):
    url, d = served
    opts = ReplayOptions(url=url, trace=str(_trace(d / "t.jsonl")), model=GEN, max_prompt=96, max_output=12)
    frame = build_requests(read_trace(opts.trace)[0], topo, opts, np.random.default_rng(3))
    live = asyncio.run(send_all(frame, opts, np.random.default_rng(4), trace="decomp:"))
    assert (live.status == 200).all() and (live.error == "").all(), live.error.tolist()
    got = fetch_timings(url, "decomp:")
    assert sorted(t["trace"] for t in got["requests"]) == sorted(f"decomp:{i}" for i in range(len(frame)))
    assert {t["role"] for t in got["host"]["threads"]} >= {"engine", "event-loop"}
    parts = live_frame(live, got["requests"]).set_index("request_id")
    assert sorted(parts.index) == list(range(len(frame)))  # every request has a complete chain
    measured = live.set_index("request_id")
    e2e_sum = parts[list(E2E_PARTS)].sum(axis=1)
    ttft_sum = parts[list(TTFT_PARTS)].sum(axis=1)
    assert np.allclose(e2e_sum, measured.loc[parts.index, "e2e_ms"], atol=1.0, rtol=0)
    assert np.allclose(ttft_sum, measured.loc[parts.index, "ttft_ms"], atol=1.0, rtol=0)
    assert parts[list(E2E_PARTS)].notna().all().all()
    assert (parts.http_out >= 0).all(), parts.http_out.tolist()  # stamped before the write, so no later than seen
    # The gateway served each request on the replica it reported, each replica with an engine of its own.
    replicas = {t["trace"]: t["replica"] for t in got["requests"]}
    desc = fetch_deployment(url)
    pop_of = {p["replica"]: p["pop"] for p in desc["placement"]}
    assert all(pop_of[replicas[tr]] == pop for tr, pop in zip(live.trace, live.serving_pop, strict=True))
    assert desc["engines"] == "per-replica"
    # Every piece, the decoder's tail included, counts as produced when the engine made it, never later (a tail
    # stamped when the stream came to ask for it carried the previous piece's return delay).
    assert all(t["last_gen"] <= t["engine"]["finished"] for t in got["requests"])

    # The live-host simulation of the same requests: its components add up to its own TTFT and E2E.
    table = pd.concat([
        engine_profile("gpt2-tiny", prompt_tokens=(8, 64, 96), decode_batch=(1, 2), contexts=(32, 96), steps=4,
                       repeats=1, prefill_batch=(1, 2), host_engines=(1, 2)),
        gateway_costs(url, GEN, "gpt2-tiny", prompt_tokens=(16,), max_tokens=4, repeats=2).assign(
            provider="x", host="y")], ignore_index=True)
    table["provider"], table["host"] = table.provider.iloc[0], table.host.iloc[0]
    params = HostParams(table)
    assert params.slowdown(1) == 1.0 and params.slowdown(4) >= params.slowdown(2) >= 1.0
    live["first_piece"] = [json_first_piece(got, tr) for tr in live.trace]
    sim = simulate_like(desc, live, topo, profile=table, host_model=True)
    assert (sim.outcome == "ok").all()
    sparts = sim_components(sim).set_index("request_id")
    s = sim.set_index("request_id")
    assert np.allclose(sparts[list(E2E_PARTS)].sum(axis=1), s.loc[sparts.index, "e2e_ms"], atol=1e-6)
    assert np.allclose(sparts[list(TTFT_PARTS)].sum(axis=1), s.loc[sparts.index, "ttft_ms"], atol=1e-6)
    sent = measured.arrival_s + measured.sent_lag_ms / 1e3
    assert np.allclose(s.loc[measured.index, "arrival_s"], sent)  # the simulated clients send when the live ones did
    # What each side's steps computed: at least one row, and at least the request's own prompt plus one token to
    # attend over (more when a longer request shared its batch: the KV is padded to the longest row).
    prompts = frame.set_index("request_id").prompt_tokens
    for side in (parts, sparts):
        shape = side[side.step_ms.notna()]
        assert (shape.step_batch >= 1).all() and (shape.step_kv_len >= prompts.loc[shape.index] + 1).all()
    table = side_by_side(sparts.reset_index(), parts.reset_index())
    e2e_row = table.set_index("component").loc["E2E"]
    assert np.isclose(e2e_row.live_mean_ms, e2e_sum.mean(), atol=1e-3)


def test_side_by_side_of_one_token_outputs_has_no_per_token_figures_and_no_warnings():
    from sim.live.decompose import PER_TOKEN

    cols = {k: [1.0, 2.0] for k in (*E2E_PARTS, *TTFT_PARTS, "first_delivery")}
    frame = pd.DataFrame({"request_id": [0, 1], **cols, **{k: [np.nan, np.nan] for k in PER_TOKEN}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" / "All-NaN slice" warnings were printed
        table = side_by_side(frame, frame).set_index("component")
    assert table.loc["E2E", "diff_ms"] == 0 and np.isnan(table.loc[PER_TOKEN[0], "live_mean_ms"])


def json_first_piece(got: dict, trace: str) -> int:
    tl = next(t for t in got["requests"] if t["trace"] == trace)
    return int(tl["engine"]["first_piece"] or 1)


def test_alone_step_reads_the_machine_speed_from_requests_that_decoded_alone():
    from sim.live.decompose import alone_step_ms

    def tl(decode_s, steps, batch_sum):
        return {"trace": "t", "engine": {"decode_s": decode_s, "steps": steps, "batch_sum": batch_sum}}

    timelines = [tl(0.020, 10, 10), tl(0.030, 10, 10), tl(0.050, 10, 25),  # alone: 2 and 3 ms; the third batched
                 {"trace": "x", "engine": None}, {"trace": "y", "engine": {"steps": 0}}]  # failed, one token
    assert alone_step_ms(timelines) == 2.5
    assert alone_step_ms([tl(0.05, 10, 25)]) is None  # nobody decoded alone: no reading


def test_alone_vs_profile_reads_the_profile_at_the_length_each_request_attended_over():
    from sim.live.decompose import alone_vs_profile

    profile = pd.DataFrame({"phase": ["decode"] * 3 + ["prefill"], "batch_size": [1, 1, 2, 1],
                            "context": [100, 300, 100, 0], "tokens": [1, 1, 1, 100], "ms": [1.0, 2.0, 9.0, 5.0]})

    def tl(step_ms, steps, batch_sum, length):  # a request attending over ``length`` tokens a step on average
        return {"trace": "t", "engine": {"decode_s": step_ms * steps / 1e3, "steps": steps, "batch_sum": batch_sum,
                                         "kv_len_sum": (length + 1) * steps}}

    # alone at 200 tokens, where the profile says 1.5 ms: 1.8 ms is 20% slower; the batched one is left out
    assert alone_vs_profile([tl(1.8, 10, 10, 200), tl(1.8, 10, 10, 200), tl(9.0, 10, 30, 100)], profile) == 20.0
    assert alone_vs_profile([tl(1.0, 4, 4, 100)], profile) == 0.0  # at a measured length: the measured step
    old = {"trace": "o", "engine": {"decode_s": 0.012, "steps": 8, "batch_sum": 8, "prefill_len": 296}}
    assert alone_vs_profile([old], profile) == -25.0  # no kv_len_sum: prompt + steps / 2 = 300 tokens, 2 ms
    assert alone_vs_profile([tl(9.0, 10, 30, 100)], profile) is None  # nobody decoded alone
    assert alone_vs_profile([tl(1.0, 4, 4, 100)], profile[profile.phase == "prefill"]) is None  # no decode rows
    # a table of two models: read at the stand-in's rows only (the other's faster steps are no baseline)
    both = pd.concat([profile.assign(model="tiny"), profile.assign(model="small", ms=profile.ms * 4)])
    assert alone_vs_profile([tl(1.8, 10, 10, 200)], both, stand_in="tiny") == 20.0
    assert alone_vs_profile([tl(6.0, 10, 10, 200)], both, stand_in="small") == 0.0


def test_served_decode_rows_are_measured_over_the_replays_output_length(served):
    # A generation's mean step falls with its length, so the decode rows' generations decode as many steps as
    # the replay's longest request; the host_share rows keep their own (their ratios do not depend on it).
    from sim.live import served_profile

    url, _ = served
    asked = []
    burst = served_profile._Gateway.burst

    async def recording(self, client, sizes, max_tokens, locations, late=None):
        got = await burst(self, client, sizes, max_tokens, locations, late)
        asked.append((len(sizes), max_tokens, [e["steps"] for e in got]))
        return got

    served_profile._Gateway.burst = recording
    try:
        table = served_profile.served_engine_profile(
            url, GEN, "gpt2-tiny", [(50.11, 8.68), (1.35, 103.82)], prompt_tokens=(8,), prefill_batch=(1,),
            decode_batch=(1,), contexts=(32,), repeats=1, steps=3, host_engines=(1,), decode_steps=7, merge_shapes=())
    finally:
        served_profile._Gateway.burst = burst
    assert set(table.phase) >= {"prefill", "decode", "host_share"}
    decode_bursts = [a for a in asked if a[0] == 1 and a[1] == 8]
    assert decode_bursts and all(steps == [7] for _, _, steps in decode_bursts)  # 8 tokens: 7 decode steps
    assert any(a[0] == 2 and a[1] == 7 for a in asked)  # host_share at k = 1: two streams of 2 x 3 steps
    # Longer generations than the window leaves room for after a context: as many steps as it does
    asked.clear()
    served_profile._Gateway.burst = recording
    try:
        long = served_profile.served_engine_profile(
            url, GEN, "gpt2-tiny", [(50.11, 8.68)], n_ctx=40, prompt_tokens=(8,), prefill_batch=(1,),
            decode_batch=(1,), contexts=(8, 32), repeats=1, decode_steps=100, merge_shapes=())
    finally:
        served_profile._Gateway.burst = burst
    assert sorted(long[long.phase == "decode"].context) == [8, 32]
    assert {a[1] for a in asked if a[0] == 1} >= {31, 7}  # 40 - 8 - 2 = 30 steps, 40 - 32 - 2 = 6
    with pytest.raises(ValueError, match="decode_steps"):
        served_profile.served_engine_profile(url, GEN, "gpt2-tiny", [(50.11, 8.68)], decode_steps=0)


def test_served_merge_rows_read_the_engines_own_merges(served):
    # A prompt joins a decoding batch: its KV is merged into the batch's. The row is the engine's own record of
    # that merge: the positions written (all rows at the longer past) and those the shorter side padded first.
    from sim.live import served_profile

    url, _ = served
    table = served_profile.served_engine_profile(
        url, GEN, "gpt2-tiny", [(50.11, 8.68)], prompt_tokens=(8, 128), prefill_batch=(1, 2), decode_batch=(2,),
        contexts=(32,), repeats=1, decode_steps=3, merge_shapes=((2, 24, 160), (2, 160, 24)),
        trim_shapes=((3, 40),))
    merge = table[table.phase == "kv_merge"].set_index("tokens")
    assert len(merge) == 2 and (merge.batch_size == 2).all() and (merge.ms > 0).all()
    # the joiner longer than the batch's past: both batch rows padded to its 160 positions; 3 rows written
    longer = merge[merge.context > 0].iloc[0]
    assert longer.name == 3 * 160 and longer.context == 2 * 160
    # the joiner shorter: it alone is padded, to the batch's past (its 160-token prompts and the steps so far)
    shorter = merge.loc[[t for t in merge.index if t != 3 * 160]].iloc[0]
    past = shorter.name // 3
    assert shorter.name == 3 * past and shorter.context == past and 160 < past < 160 + 48
    # One of three rows leaves after 8 tokens: the two that stay are copied out at their 40 + 7 positions.
    trim = table[table.phase == "kv_trim"]
    assert trim[["batch_size", "tokens", "context"]].values.tolist() == [[2, 2 * 47, 0]] and (trim.ms > 0).all()


def test_replay_profiles_decode_at_its_longest_output(monkeypatch):
    from sim.live import run

    seen = {}
    monkeypatch.setattr(run, "measure_host_profile", lambda *a, **kw: seen.update(kw) or pd.DataFrame())
    monkeypatch.setattr(run, "served_n_ctx", lambda desc, stand_in: 512)
    monkeypatch.setattr(run, "pop_locations", lambda desc, topo, model: [(50.11, 8.68)])
    desc = {"stand_ins": {GEN: "gpt2-tiny"}, "placement": []}
    opts = ReplayOptions(url="http://127.0.0.1:1", trace="t.csv", model=GEN, max_output=20)
    run.measure_for_replay(opts, desc, None, progress=lambda _m: None)
    assert seen["decode_steps"] == 19


def test_served_profile_measures_a_merge_while_the_other_engines_decode(served):
    # With two PoPs the profile times one merge at the first engine alone (k = 1) and while the second engine
    # decodes two streams (k = 2): the engine's own record of the same merge, so only the host's load differs.
    from sim.live import served_profile

    url, _ = served
    table = served_profile.served_engine_profile(
        url, GEN, "gpt2-tiny", [(50.11, 8.68), (1.35, 103.82)], prompt_tokens=(8, 128), prefill_batch=(1,),
        decode_batch=(2,), contexts=(32,), repeats=1, decode_steps=3, steps=3, host_engines=(1, 2),
        merge_shapes=((2, 24, 160),), trim_shapes=())
    shared = table[table.phase == "host_share_merge"].set_index("batch_size")
    assert sorted(shared.index) == [1, 2] and (shared.ms > 0).all()
    assert shared.tokens.nunique() == 1  # the same joiner at every k
    assert HostParams(table).copy_slowdown(2) >= 1.0
    none = served_profile.served_engine_profile(
        url, GEN, "gpt2-tiny", [(50.11, 8.68), (1.35, 103.82)], prompt_tokens=(8,), prefill_batch=(1,),
        decode_batch=(1,), contexts=(32,), repeats=1, decode_steps=3, steps=3, host_engines=(1, 2),
        merge_shapes=(), trim_shapes=())
    assert not (none.phase == "host_share_merge").any()  # no merge rows asked: none under load either
