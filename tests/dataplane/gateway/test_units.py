"""Gateway pieces without a server: config files, tokens, locations, SSE parsing, the batch store's invariants and
the admission bridge's slot accounting."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from kit.gateway import GEN

from dataplane.gateway.auth import Authenticator, load_tokens, parse_tokens_env
from dataplane.gateway.batch_store import BatchStore
from dataplane.gateway.config import GatewayConfig, load_config, parse_location
from dataplane.gateway.errors import GatewayError
from dataplane.gateway.sse import SSEParser, frame
from edgepop.errors import UserError


def test_config_file_and_errors(tmp_path):
    good = tmp_path / "g.toml"
    good.write_text('pops = ["FRA"]\nslots = 2\ndefault_location = [1.5, 2.5]\n[placement]\n"@edgepop/gpt2-tiny" = '
                    '["FRA"]\n')
    cfg = load_config(good)
    assert cfg.pops == ["FRA"] and cfg.slots == 2 and cfg.default_location == (1.5, 2.5)
    for text, field in (('pops = "FRA"', "pops"), ("slots = 0", "slots"), ("queue_timeout_s = -1", "queue_timeout_s"),
                        ("default_location = [95, 0]", "default_location"), ("colour = 1", "colour"),
                        ("delay = 1", "delay"), ("threads = -2", "threads"), ("max_wait_s = -1", "max_wait_s"),
                        ('[rate_limits]\n"summarisation" = 5', "rate_limits"),
                        ('[rate_limits]\n"text-generation" = -5', "rate_limits"),
                        ("auth_failures_per_minute = 1.5", "auth_failures_per_minute"),
                        ("open_ops = 1", "open_ops"), ('[tokens]\n"x" = "a"', "tokens.*8\\+ characters"),
                        ('scenario = "small"', "field 'scenario' is not read from a config file: give it as --scenario")):
        bad = tmp_path / "b.toml"
        bad.write_text(text + "\n")
        with pytest.raises(UserError, match=field):
            load_config(bad)
    assert parse_location("48.85, 2.35", "x") == (48.85, 2.35)
    for text in ("48.85", "a,b", "91,0", "0,181", "nan,0"):
        with pytest.raises(UserError, match="lat,lon"):
            parse_location(text, "x")


def test_errors_found_when_the_deployment_is_built_name_the_config_file(tmp_path, gateway_topo):
    from dataplane.gateway.backend import Backend

    bad = tmp_path / "g.toml"
    bad.write_text('pops = ["fra"]\n')
    with pytest.raises(UserError, match=r"g\.toml: field 'pops': unknown PoP id\(s\) 'fra'"):
        Backend(load_config(bad), gateway_topo)
    bad.write_text('pops = ["FRA"]\n')  # a flag's value is not blamed on the file alone
    with pytest.raises(UserError, match=r"g\.toml with its command-line overrides: field 'pops'"):
        Backend(load_config(bad).with_overrides(pops=["XXX"]), gateway_topo)


def test_placement_errors(gateway_topo):
    from dataplane.gateway.backend import Backend

    with pytest.raises(UserError, match="not among the served pops"):
        Backend(GatewayConfig(pops=["FRA"], models=[GEN], placement={GEN: ["LHR"]}), gateway_topo)
    with pytest.raises(UserError, match="serves text-embeddings"):
        Backend(GatewayConfig(pops=["FRA"], models=[GEN], stand_ins={GEN: "minilm-l6-v2"}), gateway_topo)
    dep = Backend(GatewayConfig(pops=["FRA", "LHR"], models=[GEN], placement={GEN: ["LHR"]}, slots=3),
                     gateway_topo)
    table = dep.placement()
    assert list(table["pop"]) == ["LHR"] and list(table.slots) == [3] and list(table.status) == ["ready"]
    assert dep.describe()["placement"][0]["node_id"].startswith("LHR")


def _write(path, text):
    path.write_text(text)
    return path


def test_tokens_and_authenticator(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"tokens": {"aaaaaaaa1": "a"}}')
    assert load_tokens(f, environ={"EDGEPOP_TOKENS": "bbbbbbbb2:b"}) == {"aaaaaaaa1": "a", "bbbbbbbb2": "b"}
    with pytest.raises(UserError, match="TOKEN:ACCOUNT"):
        parse_tokens_env("nocolon")
    with pytest.raises(UserError, match="8\\+ characters"):
        parse_tokens_env("short:a")
    # spaces around the colon are no part of the token or account (the bearer header is read stripped)
    assert parse_tokens_env("tok-alice-0001 : alice , tok-bob-00001:bob") == {"tok-alice-0001": "alice",
                                                                             "tok-bob-00001": "bob"}
    with pytest.raises(UserError, match="gives a token already given to account 'alice' to 'bob'"):
        parse_tokens_env("tok-alice-0001:alice,tok-alice-0001:bob")
    with pytest.raises(UserError, match="a token holds no spaces"):
        load_tokens(_write(tmp_path / "s.json", '{"tokens": {"tok alice 1": "a"}}'), environ={})
    # a config file's [tokens] table is held to the same rule
    from dataplane.gateway.config import GatewayConfig

    with pytest.raises(UserError, match="field 'tokens': a token holds no spaces"):
        GatewayConfig(tokens={"tok-bob-0001": " bob"}).validate("edgepop serve")
    with pytest.raises(UserError, match="no API tokens"):
        Authenticator({})
    auth = Authenticator({"aaaaaaaa1": "a"})
    assert auth.check("Bearer aaaaaaaa1", "a") == "a"
    with pytest.raises(GatewayError) as e:
        auth.check("Bearer aaaaaaaa1", "b")
    assert e.value.status == 403
    with pytest.raises(GatewayError) as e:
        auth.check(None, "a")
    assert e.value.status == 401
    assert Authenticator({}, enabled=False).check(None, "anything") == "local"


def test_sse_parser_handles_split_frames():
    wire = (frame({"response": "a"}) + frame({"response": "b\nc"}) + b": comment\n\ndata: [DONE]\n\n").decode()
    p, out = SSEParser(), []
    for i in range(0, len(wire), 3):  # arbitrary chunk boundaries
        out += p.feed(wire[i:i + 3])
    assert out == ['{"response":"a"}', '{"response":"b\\nc"}', "[DONE]"]


def test_batch_store_completes_each_item_once(tmp_path):
    db = tmp_path / "s.sqlite"
    s = BatchStore(db)
    job = s.create("alice", GEN, [{"prompt": "a"}, {"prompt": "b", "external_reference": "r"}], 1.0, 2.0)
    claimed = s.claim(10)
    assert [c["idx"] for c in claimed] == [0, 1] and s.claim(10) == []
    assert s.complete(job, 0, {"result": 1}, True) and not s.complete(job, 0, {"result": 2}, True)
    s.close()
    s = BatchStore(db)  # a restart: item 1 was running, so it is queued again
    assert s.recovered == 1
    again = s.claim(10)
    assert [(c["idx"], c["input"]) for c in again] == [(1, {"prompt": "b"})]
    assert s.complete(job, 1, {"result": 3}, True)
    j = s.job("alice", job)
    assert [i["completions"] for i in j["items"]] == [1, 1] and [i["attempts"] for i in j["items"]] == [1, 2]
    assert j["items"][1]["external_reference"] == "r"
    assert s.job("bob", job) is None


def test_admission_releases_every_slot(gateway_topo):
    from controlplane.plane import ControlPlane  # noqa: F401  (the plane the bridge drives)
    from dataplane.gateway.admission import Admission
    from dataplane.gateway.backend import Backend

    dep = Backend(GatewayConfig(pops=["FRA"], models=[GEN], slots=2, queue_limit=2, queue_timeout_s=0.2),
                     gateway_topo)

    async def scenario():
        adm = Admission(dep.plane)
        adm.start()
        fra = int(np.flatnonzero(gateway_topo.pops.id.to_numpy() == "FRA")[0])
        reqs = [adm.new_request(GEN, fra, 10, 10) for _ in range(5)]
        leases, errors = [], []
        for r in reqs:
            try:
                leases.append(adm.submit(r))
            except GatewayError as e:
                errors.append(e.code)
        assert errors == [3040] and [lz.queued for lz in leases] == [False, False, True, True]
        adm.release(leases[0])  # frees a slot: the first queued request starts
        await adm.wait_started(leases[2])
        with pytest.raises(GatewayError) as e:  # the last one waits past its queue timeout
            await adm.wait_started(leases[3])
        assert e.value.code == 3007
        for lz in leases:
            adm.release(lz)
            adm.release(lz)  # idempotent
        await adm.stop()
        return adm

    adm = asyncio.run(scenario())
    assert adm.leases_open == 0 and dep.plane.snapshot()["running"] == 0 and dep.plane.snapshot()["waiting"] == 0
    dep.close()


def test_serve_flags_over_scenario_over_defaults(monkeypatch):
    from dataplane.gateway.cli import gateway_config
    from edgepop.cli import build_parser

    monkeypatch.setenv("EDGEPOP_TOKENS", "tok-env-000001:acme")
    parse = build_parser().parse_args
    cfg = gateway_config(parse(["serve", "--scenario", "small"]))
    assert (cfg.scenario, cfg.seed, cfg.router) == ("small", 7, "nearest-balanced")
    assert cfg.tokens == {"tok-env-000001": "acme"}
    cfg = gateway_config(parse(["serve", "--scenario", "small", "--seed", "3", "--pops", "FRA,LHR", "--no-delay",
                                "--default-location", "1,2", "--slots", "4"]))
    assert (cfg.seed, cfg.pops, cfg.delay, cfg.default_location, cfg.slots) == (3, ["FRA", "LHR"], False, (1.0, 2.0), 4)


@pytest.mark.parametrize("port", ["0", "99999", "-1"])
def test_serve_refuses_a_port_out_of_range(port, capsys):
    from edgepop.cli import main

    assert main(["serve", "--no-auth", "--port", port]) == 2  # uvicorn would hang instead of failing
    assert capsys.readouterr().err.strip() == f"edgepop: error: --port must be 1-65535, got {port}"


def test_a_second_store_on_the_same_file_is_refused_until_the_first_closes(tmp_path):
    """Opening a store re-queues the items a dead process left running: a second process opening a live
    server's file would re-queue that server's running items (they then ran twice), so it is refused."""
    import pytest

    from edgepop.errors import UserError

    db = tmp_path / "s.sqlite"
    first = BatchStore(db)
    first.create("alice", GEN, [{"prompt": "a"}], 1.0, 2.0)
    assert len(first.claim(10)) == 1
    with pytest.raises(UserError, match="in use by another edgepop serve"):
        BatchStore(db)
    first.close()
    again = BatchStore(db)
    assert again.recovered == 1
    again.close()
    with pytest.raises(UserError, match="is a folder"):
        BatchStore(tmp_path)
    (tmp_path / "junk").write_text("not sqlite at all " * 100)
    with pytest.raises(UserError, match="not a usable SQLite database"):
        BatchStore(tmp_path / "junk")
