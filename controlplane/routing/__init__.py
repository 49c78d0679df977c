"""Routing policies, picked by name from :data:`ROUTERS`.

Start with :mod:`controlplane.routing.base` (the :class:`Router` interface, :class:`Decision`, and the
nearest-with-capacity building block every policy falls back to); docs/routing.md describes every policy.
Importing this package registers the built-in policies, one module each: ``nearest-with-capacity``
(:mod:`controlplane.routing.nearest`), ``nearest-balanced`` (:mod:`controlplane.routing.balanced`), ``p2c``
(:mod:`controlplane.routing.p2c`), ``latency-load`` (:mod:`controlplane.routing.latency_load`), ``least-ttft``
(:mod:`controlplane.routing.least_ttft`),
``session-affinity`` (:mod:`controlplane.routing.affinity`), ``prefix-aware`` (:mod:`controlplane.routing.prefix`)
and the ``adapter-aware`` wrapper (:mod:`controlplane.routing.adapter`); the two preference routers share the
load gate of :mod:`controlplane.routing.prefer`. A new policy is a ``Router`` subclass decorated with
``@ROUTERS.register("name")``; its keyword arguments with defaults become its options (``router_options`` in a
scenario), checked when the scenario is parsed.
"""

from controlplane.routing import (  # noqa: F401  (register the policies)
    adapter,
    affinity,
    balanced,
    latency_load,
    least_ttft,
    nearest,
    p2c,
    prefix,
)
from controlplane.routing.base import (
    QUEUE,
    REJECT,
    ROUTERS,
    START,
    Decision,
    Router,
    make_router,
    router_names,
)

__all__ = ["QUEUE", "REJECT", "ROUTERS", "START", "Decision", "Router", "make_router", "router_names"]
