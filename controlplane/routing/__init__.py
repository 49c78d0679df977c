"""Routing policies, picked by name: nearest-with-capacity, p2c, latency-load, session-affinity, prefix-aware,
adapter-aware."""

from controlplane.routing import (  # noqa: F401  (register the policies)
    affinity,
    latency_load,
    lora,
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
                                       register_router,
                                       router_names,
)

__all__ = ["QUEUE", "REJECT", "ROUTERS", "START", "Decision", "Router", "make_router", "register_router",
           "router_names"]
