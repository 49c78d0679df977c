"""Gateway fixtures: in-thread uvicorn servers on 127.0.0.1 with free ports, tiny stand-in models, two accounts."""

from __future__ import annotations

import pytest
from gwkit import GEN, MODELS, TINY, TOKENS


@pytest.fixture(scope="session")
def gateway_topo(topo):
    return topo


def _serve(cfg, topo):
    from dataplane.gateway import create_app
    from dataplane.gateway.server import ServerThread

    app = create_app(cfg, topo=topo)
    server = ServerThread(app)
    server.start()
    return server, app


@pytest.fixture(scope="session")
def gateway(tmp_path_factory, gateway_topo):
    """The main test gateway: 3 PoPs, every task, no WAN delay, auth on; yields (base URL, app)."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR", "IAD"], models=MODELS, stand_ins=TINY, tokens=TOKENS, delay=False,
                        db=str(tmp_path_factory.mktemp("gw") / "batch.sqlite"), max_body_bytes=200_000,
                        batch_concurrency=2)
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()


@pytest.fixture(scope="session")
def small_gateway(tmp_path_factory, gateway_topo):
    """One PoP, one slot, a queue of one and a short queue timeout: capacity and timeout errors on demand."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], tokens=TOKENS, delay=False, slots=1, queue_limit=1,
                        queue_timeout_s=0.4, db=str(tmp_path_factory.mktemp("gw-small") / "b.sqlite"),
                        router="nearest-with-capacity")
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()


@pytest.fixture(scope="session")
def delayed_gateway(tmp_path_factory, gateway_topo):
    """WAN delays on (scale 1) with the default session-affinity router over FRA, LHR and SIN."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR", "SIN"], models=[GEN], no_auth=True, delay=True,
                        db=str(tmp_path_factory.mktemp("gw-delay") / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()
