"""Routing policies, picked by name: nearest-with-capacity, p2c, latency-load, session-affinity."""

from controlplane.routing import affinity, latency_load, nearest, p2c  # noqa: F401  (register the policies)
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
