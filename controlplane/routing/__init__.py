"""Routing policies, picked by name from :data:`ROUTERS`.

Start with :mod:`controlplane.routing.base` (the :class:`Router` interface, :class:`Decision`, and the
nearest-with-capacity building block every policy falls back to). Importing this package registers the built-in
policies: ``nearest-with-capacity``, ``nearest-balanced``, ``p2c``, ``latency-load``, ``session-affinity``, ``prefix-aware`` and the
``adapter-aware`` wrapper. A new policy is a ``Router`` subclass decorated with ``@ROUTERS.register("name")``;
its keyword arguments with defaults become its options (``router_options`` in a scenario), checked when the
scenario is parsed.
"""

from controlplane.routing import (  # noqa: F401  (register the policies)
    adapter,
    affinity,
    balanced,
    latency_load,
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
