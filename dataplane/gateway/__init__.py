"""The live gateway: Workers-AI- and OpenAI-compatible HTTP API over real ONNX inference.

One process emulates an edge deployment: a few PoPs of the topology, each holding replicas of catalog models
(executed by their data-plane ``stand_in`` models through one shared :class:`~dataplane.service.DataPlane`), the
control plane routing every request, and WAN delays from the topology injected on the way in and on every chunk
out. Entry points::

    from dataplane.gateway import GatewayConfig, create_app
    app = create_app(GatewayConfig(pops=["FRA", "LHR"], no_delay=True))   # a FastAPI app

and the ``edgepop serve`` / ``edgepop replay`` commands (:mod:`dataplane.gateway.cli`).
"""

from dataplane.gateway.config import GatewayConfig, load_config

__all__ = ["GatewayConfig", "create_app", "load_config"]


def create_app(config: GatewayConfig | None = None, **kw):
    """The FastAPI application for ``config`` (imported lazily: FastAPI is only needed to serve)."""
    from dataplane.gateway.app import create_app as _create

    return _create(config, **kw)
