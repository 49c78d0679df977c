"""Autoscalers driven live: the gateway's control plane runs on the simulator's clock (seconds since its start,
whose UTC time is known), and what it reports (/edgepop/deployment, /metrics) follows the autoscaler."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
from kit.gateway import SLOW
from kit.waiting import until

LONDON = "51.51,-0.13"
TINY_LM = "@edgepop/gpt2-tiny"


def _serve(tmp_path, topo, **kw):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    cfg = GatewayConfig(no_auth=True, delay=False, db=str(tmp_path / "b.sqlite"), **kw)
    app = create_app(cfg, topo=topo)
    server = ServerThread(app)
    server.start()
    return server, app.state.gateway


def _until(cond, timeout_s: float = 60.0) -> None:
    until(cond, "condition not reached", timeout_s, 0.05)


def _replica_gauges(url: str) -> dict[tuple, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("edgepop_replicas{"):
            labels, value = line[len("edgepop_replicas{"):].split("} ")
            parts = dict(p.split("=", 1) for p in labels.split(","))
            out[(parts["pop"].strip('"'), parts["model"].strip('"'), parts["status"].strip('"'))] = float(value)
    return out


def test_reactive_autoscaler_keeps_replicas_warm_at_start(tmp_path, gateway_topo):
    server, gw = _serve(tmp_path, gateway_topo, pops=["FRA", "LHR"], models=[TINY_LM], autoscaler="reactive",
                        autoscaler_options={"interval_s": 1, "idle_s": 300})
    try:
        plane = gw.backend.plane
        _until(lambda: plane.autoscaler.next_tick > 0)  # it has looked at the replicas once
        r = httpx.post(f"{server.url}/client/v4/accounts/local/ai/run/{TINY_LM}", timeout=60,
                       headers={"x-edgepop-client-location": LONDON}, json={"prompt": "Hello", "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.headers["x-edgepop-pop"] == "LHR"  # the nearest PoP, not the one a cold start sent it to
        assert plane.counts["cold_loads"] == 0 and plane.autoscaler.unloads == 0
        assert {p["status"] for p in httpx.get(f"{server.url}/edgepop/deployment").json()["placement"]} == {"ready"}
    finally:
        server.stop()


def test_scheduled_autoscaler_reads_the_real_local_hour(tmp_path, gateway_topo):
    from topology.demand import local_hour

    server, gw = _serve(tmp_path, gateway_topo, pops=["FRA", "SIN", "SJC"], models=[TINY_LM],
                        autoscaler="scheduled", autoscaler_options={"interval_s": 60, "day_s": 3600})
    try:
        desc = httpx.get(f"{server.url}/edgepop/deployment").json()
        opts = desc["autoscaler_options"]
        assert opts["day_s"] == 86_400.0  # live, a day is a day
        # the real clock (not the epoch, not uptime): a loose sanity bound, no timing goal
        assert abs((datetime.now(UTC) - datetime.fromisoformat(opts["start_utc"])).total_seconds()) < 3600
        plane = gw.backend.plane
        now = datetime.now(UTC)
        got = plane.autoscaler.local_hours(plane, gw.admission.plane_now())
        want = local_hour(plane.state.fleet.sites.tz, now)
        gap = (got - want + 12.0) % 24.0 - 12.0  # (circular: 23.99 and 0.01 are close)
        assert abs(gap).max() < 0.05, (got, want)
    finally:
        server.stop()


def test_deployment_and_metrics_follow_the_autoscaler(tmp_path, gateway_topo):
    # Every replica idle from the first tick (idle_s 0): scaled to zero, so none is ready.
    server, gw = _serve(tmp_path, gateway_topo, pops=["FRA", "LHR"], models=[TINY_LM], autoscaler="reactive",
                        autoscaler_options={"interval_s": 0.05, "idle_s": 0})
    try:
        plane = gw.backend.plane
        _until(lambda: all(r.status == "cold" for r in plane.state.replicas))
        rows = httpx.get(f"{server.url}/edgepop/deployment").json()["placement"]
        assert len(rows) == 2 and {p["status"] for p in rows} == {"cold"}
        assert _replica_gauges(server.url) == {}
    finally:
        server.stop()


def test_replicas_the_autoscaler_adds_are_listed_and_counted(tmp_path, gateway_topo):
    # One slot, a queue that builds at once: the reactive autoscaler loads a second replica at FRA.
    server, gw = _serve(tmp_path, gateway_topo, pops=["FRA"], models=[SLOW], slots=1, max_wait_s=0,
                        autoscaler="reactive", queue_timeout_s=120,
                        autoscaler_options={"interval_s": 0.05, "queue_high": 1, "max_per_site": 2})
    model = SLOW
    url = f"{server.url}/client/v4/accounts/local/ai/run/{model}"
    try:
        plane = gw.backend.plane
        first = len([r for r in plane.state.replicas if r.model == model])
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(client.post, url, json={"prompt": "Hello", "max_tokens": 64, "ignore_eos": True})
                       for _ in range(3)]
            _until(lambda: len([r for r in plane.state.replicas if r.model == model]) > first)
            rows = [p for p in httpx.get(f"{server.url}/edgepop/deployment").json()["placement"]
                    if p["model"] == model]
            gauges = _replica_gauges(server.url)
            assert all(f.result().status_code == 200 for f in futures)
        assert len(rows) == first + 1 and {p["pop"] for p in rows} == {"FRA"}
        assert rows[-1]["status"] in ("loading", "ready")
        assert sum(v for (pop, m, _s), v in gauges.items() if m == model) == first + 1
    finally:
        server.stop()


def test_the_replay_mirror_reads_the_scheduled_hours_from_the_replay_start(tmp_path, gateway_topo):
    # The gateway publishes its own start; the simulation's time 0 is when the replay starts sending, an hour of
    # uptime later here: the mirror's autoscaler must read the hour then, not the gateway's start hour.
    import pandas as pd

    from sim.live.fidelity import mirror_deployment, mirror_topology, on_replay_clock
    from topology.demand import local_hour

    server, gw = _serve(tmp_path, gateway_topo, pops=["FRA", "SIN"], models=[TINY_LM], autoscaler="scheduled",
                        autoscaler_options={"interval_s": 60})
    try:
        desc = httpx.get(f"{server.url}/edgepop/deployment").json()
    finally:
        server.stop()
    replay_start = datetime.fromisoformat(desc["autoscaler_options"]["start_utc"]) + timedelta(hours=1)
    live = pd.DataFrame({"status": [200]})
    live.attrs["started_utc"] = replay_start.isoformat()
    dep, _ = mirror_deployment(on_replay_clock(desc, live), mirror_topology(desc, gateway_topo))
    plane = dep.plane
    got = plane.autoscaler.local_hours(plane, 0.0)
    want = local_hour(plane.state.fleet.sites.tz, replay_start)
    gap = (got - want + 12.0) % 24.0 - 12.0
    assert abs(gap).max() < 1e-6, (got, want)
    assert on_replay_clock(desc, pd.DataFrame()) is desc  # a saved run without the stamp keeps what it had
