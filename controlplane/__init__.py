"""The control plane: a pure, clock-free library that the simulator and the live gateway drive the same way.

Reading guide:

* :mod:`controlplane.catalog` (models, sizes, LoRA adapter declarations) and :mod:`controlplane.fleet` (GPU
  nodes at sites);
* :mod:`controlplane.placement` (which replicas run where; policies by name) and :mod:`controlplane.routing`
  (where each request goes; policies by name);
* :mod:`controlplane.state` (replicas, slots, KV budget, site queues; the per-ingress candidate lists routers
  read are :mod:`controlplane.candidates`) and :mod:`controlplane.plane` (the
  :class:`~controlplane.plane.ControlPlane` facade: submit, finish, poll; prefix pins and adapter slots);
* :mod:`controlplane.deployment`: **start here to build one**: the one builder every driver uses;
* :mod:`controlplane.perf` / :mod:`controlplane.perf_profile` / :mod:`controlplane.perf_models`: service times;
* :mod:`controlplane.autoscale`, :mod:`controlplane.billing`, :mod:`controlplane.outcomes` (Workers AI codes).

Extension points (registries of :mod:`edgepop.registry`): ``controlplane.routing.ROUTERS``,
``controlplane.placement.PLACEMENTS``, ``controlplane.autoscale.AUTOSCALERS``,
``controlplane.perf_models.PERF_MODELS``. Every method takes the time ``now``; nothing here reads a clock.
"""
