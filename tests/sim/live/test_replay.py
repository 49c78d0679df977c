"""``edgepop replay``: trace -> live requests from emulated locations, client-side timings, the simulator's mirror of
the live deployment, the engine-level profile, and the comparison table."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pandas as pd
import pytest
from kit.gateway import GEN

from dataplane.engine_profile import engine_profile
from edgepop.errors import UserError
from sim.live import live_profile
from sim.live.client import fetch_deployment
from sim.live.fidelity import compare, mirror_deployment, simulate_like, summarize
from sim.live.replay import ReplayOptions, build_requests, send_all
from sim.traces import read_trace


class ConstPerf:
    """Fixed service times, so the simulator's numbers are known exactly."""

    def prefill_ms(self, spec, gpu, tokens, **_):
        return 5.0

    def decode_step_ms(self, spec, gpu, batch, context, **_):
        return 2.0


def _trace(path, n=6):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": i * 150, "input_length": 20 + 10 * i, "output_length": 4 + i,
                                 "hash_ids": []}) + "\n")
    return path


def test_replay_live_side_and_simulator_mirror(delayed_gateway, gateway_topo, tmp_path):
    url, _ = delayed_gateway
    opts = ReplayOptions(url=url, trace=str(_trace(tmp_path / "t.jsonl")), model=GEN, max_prompt=64, max_output=8)
    frame = build_requests(read_trace(opts.trace)[0], gateway_topo, opts, np.random.default_rng(1))
    again = build_requests(read_trace(opts.trace)[0], gateway_topo, opts, np.random.default_rng(1))
    pd.testing.assert_frame_equal(frame, again)  # seeded: same cities, same sizes
    assert list(frame.prompt_tokens) == [20, 30, 40, 50, 60, 64] and list(frame.output_tokens) == [4, 5, 6, 7, 8, 8]
    live = asyncio.run(send_all(frame, opts, np.random.default_rng(2)))
    assert (live.status == 200).all() and (live.error == "").all(), live.error.tolist()
    assert (live.completion_tokens == frame.output_tokens).all()  # ignore_eos: exact lengths
    assert (live.prompt_tokens_served == frame.prompt_tokens).all()  # one token per ASCII character
    assert (live.ttft_ms >= live.access_rtt_ms * 0.95).all()  # at least the access round trip was waited out
    assert (live.e2e_ms >= live.ttft_ms).all() and live.tpot_ms.notna().all()

    desc = fetch_deployment(url)
    dep, scale = mirror_deployment(desc, gateway_topo)
    assert scale == 1.0 and len(dep.plane.state.replicas) == 3
    sim = simulate_like(desc, live, gateway_topo, perf=ConstPerf())
    merged = sim.merge(live[["request_id", "serving_pop"]], on="request_id")
    assert (merged.serving_site == merged.serving_pop).all()  # the mirror routes every request as the gateway did
    assert (sim.outcome == "ok").all()
    # TTFT is its parts; a request alone at its site takes network RTT + 5 ms prefill exactly. The mirror replays
    # the live send times, so on a loaded host late sends can bunch requests at one site: those wait their turn.
    assert np.allclose(sim.ttft_ms, sim.network_rtt_ms + sim.queue_ms + sim.cold_start_ms + sim.prefill_ms)
    assert (sim.ttft_ms >= sim.network_rtt_ms + 5.0 - 1e-6).all()
    start, end = sim.arrival_s, sim.arrival_s + sim.e2e_ms / 1e3
    alone = [not ((sim.serving_site == sim.serving_site[i]) & (start < end[i]) & (end > start[i])
                  & (sim.index != i)).any() for i in sim.index]
    assert np.allclose(sim.ttft_ms[alone], sim.network_rtt_ms[alone] + 5.0, atol=1e-6)
    table = compare(sim, live)
    assert list(table.metric) == ["ttft_ms", "ttft_ms", "tpot_ms", "tpot_ms", "e2e_ms", "e2e_ms"]
    assert (table.n == 6).all() and table.diff_pct.notna().all()
    row = table.iloc[0]
    assert np.isclose(row.diff_pct, 100 * (row.sim_ms - row.live_ms) / row.live_ms, atol=0.05)
    assert summarize(live).set_index("metric").loc["ttft_ms", "n"] == 6


def test_mirror_starts_cold_what_the_live_autoscaler_scaled_to_zero(gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.backend import Backend

    live = Backend(GatewayConfig(pops=["FRA", "LHR", "SIN"], models=[GEN], delay=False), gateway_topo)
    try:
        live.plane.state.unload(live.plane.state.replicas[1])  # as an autoscaler does
        desc = live.describe()
    finally:
        live.close()
    assert [p["status"] for p in desc["placement"]] == ["ready", "cold", "ready"]
    dep, _ = mirror_deployment(desc, gateway_topo)
    assert [r.status for r in dep.plane.state.replicas] == ["ready", "cold", "ready"]
    desc["placement"][2]["status"] = "loading"  # loading live: loading here from the start, not ready
    dep, _ = mirror_deployment(desc, gateway_topo)
    assert [r.status for r in dep.plane.state.replicas] == ["ready", "cold", "loading"]


def test_engine_profile_feeds_the_measured_profile_model():
    from controlplane.catalog import default_catalog
    from controlplane.perf_profile import MeasuredProfile

    table = engine_profile("gpt2-tiny", prompt_tokens=(8, 64), decode_batch=(1, 2), contexts=(32,), steps=4,
                           repeats=1)
    assert set(table.phase) == {"prefill", "decode"} and (table.ms > 0).all()
    perf = MeasuredProfile(table)
    spec = default_catalog()[GEN]  # served by gpt2-tiny
    assert perf.prefill_ms(spec, "cpu", 64) >= perf.prefill_ms(spec, "cpu", 8) > 0
    assert perf.decode_step_ms(spec, "cpu", 2, 32) > 0


def test_replay_command_end_to_end(delayed_gateway, tmp_path):
    from edgepop.cli import main

    url, _ = delayed_gateway
    profile = tmp_path / "profile.csv"
    engine_profile("gpt2-tiny", prompt_tokens=(8, 64), decode_batch=(1, 2), contexts=(32,), steps=4,
                   repeats=1).to_csv(profile, index=False)
    out = tmp_path / "out"
    code = main(["replay", "--live", url, "--trace", str(_trace(tmp_path / "t.jsonl", 4)), "--out", str(out),
                 "--requests", "4", "--max-output", "4", "--profile", str(profile), "--repeat-live",
                 "--host-model", "off"])  # (an engine table has no host rows)
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"live.parquet", "sim.parquet", "comparison.csv", "decomposition.csv",
                                                "replay.png", "repeat"}
    # --repeat-live sent the same requests a second time and compared the two live runs
    first, again = pd.read_parquet(out / "live.parquet"), pd.read_parquet(out / "repeat" / "live.parquet")
    cols = ["request_id", "city", "prompt_tokens", "output_tokens"]
    assert first[cols].equals(again[cols]) and not first.trace.isin(again.trace).any()
    rep = pd.read_csv(out / "repeat" / "comparison.csv")
    assert len(rep) == 6 and (rep.n == 4).all()
    assert (out / "replay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cmp = pd.read_csv(out / "comparison.csv")
    assert len(cmp) == 6 and (cmp.n == 4).all()
    assert main(["replay", "--live", "http://10.1.2.3:8787", "--trace", "x.csv"]) == 2  # loopback only
    assert main(["replay", "--live", url, "--trace", "x.csv", "--profile-repeats", "0"]) == 2


def test_gateway_profile_subtracts_the_injected_rtt(monkeypatch):
    """Prefill = client TTFT minus the RTT the gateway reports times the delay scale (no timing asserted: the
    stream is replaced by one with known piece times)."""
    rtt_ms, first_piece_s = 80.0, 0.095

    async def fake_stream(client, url, headers, prompt, max_tokens, seed):
        return rtt_ms, [10.0, 10.0 + first_piece_s] + [10.0 + first_piece_s + 0.004 * i for i in range(1, max_tokens)]

    monkeypatch.setattr(live_profile, "_stream", fake_stream)
    table = live_profile.gateway_profile("http://127.0.0.1:9", GEN, "gpt2-tiny", 0.5, prompt_tokens=(8, 64),
                                         decode_batch=(1, 2), contexts=(32,), steps=4, repeats=1)
    assert list(table.phase) == ["prefill", "prefill", "decode", "decode"]
    prefill = table[table.phase == "prefill"].ms.to_numpy()
    assert np.allclose(prefill, first_piece_s * 1e3 - 0.5 * rtt_ms)  # 95 ms - 40 ms of injected delay
    assert np.allclose(table[table.phase == "decode"].ms, 4.0)


def test_gateway_profile_through_a_live_gateway(delayed_gateway):
    from controlplane.catalog import default_catalog
    from controlplane.perf_profile import MeasuredProfile

    url, _ = delayed_gateway
    table = live_profile.gateway_profile(url, GEN, "gpt2-tiny", 1.0, location="-33.87,151.21", prompt_tokens=(8, 64),
                                         decode_batch=(1, 2), contexts=(32,), steps=4, repeats=1)
    assert list(table.phase) == ["prefill", "prefill", "decode", "decode"] and (table.ms > 0).all()
    perf = MeasuredProfile(table)
    assert perf.prefill_ms(default_catalog()[GEN], "cpu", 64) > 0


def test_comparison_intervals_are_a_paired_bootstrap():
    rng = np.random.default_rng(4)
    n = 60
    live = pd.DataFrame({"request_id": np.arange(n), "status": 200, "error": "",
                         "ttft_ms": rng.lognormal(5, 0.3, n), "tpot_ms": rng.lognormal(2, 1.0, n)})
    live["e2e_ms"] = live.ttft_ms + 30 * live.tpot_ms
    sim = live.drop(columns=["status", "error"]).assign(outcome="ok")
    sim[["ttft_ms", "tpot_ms", "e2e_ms"]] *= 1.1  # every request 10% slower: the error is 10% in every resample
    table = compare(sim, live).set_index(["metric", "percentile"])
    assert np.allclose(table.diff_pct, 10.0, atol=0.005)  # of the percentiles before their rounding for display
    assert np.allclose(table.diff_lo_pct, 10.0, atol=0.01) and np.allclose(table.diff_hi_pct, 10.0, atol=0.01)
    sim["tpot_ms"] = live.tpot_ms.to_numpy() * rng.lognormal(0, 0.3, n)  # noisy per request: a real interval
    t = compare(sim, live).set_index(["metric", "percentile"]).loc[("tpot_ms", "p50")]
    assert t.diff_lo_pct < t.diff_pct < t.diff_hi_pct
    again = compare(sim, live).set_index(["metric", "percentile"]).loc[("tpot_ms", "p50")]
    assert (t.diff_lo_pct, t.diff_hi_pct) == (again.diff_lo_pct, again.diff_hi_pct)  # seeded


def test_interval_resamples_neighbours_in_time_together():
    from sim.live.fidelity import block_draws

    draws = block_draws(60, 200, np.random.default_rng(0))
    assert draws.shape == (200, 60) and draws.min() >= 0 and draws.max() < 60
    steps = (np.diff(draws[:, :4], axis=1) % 60)  # a block of 4 (60 ** (1/3) rounded): consecutive positions
    assert (steps == 1).all()
    # Errors shared by groups of four neighbours (one admission each, say): resampling requests one by one
    # pretends there are 60 independent errors, blocks see 15; the interval must widen.
    rng = np.random.default_rng(5)
    n = 60
    live = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.arange(n) * 0.1, "status": 200, "error": "",
                         "ttft_ms": rng.lognormal(5, 0.3, n), "tpot_ms": rng.lognormal(2, 0.2, n)})
    live["e2e_ms"] = live.ttft_ms + 30 * live.tpot_ms
    sim = live.drop(columns=["status", "error"]).assign(outcome="ok")
    sim["tpot_ms"] = live.tpot_ms.to_numpy() * np.repeat(rng.lognormal(0, 0.4, n // 4), 4)
    def width(block):
        t = compare(sim, live, block=block).set_index(["metric", "percentile"]).loc[("tpot_ms", "p50")]
        return t.diff_hi_pct - t.diff_lo_pct

    assert width(None) > 1.2 * width(1)


def test_replay_options_out_of_range_fail_before_any_request(tmp_path, capsys):
    import pytest

    from edgepop.cli import main
    from edgepop.errors import UserError

    trace = str(_trace(tmp_path / "t.jsonl", 2))
    for field, value, words in [("concurrency", 0, "--concurrency must be a positive integer, got 0"),
                                ("time_scale", -1.0, "--time-scale must be a positive number, got -1.0"),
                                ("requests", True, "--requests must be a positive integer, got True")]:
        with pytest.raises(UserError, match=words):
            ReplayOptions(url="http://127.0.0.1:9", trace=trace, **{field: value}).check()
    ReplayOptions(url="http://127.0.0.1:9", trace=trace, requests=np.int64(3)).check()  # a numpy count is a count
    # through the command: refused before it looks for the gateway (nothing listens on port 9)
    assert main(["replay", "--live", "http://127.0.0.1:9", "--trace", trace, "--concurrency", "0"]) == 2
    assert "--concurrency must be a positive integer" in capsys.readouterr().err
    assert main(["replay", "--live", "http://127.0.0.1:9", "--trace", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in capsys.readouterr().err


def test_live_repeatability_compares_the_second_live_run_with_the_first(tmp_path):
    from sim.live.fidelity import live_repeatability

    rng = np.random.default_rng(6)
    n = 40
    first = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.arange(n) * 0.2, "status": 200, "error": "",
                          "ttft_ms": rng.lognormal(5, 0.3, n), "tpot_ms": rng.lognormal(2, 0.3, n)})
    first["e2e_ms"] = first.ttft_ms + 30 * first.tpot_ms
    cell = tmp_path / "azure-light"
    (cell / "repeat").mkdir(parents=True)
    first.to_parquet(cell / "live.parquet", index=False)
    assert live_repeatability(cell) is None  # no second run: nothing to report
    second = first.copy()
    second["tpot_ms"] *= 1.2  # the second run decodes 20% slower (percentiles are rounded to 0.01 ms)
    second.loc[3, ["status", "error"]] = [500, "internal"]  # a request failed the second time: not compared
    second.to_parquet(cell / "repeat" / "live.parquet", index=False)
    rep = live_repeatability(cell)
    assert abs(rep["tpot_p50"]["err_pct"] - 20.0) < 0.5 and not rep["tpot_p50"]["met"] and not rep["met"]
    assert rep["ttft_p50"]["err_pct"] == 0.0 and rep["ttft_p95"]["met"]
    written = pd.read_csv(cell / "repeat" / "comparison.csv")  # both sides live: named as such, not sim/live
    assert {"again_ms", "first_ms"} <= set(written.columns) and "sim_ms" not in written.columns
    other = second.assign(prompt_tokens=7)  # a second run of other requests is no repeat of the first
    first.assign(prompt_tokens=5).to_parquet(cell / "live.parquet", index=False)
    other.to_parquet(cell / "repeat" / "live.parquet", index=False)
    with pytest.raises(UserError, match="not a repeat of"):
        live_repeatability(cell)


def test_differences_are_of_unrounded_percentiles():
    n = 21
    live = pd.DataFrame({"request_id": np.arange(n), "status": 200, "error": "", "ttft_ms": 100.0,
                         "tpot_ms": 3.0001, "e2e_ms": 200.0})
    sim = live.drop(columns=["status", "error"]).assign(outcome="ok", tpot_ms=3.1549)
    row = compare(sim, live, boot=0).set_index(["metric", "percentile"]).loc[("tpot_ms", "p50")]
    assert row.diff_pct == 5.16 and not row.met  # from the rounded 3.15 / 3.00 it read 5.0%, met


def test_replay_mistakes_fail_in_one_line_before_the_live_run(gateway, tmp_path, capsys):
    """A token for another account, a model that does not generate text and a profile that is not one are
    refused before any profiling or replaying (each took minutes, then wrote empty tables or failed late)."""
    from kit.gateway import ALICE, EMB

    from edgepop.cli import main

    url, _ = gateway
    trace, out = str(_trace(tmp_path / "t.jsonl", 2)), tmp_path / "out"
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,profile\n1,2,3\n")
    other, prefill_only = tmp_path / "other.csv", tmp_path / "prefill.csv"  # valid tables, not of the stand-in
    head = "model,phase,batch_size,tokens,context,ms,provider,host\n"
    other.write_text(head + "distilgpt2,prefill,1,16,0,2.0,cpu,h\ndistilgpt2,decode,1,1,16,1.0,cpu,h\n")
    prefill_only.write_text(head + "gpt2-tiny,prefill,1,16,0,2.0,cpu,h\n")
    engine_only = tmp_path / "engine.csv"  # prefill and decode, no host rows
    engine_only.write_text(head + "gpt2-tiny,prefill,1,16,0,2.0,cpu,h\ngpt2-tiny,decode,1,1,16,1.0,cpu,h\n")
    me = ["--token", ALICE, "--account", "alice"]
    for extra, words in [(["--token", ALICE], "got HTTP 403"),  # the default account is 'local', not alice's
                         ([*me, "--model", EMB], "is a text-embeddings model"),
                         ([*me, "--profile", str(bad)], "bad.csv"),
                         ([*me, "--profile", str(other)], "no rows for model 'gpt2-tiny'"),
                         ([*me, "--profile", str(prefill_only)], "has no 'decode' rows"),
                         ([*me, "--profile", str(bad), "--no-sim"], "--profile is for the simulation"),
                         ([*me, "--no-sim", "--host-model", "off"], "--host-model is for the simulation"),
                         ([*me, "--profile", str(engine_only)], "engine.csv: no host_share, kv_copy, gw_* rows"),
                         ([*me, "--profile-source", "engine"], "--profile-source engine measures no host rows"),
                         ([*me, "--max-prompt", "3000"], "--max-prompt 3000 is over the served context"),
                         ([*me, "--profile", str(other), "--profile-repeats", "3"],
                          "--profile-repeats say how to measure a profile; --profile gives one")]:
        assert main(["replay", "--live", url, "--trace", trace, "--out", str(out), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, (extra, err)
    assert not out.exists()


def test_a_folder_named_like_a_replay_output_is_refused_before_any_request(tmp_path, capsys):
    """clear_outputs would fail on it after the work (IsADirectoryError): refused up front, the folder kept."""
    from edgepop.cli import main

    (tmp_path / "out" / "live.parquet").mkdir(parents=True)
    trace = str(_trace(tmp_path / "t.jsonl", 2))  # nothing listens on port 9: refused before it is asked
    assert main(["replay", "--live", "http://127.0.0.1:9", "--trace", trace, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "live.parquet is a folder" in err and err.count("\n") == 1, err
    assert (tmp_path / "out" / "live.parquet").is_dir()
    # a file named like the folder --repeat-live writes: refused too (clear_outputs failed on it: NotADirectoryError)
    (tmp_path / "out" / "live.parquet").rmdir()
    (tmp_path / "out" / "repeat").write_text("mine")
    assert main(["replay", "--live", "http://127.0.0.1:9", "--trace", trace, "--out", str(tmp_path / "out"),
                 "--repeat-live"]) == 2
    err = capsys.readouterr().err
    assert "repeat is a file, where --repeat-live writes a folder" in err and err.count("\n") == 1, err
    from sim.live.run import clear_outputs

    clear_outputs(tmp_path / "out")  # (a run without --repeat-live clears its files and leaves the user's)
    assert (tmp_path / "out" / "repeat").read_text() == "mine"


def test_a_replay_clears_only_its_own_earlier_outputs(tmp_path):
    """Files of an earlier replay in --out go (a --no-sim run must not sit beside an old comparison), the profile
    this run reads from there and anything else stay."""
    from sim.live.run import OUTPUTS, clear_outputs

    (tmp_path / "repeat").mkdir()
    for name in OUTPUTS:
        (tmp_path / name).write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    clear_outputs(tmp_path, keep=str(tmp_path / "profile.csv"))
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["notes.txt", "profile.csv"]


def test_requests_the_gateway_refused_are_not_simulated(delayed_gateway, tmp_path, capsys):
    """A request over the served context window is refused live (never admitted), so the simulation leaves it out
    instead of loading the replicas with it; both sides' outcomes are reported."""
    from edgepop.cli import main

    url, _ = delayed_gateway
    profile = tmp_path / "profile.csv"
    engine_profile("gpt2-tiny", prompt_tokens=(8, 64), decode_batch=(1, 2), contexts=(32,), steps=4,
                   repeats=1).to_csv(profile, index=False)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 150, "input_length": n, "output_length": 8, "hash_ids": []})
                             + "\n" for i, n in enumerate((20, 510, 30))))
    out = tmp_path / "out"
    assert main(["replay", "--live", url, "--trace", str(trace), "--out", str(out), "--requests", "3",
                 "--max-prompt", "510", "--max-output", "8", "--profile", str(profile), "--host-model", "off"]) == 0
    live, sim = pd.read_parquet(out / "live.parquet"), pd.read_parquet(out / "sim.parquet")
    assert (live.status != 200).sum() == 1 and len(sim) == 2  # 510 + 8 tokens: over the 512 of the stand-in
    said = capsys.readouterr()
    assert "left out of the simulation: 1 the gateway refused before admitting them (HTTP 4" in said.out + said.err
    assert "outcomes of the 2 simulated requests: live 2 ok, 0 rejected, 0 failed; sim 2 ok" in said.out
    counts = json.loads((out / "outcomes.json").read_text())
    assert counts["left_out"] == {"refused": 1, "no answer": 0} and counts["live"]["ok"] == counts["sim"]["ok"] == 2


def test_a_description_missing_what_the_replay_reads_is_named():
    from sim.live.run import description_gaps

    good = {"pops": ["FRA"], "router": "nearest-balanced", "last_mile_ms": 1.0, "stand_ins": {}, "seed": 7,
            "delay": True, "delay_scale": 1.0, "queue_limit": 8, "queue_timeout_s": 30.0,
            "placement": [{"model": "m", "node": 0, "pop": "FRA", "slots": 4, "replica": 0}]}
    assert description_gaps(good) == ""
    assert description_gaps([]) == "not a JSON object"
    assert description_gaps({**good, "stand_ins": None}) == "field 'stand_ins' missing or not a dict"
    assert description_gaps({**good, "placement": [{"x": 1}]}) == "placement[0] lacks 'model'"
    assert description_gaps({**good, "placement": [5]}) == "placement[0] lacks 'model'"


def test_profiling_through_the_gateway_fails_in_one_line(gateway):
    """A profiling request the gateway refuses (here a token for another account; a spent neuron budget alike)
    and a gateway that is gone were a RuntimeError and a raw httpx traceback: each is one UserError, the gateway's
    own reason passed on."""
    import socket

    from kit.gateway import ALICE

    url, _ = gateway
    with pytest.raises(UserError, match=r"refused a profiling request with HTTP 403 \(.*local"):
        live_profile.gateway_profile(url, GEN, "gpt2-tiny", 1.0, token=ALICE, prompt_tokens=(8,), decode_batch=(1,),
                                     contexts=(32,), steps=2, repeats=1)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(UserError, match="gateway not reachable while profiling"):
        live_profile.gateway_profile(closed, GEN, "gpt2-tiny", 1.0, prompt_tokens=(8,), decode_batch=(1,),
                                     contexts=(32,), steps=2, repeats=1)


def test_a_gateway_error_envelope_gives_its_message():
    from sim.live.client import gateway_message

    workers = b'{"result": null, "success": false, "errors": [{"code": 3036, "message": "Account limited: daily ' \
              b'budget of 3 neurons spent"}], "messages": []}'
    assert gateway_message(workers) == "Account limited: daily budget of 3 neurons spent"
    assert gateway_message('{"error": {"message": "bad", "type": "invalid_request_error"}}') == "bad"
    assert gateway_message(b"<html>oops") == "<html>oops"


def test_replay_out_under_the_home_folder(tmp_path, monkeypatch):
    from pathlib import Path

    from edgepop.cli import main
    from sim.live import run

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    seen = []
    monkeypatch.setattr(run, "replay_and_compare", lambda opts, **_: seen.append(opts) or "report")
    assert main(["replay", "--live", "http://127.0.0.1:9", "--trace", "t.jsonl", "--out", "~/r"]) == 0
    assert Path(seen[0].out) == home / "r"  # where its outputs go, not ./~/r
