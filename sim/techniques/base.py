"""The interface every serving technique implements, and the registry that names them.

A technique is a :class:`Technique` subclass registered with ``@TECHNIQUES.register(name, on=switch)``, where
``switch(techniques) -> bool`` says whether a scenario's ``[techniques]`` table turns it on. Each hook defaults to
"no change", so a technique overrides only the steps it touches, in the order a scenario run calls them:

1. ``catalog(catalog)`` and ``perf(perf)``: the model catalog and the service-time model of the run;
2. per deployment, ``plane_options(name)``: control-plane state the router reads (prefix index, adapter slots),
   handed to :func:`controlplane.deployment.build_deployment`;
3. ``workload(name, frame, dep, topo, start_utc, day_s)``: the request frame that deployment simulates, and the
   original arrivals when it moved any;
4. ``engine(name, sim, replica)``: an engine to run a replica instead of plain continuous batching;
5. after the run, ``amend(name, sim, frame)`` (columns of the request frame), ``blocks(name, sim, requests)``
   (blocks of the deployment's summary) and ``report(...)`` (fields of its ``techniques`` block).
"""

from __future__ import annotations

from edgepop.registry import Registry

TECHNIQUES = Registry("serving technique", skip=1)  # (the [techniques] switches) is not an option


class Technique:
    """One technique's hooks into a scenario run; ``t`` is the scenario's ``Techniques`` switches.

    ``reported``: whether the technique appears in a deployment's ``techniques`` block (enabled list, figures).
    """

    reported = True

    def __init__(self, t):
        self.t = t
        self.info: dict = {}  # per deployment name: fields for its ``techniques`` block

    def catalog(self, catalog):
        return catalog

    def perf(self, perf):
        return perf

    def plane_options(self, name: str) -> dict:
        return {}

    def workload(self, name: str, frame, dep, topo, start_utc, day_s: float):
        return frame, None

    def engine(self, name: str, sim, replica):
        return None

    def amend(self, name: str, sim, frame):
        return frame

    def blocks(self, name: str, sim, requests) -> dict:
        return {}

    def report(self, name: str, block: dict, requests, frame, arrival_s, fleet, start_utc, day_s: float) -> None:
        """Add this technique's fields to the deployment's ``techniques`` block."""
