"""The live gateway: Workers-AI- and OpenAI-compatible HTTP API over real ONNX inference.

One process emulates an edge deployment: a few PoPs of the topology, each holding replicas of catalog models
(executed by their data-plane ``stand_in`` models through one shared :class:`~dataplane.service.DataPlane`), the
control plane routing every request, and WAN delays from the topology injected on the way in and on every chunk
out. Reading guide:

* :mod:`~dataplane.gateway.config` (``GatewayConfig``, a TOML file and ``edgepop serve`` flags);
* :mod:`~dataplane.gateway.backend`: the deployment (built by :func:`controlplane.deployment.build_deployment`,
  as the simulator builds it) and the engines;
* :mod:`~dataplane.gateway.pipeline`: one request's path (validate, WAN in, admit, run, stream back), with
  :mod:`~dataplane.gateway.admission` bridging the clock-free control plane to asyncio and
  :mod:`~dataplane.gateway.invoke` running the task table of :mod:`dataplane.tasks` on the engines;
* :mod:`~dataplane.gateway.app`: the HTTP routes (``openai_compat``, ``batch``, ``auth``, ``metrics``).

Entry points::

    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    app = create_app(GatewayConfig(pops=["FRA", "LHR"], delay=False, no_auth=True,  # a FastAPI app
                                   db="/tmp/batch.sqlite"))  # (auth: tokens={...}; db: default ./edgepop-batch.sqlite)

and ``edgepop serve`` (:mod:`dataplane.gateway.cli`).
"""

from dataplane.gateway.config import GatewayConfig, load_config

__all__ = ["GatewayConfig", "load_config"]
