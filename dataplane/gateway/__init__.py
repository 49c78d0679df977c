"""The live gateway: Workers-AI- and OpenAI-compatible HTTP API over real ONNX inference.

One process emulates an edge deployment: a few PoPs of the topology, each holding replicas of catalog models
(executed by their data-plane ``stand_in`` models through one shared :class:`~dataplane.service.DataPlane`), the
control plane routing every request, and WAN delays from the topology injected on the way in and on every chunk
out. Reading guide (docs/gateway.md; start at :mod:`~dataplane.gateway.backend`):

* :mod:`~dataplane.gateway.config` (``GatewayConfig``, a TOML file and ``edgepop serve`` flags);
* :mod:`~dataplane.gateway.backend`: the deployment (built by :func:`controlplane.deployment.build_deployment`,
  as the simulator builds it) and the engines; :mod:`~dataplane.gateway.standins`: what the gateway says about
  the stand-in models that run in place of catalog models;
* :mod:`~dataplane.gateway.pipeline`: one request's path (validate, WAN in, admit, run, stream back), with
  :mod:`~dataplane.gateway.geo` (client location, anycast ingress, WAN delays),
  :mod:`~dataplane.gateway.admission` bridging the control plane (which reads no clock) to asyncio,
  :mod:`~dataplane.gateway.shedding` (refusing at once what would wait too long), :mod:`~dataplane.gateway.invoke`
  running the task table of :mod:`dataplane.tasks` on the engines and :mod:`~dataplane.gateway.timeline`
  (per-request stage stamps for sim-vs-live comparisons);
* :mod:`~dataplane.gateway.app`: the HTTP routes, on :mod:`~dataplane.gateway.asgi` (middleware, SSE answer,
  disconnect watch), :mod:`~dataplane.gateway.http_util` (bodies, JSON, envelopes), :mod:`~dataplane.gateway.sse`
  (server-sent events) and :mod:`~dataplane.gateway.errors` (Workers AI error codes); the route groups
  :mod:`~dataplane.gateway.openai_compat`, :mod:`~dataplane.gateway.catalog_api` (with its JSON Schemas,
  :mod:`~dataplane.gateway.schemas`), :mod:`~dataplane.gateway.batch` (async batch, stored by
  :mod:`~dataplane.gateway.batch_store`), :mod:`~dataplane.gateway.auth`, :mod:`~dataplane.gateway.limits`
  (per-account limits) and :mod:`~dataplane.gateway.metrics`;
* :mod:`~dataplane.gateway.server` (running a gateway in a thread or a subprocess) and
  :mod:`~dataplane.gateway.cli` (``edgepop serve``).

Entry points::

    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.app import create_app
    app = create_app(GatewayConfig(pops=["FRA", "LHR"], delay=False, no_auth=True,  # a FastAPI app
                                   db="/tmp/batch.sqlite"))  # (auth: tokens={...}; db: default ./edgepop-batch.sqlite)

and ``edgepop serve``.
"""

__all__ = ["GatewayConfig", "load_config"]


def __getattr__(name: str):
    # Imported on first use: the config pulls in the control plane, which ``edgepop --help`` (it imports
    # dataplane.gateway.cli to build the ``serve`` parser) does not need.
    if name in __all__:
        from dataplane.gateway import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
