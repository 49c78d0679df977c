"""One deployment builder: a scenario served live routes exactly as it is simulated; the control plane's prefix
index routes live traffic to the replica holding a prompt's prefix."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from kit.gateway import GEN

from controlplane.state import Request

SCENARIO = """seed = 5
[workload]
kind = "poisson"
requests = 50
rps = 5.0
mix = { "MODEL" = 1.0 }
[edge]
placement = "PLACEMENT"
pops = ["FRA", "LHR", "IAD", "SIN"]
router = "ROUTER"
router_options = { OPTIONS }
fill_idle_gpus = false
queue_limit = 2
queue_timeout_s = 4.0
[central]
enabled = false
"""


def _planes(tmp_path, gateway_topo, monkeypatch, router, options, placement="per-pop", head=""):
    """The same scenario built by `edgepop serve --scenario` and by the simulator (``head``: more top-level
    fields)."""
    from dataplane.gateway.backend import Backend
    from dataplane.gateway.cli import gateway_config
    from edgepop.cli import build_parser
    from sim.run import prepare, scenario_deployment
    from sim.scenario import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("MODEL", GEN).replace("ROUTER", router).replace("OPTIONS", options)
                    .replace("PLACEMENT", placement).replace("seed = 5\n", f"seed = 5\n{head}"))
    monkeypatch.setenv("EDGEPOP_TOKENS", "tok-000000001:acme")
    cfg = gateway_config(build_parser().parse_args(["serve", "--scenario", str(path), "--models", GEN]))
    live = Backend(cfg, gateway_topo)
    sim = scenario_deployment(prepare(load_scenario(path), topo=gateway_topo), "edge")
    return live, sim


@pytest.mark.parametrize("router, options, placement", [
    ("p2c", "k = 3", "per-pop"), ("nearest-with-capacity", "", "per-pop"), ("session-affinity", "gate = 1.0", "per-pop"),
    # routers that read the control plane's estimates, over a plan placed for the workload's demand: the gateway
    # takes the scenario's service-time model, typical request and demand from `--scenario`
    ("nearest-balanced", "window_ms = 10.0", "greedy-demand"), ("latency-load", "", "greedy-demand"),
    ("least-ttft", "window_ms = 10.0", "greedy-demand")])
def test_one_scenario_routes_the_same_live_and_simulated(tmp_path, gateway_topo, monkeypatch, router, options,
                                                         placement):
    live_backend, sim_dep = _planes(tmp_path, gateway_topo, monkeypatch, router, options, placement)
    try:
        live, sim = live_backend.plane, sim_dep.plane
        assert type(live.router) is type(sim.router) and live.router.name == router
        assert vars(live.admission) == vars(sim.admission)
        cols = ["model", "node"]
        assert live_backend.deployment.table[cols].equals(sim_dep.table[cols])
        assert [r.gpu_index for r in live.state.replicas] == [r.gpu_index for r in sim.state.replicas]
        assert live.typical_tokens == sim.typical_tokens != (512, 128)  # the workload's, not the gateway's own
        cfg = live_backend.config  # the same models and PoPs as the scenario: no note at start
        assert cfg.scenario_plan.mismatch(list(live_backend.catalog.ids), list(cfg.pops),
                                          list(live_backend.topo.pops.id)) is None
        estimates = [[(r.est_prefill_a, r.est_prefill_b, r.est_request_ms) for r in p.state.replicas]
                     for p in (live, sim)]
        assert estimates[0] == estimates[1] and all(e[2] > 0 for e in estimates[0])
        rng = np.random.default_rng(11)
        pops = rng.integers(0, len(gateway_topo.pops), 700)
        reqs: dict[int, tuple] = {}
        running: list[int] = []
        actions = set()
        for i, ingress in enumerate(pops.tolist()):
            now = i * 0.01
            reqs[i] = (Request(i, GEN, ingress, 64, 16, session=i % 7), Request(i, GEN, ingress, 64, 16, session=i % 7))
            a, b = live.submit(reqs[i][0], now), sim.submit(reqs[i][1], now)
            assert (a.action, getattr(a.replica, "id", None), a.rtt_ms) == \
                   (b.action, getattr(b.replica, "id", None), b.rtt_ms), i
            actions.add(a.action)
            if a.action == "start":
                running.append(i)
            if running and rng.random() < 0.15:  # the same request finishes on both planes
                k = running.pop(int(rng.integers(len(running))))
                started = ([r.id for r in live.finish(reqs[k][0], now)], [r.id for r in sim.finish(reqs[k][1], now)])
                assert started[0] == started[1]
                running += started[0]
        assert {"start", "queue", "reject"} <= actions  # every kind of decision was compared
        assert live.snapshot() == sim.snapshot()
    finally:
        live_backend.close()


def test_a_scenario_with_its_own_catalog_is_served_with_it(tmp_path, gateway_topo, monkeypatch):
    """A scenario's catalog file (here: the 1B model given twice its layers) estimates the live replicas as the
    simulated ones, and the replay mirror reads it too."""
    from controlplane.catalog import CATALOG_FILE
    from sim.live.fidelity import mirror_deployment

    text = CATALOG_FILE.read_text()
    at = text.index(f'[models."{GEN}"]')
    at = text.index("layers = 16\n", at)
    (tmp_path / "mine.toml").write_text(text[:at] + "layers = 32\n" + text[at + len("layers = 16\n"):])
    live, sim = _planes(tmp_path, gateway_topo, monkeypatch, "least-ttft", "", head='catalog = "mine.toml"\n')
    try:
        assert live.catalog[GEN].layers == sim.plane.catalog[GEN].layers == 32
        ours = [(r.est_prefill_b, r.est_request_ms) for r in live.plane.state.replicas]
        assert ours == [(r.est_prefill_b, r.est_request_ms) for r in sim.plane.state.replicas]
        mirror, _ = mirror_deployment(live.describe(), gateway_topo)
        assert ours == [(r.est_prefill_b, r.est_request_ms) for r in mirror.plane.state.replicas]
        shipped, _ = _planes(tmp_path, gateway_topo, monkeypatch, "least-ttft", "")  # the shipped 16 layers
        try:
            assert ours[0][1] > shipped.plane.state.replicas[0].est_request_ms
        finally:
            shipped.close()
    finally:
        live.close()


@pytest.fixture(scope="module")
def prefix_gateway(tmp_path_factory, gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(pops=["FRA", "LHR", "SIN"], models=[GEN], no_auth=True, delay=False,
                        router="prefix-aware", lm_prefix_cache_mb=16,
                        db=str(tmp_path_factory.mktemp("gw-prefix") / "b.sqlite"))
    server = ServerThread(create_app(cfg, topo=gateway_topo))
    server.start()
    yield server.url
    server.stop()


def _chat(url, prompt, location, session=None):
    headers = {"x-edgepop-client-location": location}
    if session:
        headers["x-session-affinity"] = session
    r = httpx.post(f"{url}/client/v4/accounts/local/ai/run/{GEN}", headers=headers, timeout=60,
                   json={"prompt": prompt, "max_tokens": 3, "ignore_eos": True, "seed": 1})
    assert r.status_code == 200, r.text
    usage = r.json()["result"]["usage"]
    return r.headers["x-edgepop-replica"], r.headers["x-edgepop-pop"], usage.get("prompt_tokens_details", {}).get(
        "cached_tokens", 0)


def test_live_prefix_aware_routing_follows_the_prefix_index(prefix_gateway):
    frankfurt, london = "50.11,8.68", "51.51,-0.13"
    history = "user: tell me about the edge. " * 12  # ~360 tokens: many 16-token blocks
    first = _chat(prefix_gateway, history, frankfurt, session="s-1")
    assert first[1] == "FRA" and first[2] == 0
    # The second turn of the session: the same replica, and its engine serves the shared prefix from cache.
    second = _chat(prefix_gateway, history + "assistant: it is near. user: how near?", frankfurt, session="s-1")
    assert second[0] == first[0] and second[2] > 0
    # A London user without a session sending the same prefix: nearest would be LHR, the index knows FRA has it.
    third = _chat(prefix_gateway, history + "user: and in London?", london)
    assert third[0] == first[0] and third[1] == "FRA" and third[2] > 0
    # A London user with a prompt nobody sent before stays at the nearest PoP.
    fresh = _chat(prefix_gateway, "a different conversation entirely. " * 8, london)
    assert fresh[1] == "LHR" and fresh[2] == 0


def test_serve_scenario_serves_its_fleet_last_mile_and_anycast(tmp_path, gateway_topo, monkeypatch):
    """`edgepop serve --scenario` shapes the topology as the simulator does: the scenario's GPU inventory scale,
    last-mile mode and anycast misroute (the fleet, the access RTTs and the ingress PoPs are the simulated ones)."""
    from dataplane.gateway.backend import Backend
    from dataplane.gateway.cli import gateway_config
    from edgepop.cli import build_parser
    from sim.run import prepare, scenario_deployment
    from sim.scenario import load_scenario

    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("MODEL", GEN).replace("PLACEMENT", "per-pop").replace("ROUTER", "nearest-with-capacity")
                    .replace("router_options = { OPTIONS }\n", "")
                    .replace("seed = 5\n", 'seed = 5\ngpu_inventory_scale = 0.1\nlast_mile = "country"\n'
                             "anycast_misroute = 0.3\ndemand_weight = \"internet_users\"\n"))
    monkeypatch.setenv("EDGEPOP_TOKENS", "tok-000000001:acme")
    cfg = gateway_config(build_parser().parse_args(["serve", "--scenario", str(path), "--models", GEN]))
    live = Backend(cfg, gateway_topo)
    try:
        setup = prepare(load_scenario(path), topo=gateway_topo)
        sim = scenario_deployment(setup, "edge")
        assert list(live.deployment.fleet.nodes.node_id) == list(sim.fleet.nodes.node_id)
        assert len(live.deployment.fleet.nodes) < len(Backend(
            cfg.with_overrides(gpu_inventory_scale=1.0), gateway_topo).deployment.fleet.nodes)
        assert live.topo.last_mile_mode == "country" and live.topo.anycast_misroute == 0.3
        assert live.topo.demand_weight == "internet_users"  # placed for the demand the simulator plans for
        assert np.array_equal(live.topo.demand.weight.to_numpy(), setup.topo.demand.weight.to_numpy())
        assert np.array_equal(live.topo.demand_last_mile_ms(), setup.topo.demand_last_mile_ms())
        assert np.array_equal(live.topo.ingress(live.topo.demand.lat.to_numpy(), live.topo.demand.lon.to_numpy()),
                              setup.topo.ingress(setup.topo.demand.lat.to_numpy(), setup.topo.demand.lon.to_numpy()))
        desc = live.describe()
        assert (desc["gpu_inventory_scale"], desc["last_mile"], desc["anycast_misroute"], desc["demand_weight"]) == (
            0.1, "country", 0.3, "internet_users")
        # ... and the replay mirror shapes it the same way: the same nodes, the same client RTTs and ingress
        from sim.live.fidelity import mirror_deployment, mirror_topology

        mirrored = mirror_topology(desc, gateway_topo)
        assert mirrored.demand_weight == "internet_users"
        dep, _ = mirror_deployment(desc, mirrored)
        assert list(dep.fleet.nodes.node_id) == list(live.deployment.fleet.nodes.node_id)
        # ... and estimates with the gateway's service-time model and the scenario's typical request
        assert dep.plane.typical_tokens == live.plane.typical_tokens == setup.typical
        assert [(r.est_prefill_a, r.est_prefill_b, r.est_request_ms) for r in dep.plane.state.replicas] == \
               [(r.est_prefill_a, r.est_prefill_b, r.est_request_ms) for r in live.plane.state.replicas]
        lagos = (np.array([6.5]), np.array([3.4]))
        assert mirrored.ingress(*lagos)[1] == pytest.approx(live.topo.ingress(*lagos)[1])
        assert mirrored.ingress(*lagos)[0] == live.topo.ingress(*lagos)[0]
    finally:
        live.close()


def test_a_fixed_last_mile_beside_another_mode_is_refused():
    from dataplane.gateway import GatewayConfig
    from edgepop.errors import UserError

    with pytest.raises(UserError, match="field 'last_mile_ms': 25 applies with last_mile = \"fixed\" only"):
        GatewayConfig(last_mile="country", last_mile_ms=25)
    assert GatewayConfig(last_mile="country").last_mile_ms == 10.0


def test_an_unknown_demand_weight_is_refused():
    from dataplane.gateway import GatewayConfig
    from edgepop.errors import UserError

    with pytest.raises(UserError, match="field 'demand_weight': 'users' is not one of population, internet_users"):
        GatewayConfig(demand_weight="users")


def test_a_scenario_replaces_only_the_config_file_values_it_sets(tmp_path, gateway_topo, monkeypatch):
    """`--config` then `--scenario`: the scenario's own keys win; its defaults do not replace the file's values."""
    from kit.gateway import _serve

    from dataplane.gateway.cli import gateway_config
    from edgepop.cli import build_parser

    scenario = tmp_path / "s.toml"
    scenario.write_text('[workload]\nkind = "poisson"\nrequests = 5\nrps = 1.0\n[edge]\nplacement = "per-pop"\n'
                        'router = "nearest-balanced"\n[central]\nenabled = false\n')
    config = tmp_path / "gw.toml"
    config.write_text(f'pops = ["FRA"]\nmodels = ["{GEN}"]\ndelay = false\nno_auth = true\nopen_ops = true\n'
                      f'queue_timeout_s = 5\nqueue_limit = 3\nrouter = "p2c"\nrouter_options = {{ k = 3 }}\n'
                      f'seed = 42\ndb = "{tmp_path / "b.sqlite"}"\n')
    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    cfg = gateway_config(build_parser().parse_args(["serve", "--config", str(config), "--scenario", str(scenario)]))
    server, _ = _serve(cfg, gateway_topo)
    try:
        d = httpx.get(f"{server.url}/edgepop/deployment", timeout=30).json()
    finally:
        server.stop()
    assert (d["queue_limit"], d["queue_timeout_s"], d["seed"], d["pops"]) == (3, 5, 42, ["FRA"])  # the file's
    # the scenario sets the router, and so its options (none): p2c's k = 3 goes with the file's p2c
    assert (d["router"], d["router_options"], d["placement_policy"], d["scenario"]) == (
        "nearest-balanced", {}, "per-pop", "s")


def test_a_scenario_plan_keeps_its_demand_for_the_served_models():
    """The scenario's shares for the models it sends that the gateway serves; a served model it never sends gets
    its least share; the total scales with the shares kept."""
    from dataplane.gateway.scenario_plan import ScenarioPlan

    plan = ScenarioPlan(demand_rps=100.0, mix={"a": 0.6, "b": 0.3, "c": 0.1},
                        shape={"prompt": {"a": 900.0, "c": 50.0}, "output": {"a": 120.0, "c": 0.0}},
                        typical_tokens=(900, 120))
    got = plan.deployment_inputs(["a", "z"])
    assert got["mix"] == {"a": 0.6, "z": 0.1} and got["demand_rps"] == pytest.approx(70.0)
    assert got["shape"] == {"prompt": {"a": 900.0}, "output": {"a": 120.0}} and got["typical_tokens"] == (900, 120)
    whole = plan.deployment_inputs(["c", "a", "b"])  # every model the scenario sends: its own demand, exactly
    assert list(whole["mix"].items()) == list(plan.mix.items()) and whole["demand_rps"] == 100.0
    own = ScenarioPlan().deployment_inputs(["a", "b"])  # no scenario: the gateway's own plan
    assert (own["demand_rps"], own["mix"], own["typical_tokens"]) == (1.0, None, (512, 128))
    # and the start line says when the placement cannot be the simulator's
    world = ["FRA", "LHR", "SIN"]
    assert plan.mismatch(["c", "a", "b"], world, world) is None and ScenarioPlan().mismatch(["a"], [], world) is None
    line = plan.mismatch(["a", "z"], world, world)
    assert "serves 1 model(s) its workload never sends (z:" in line and "does not serve 2 model(s)" in line
    assert "(b, c)" in line and "its placement is not the simulator's" in line and "PoP" not in line
    # a scenario naming no PoPs is placed over all of them
    assert "serves 2 PoP(s) where the scenario's edge has 3" in plan.mismatch(["a", "b", "c"], world[:2], world)
    named = ScenarioPlan(mix={"a": 1.0}, pops=("FRA", "SIN"))
    assert named.mismatch(["a"], ["SIN", "FRA"], world) is None


def test_a_config_file_cannot_set_the_scenario_plan(tmp_path):
    from dataplane.gateway.config import load_config
    from edgepop.errors import UserError

    path = tmp_path / "gw.toml"
    path.write_text("scenario_plan = { perf = \"roofline\" }\n")
    with pytest.raises(UserError, match="field 'scenario_plan' is not read from a config file"):
        load_config(path)
