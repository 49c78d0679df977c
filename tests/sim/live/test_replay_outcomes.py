"""``edgepop replay``: which requests the simulation runs, both sides' outcomes, the mirror's router starting
where the live one is, and what is kept or refused when something is wrong."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from kit.gateway import GEN, _serve

from dataplane.engine_profile import engine_profile
from edgepop.errors import UserError

REFUSED_3021 = '{"result": null, "success": false, "errors": [{"code": 3021, "message": "rate limited"}]}'
SHED_3040 = '{"result": null, "success": false, "errors": [{"code": 3040, "message": "Out of capacity"}]}'


@pytest.fixture(scope="module")
def p2c_gateway(tmp_path_factory, gateway_topo):
    """Three PoPs routed by power of two choices (seeded draws); WAN delays at scale 1 (the mirror routes on the
    scaled RTTs, the gateway on the topology's: the same at scale 1 only)."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR", "SIN"], models=[GEN], no_auth=True, delay=True, router="p2c",
                        db=str(tmp_path_factory.mktemp("gw-p2c") / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()


def test_a_p2c_router_skipping_draws_draws_next_what_one_that_drew_them_does():
    from controlplane.routing.base import advance_draws, router_draws
    from controlplane.routing.p2c import PowerOfTwoChoices

    live, mirror = (PowerOfTwoChoices(None, np.random.default_rng(7)) for _ in range(2))
    for _ in range(5000):  # past one block of uniforms
        live._two(3)
    assert router_draws(live) == [5000]
    advance_draws(mirror, router_draws(live))
    assert [mirror._two(3) for _ in range(50)] == [live._two(3) for _ in range(50)]
    with pytest.raises(ValueError, match="cannot go back"):
        advance_draws(mirror, [1])


def test_the_mirror_routes_every_request_where_the_live_p2c_router_did(p2c_gateway, tmp_path):
    """The live router has drawn for the replay's probe request (and here for earlier requests); the mirror's
    starts there, so each request goes to the same PoP on both sides."""
    import httpx

    from edgepop.cli import main

    url, _ = p2c_gateway
    for _ in range(3):  # earlier traffic: the live router draws for it
        httpx.post(f"{url}/client/v4/accounts/local/ai/run/{GEN}", json={"prompt": "hi", "max_tokens": 1},
                   timeout=60).raise_for_status()
    profile = tmp_path / "profile.csv"
    engine_profile("gpt2-tiny", prompt_tokens=(8, 32), decode_batch=(1, 2), contexts=(32,), steps=2,
                   repeats=1).to_csv(profile, index=False)
    trace = tmp_path / "t.jsonl"  # 800 ms apart: every replica idle at each arrival, on both sides
    trace.write_text("".join(json.dumps({"timestamp": 800 * i, "input_length": 16, "output_length": 3,
                                         "hash_ids": []}) + "\n" for i in range(12)))
    out = tmp_path / "out"
    assert main(["replay", "--live", url, "--trace", str(trace), "--out", str(out), "--requests", "12",
                 "--profile", str(profile), "--host-model", "off"]) == 0
    live, sim = pd.read_parquet(out / "live.parquet"), pd.read_parquet(out / "sim.parquet")
    assert live.attrs["router_draws"][0] >= 4  # the three above and the probe
    m = live[["request_id", "serving_pop"]].merge(sim[["request_id", "serving_site"]], on="request_id")
    assert len(m) == 12 and (m.serving_pop == m.serving_site).all(), m.to_string()


def _statuses() -> pd.DataFrame:
    rows = [(200, ""), (408, '{"errors": [{"code": 3007}]}'), (429, SHED_3040), (429, REFUSED_3021), (413, "x"),
            (400, "bad"), (0, "ConnectError: connection refused"), (500, "internal"), (200, '{"code": 3043}')]
    return pd.DataFrame({"request_id": range(len(rows)), "status": [r[0] for r in rows],
                         "error": [r[1] for r in rows]})


def test_every_admitted_request_is_simulated_refusals_and_lost_ones_are_not():
    from sim.live.fidelity import admitted, left_out, live_outcomes, outcome_counts

    live = _statuses()
    # a queue timeout and a capacity refusal were admitted (the simulation decides them too); a failure too
    assert list(admitted(live).request_id) == [0, 1, 2, 7, 8]
    assert list(left_out(live)) == ["", "", "", "refused", "refused", "refused", "no answer", "", ""]
    assert list(live_outcomes(admitted(live))) == ["ok", "rejected", "rejected", "failed", "failed"]
    sim = pd.DataFrame({"request_id": [0, 1, 2, 7, 8], "outcome": ["ok", "rejected", "ok", "ok", "ok"]})
    assert outcome_counts(sim, live) == {"simulated": 5, "left_out": {"refused": 3, "no answer": 1},
                                         "live": {"ok": 1, "rejected": 2, "failed": 2},
                                         "sim": {"ok": 4, "rejected": 1, "failed": 0}}


def test_a_request_without_an_answer_is_not_called_a_refusal():
    from sim.live.run import _status, left_out_note

    note = left_out_note(_statuses())
    assert "3 the gateway refused before admitting them (HTTP 400, HTTP 413, HTTP 429)" in note
    assert "1 with no answer (ConnectError)" in note and "HTTP 0" not in note
    assert _status(0, "ConnectError: refused") == "no answer (ConnectError: refused)"
    assert _status(503, "draining") == "HTTP 503: draining"


def test_the_matrix_simulates_what_replay_simulates(tmp_path, monkeypatch):
    from sim.live import matrix

    live = _statuses().assign(arrival_s=0.0)
    live.to_parquet(tmp_path / "live.parquet", index=False)
    (tmp_path / "deployment.json").write_text("{}")
    (tmp_path / "timelines.json").write_text("[]")
    (tmp_path / "host.json").write_text(json.dumps({"cores": 2}))
    seen = []

    class Stop(Exception):
        pass

    def fake(desc, frame, *args, **kwargs):
        seen.append(list(frame.request_id))
        raise Stop

    monkeypatch.setattr(matrix, "simulate_like", fake)
    with pytest.raises(Stop):
        matrix.simulate_cell(tmp_path, None, pd.DataFrame())
    assert seen == [[0, 1, 2, 7, 8]]


def test_percentiles_n_and_interval_are_over_the_same_pairs():
    from sim.live.fidelity import compare

    n = 10
    live = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.arange(n), "status": 200, "error": "",
                         "ttft_ms": 100.0 + np.arange(n), "tpot_ms": 5.0 + np.arange(n), "e2e_ms": 500.0})
    sim = live.drop(columns=["status", "error"]).assign(outcome="ok")
    sim["tpot_ms"] *= 1.1
    live.loc[5:, "tpot_ms"] = np.nan  # five live TPOTs missing: their simulated ones are not compared either
    row = compare(sim, live, boot=200).set_index(["metric", "percentile"]).loc[("tpot_ms", "p50")]
    assert row.n == 5 and row.live_ms == 7.0 and np.isclose(row.sim_ms, 7.7)
    assert np.isclose(row.diff_pct, 10.0) and np.isclose(row.diff_lo_pct, 10.0) and np.isclose(row.diff_hi_pct, 10.0)


def test_the_client_side_is_kept_when_the_gateway_goes_away(tmp_path, monkeypatch, topo):
    from sim.live import run
    from sim.live.replay import ReplayOptions

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": []}) + "\n")
    calls = []

    def timings(url, trace, token=None):
        calls.append(trace)
        if len(calls) > 1:
            raise UserError(f"{url}: gateway not reachable (ConnectError)")
        return {"host": {}, "requests": [], "router_draws": []}

    async def send_all(frame, opts, rng, trace):
        return frame.assign(status=200, error="", ttft_ms=5.0, tpot_ms=1.0, e2e_ms=6.0)

    monkeypatch.setattr(run, "fetch_timings", timings)
    monkeypatch.setattr(run, "send_all", send_all)
    opts = ReplayOptions(url="http://127.0.0.1:9", trace=str(trace))
    kept = tmp_path / "out" / "live.parquet"
    with pytest.raises(UserError, match=r"gateway not reachable.*kept the client side of the 1 requests in") as e:
        run.live_replay(opts, {}, topo, np.random.default_rng(0), progress=lambda _: None, keep=kept)
    assert "\n" not in str(e.value)
    assert pd.read_parquet(kept).ttft_ms.tolist() == [5.0]


def test_a_profile_without_host_rows_is_refused_with_the_host_model_on(tmp_path):
    from sim.live.host_params import missing_host_rows, require_host_rows

    table = pd.DataFrame({"phase": ["prefill", "decode", "host_share_loop", "gw_piece"], "ms": 1.0})
    assert missing_host_rows(table) == ["host_share", "kv_copy"]
    with pytest.raises(UserError, match=r"p\.csv: no host_share, kv_copy rows.*--host-model off"):
        require_host_rows(table, tmp_path / "p.csv")
    require_host_rows(pd.DataFrame({"phase": ["host_share", "kv_copy", "gw_http_in"]}), "fine")


def test_a_one_engine_profile_needs_no_host_sharing_rows(tmp_path):
    """A served profile of a model with one replica measures no host_share rows (no engines to share the host with):
    the one-PoP matrix and replays were refused after their live runs for lacking them."""
    from sim.live.host_params import require_host_rows

    one = pd.DataFrame({"phase": ["prefill", "decode", "kv_copy", "gw_http_in"], "ms": 1.0})
    require_host_rows(one, "one engine", engines=1)
    with pytest.raises(UserError, match=r"p\.csv: no host_share rows"):
        require_host_rows(one, tmp_path / "p.csv", engines=2)
    with pytest.raises(UserError, match=r"no kv_copy rows"):  # the other rows are needed all the same
        require_host_rows(one[one.phase != "kv_copy"], "one engine", engines=1)
