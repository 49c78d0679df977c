"""edgepop: edge AI inference research toolkit.

Reading guide. The importable subsystems are the top-level packages, layered so that imports point one way
(enforced by ``tests/test_layering.py``)::

    edgepop  <-  topology  <-  controlplane  <-  dataplane  <-  sim

* ``topology``: PoPs, GPU nodes, cloud regions, demand, the WAN latency model (start at ``topology.world``);
* ``controlplane``: a clock-free library: catalog, placement, routing, admission, autoscaling, billing, the
  service-time models, and ``controlplane.deployment``, the one builder of a control plane;
* ``dataplane``: real ONNX inference and its engines; ``dataplane.gateway`` serves them over HTTP through the
  control plane (the only part of the data plane that knows about it);
* ``sim``: the discrete-event simulator, workloads, scenarios, sweeps and reports; ``sim.live`` checks the
  simulator against the live gateway (the only part of ``sim`` that touches the data plane).

This package itself holds what every layer shares: the ``edgepop`` command (:mod:`edgepop.cli`), the one-line
user error (:mod:`edgepop.errors`), the registry every pluggable policy uses (:mod:`edgepop.registry`), the
seeded random streams (:mod:`edgepop.rng`) and the percentile convention (:mod:`edgepop.stats`).
"""

__version__ = "0.1.0"
