"""edgepop: edge AI inference research toolkit.

Reading guide. The importable subsystems are the top-level packages, layered so that imports point one way
(enforced by ``tests/test_layering.py``)::

    edgepop  <-  topology  <-  controlplane  <-  dataplane  <-  sim

* ``topology``: PoPs, GPU nodes, cloud regions, demand, the WAN latency model (start at ``topology.world``);
* ``controlplane``: a pure library that reads no simulated-time clock (the caller passes the time): catalog,
  placement, routing, admission, autoscaling, billing, the service-time models, and ``controlplane.deployment``,
  where every control plane is built;
* ``dataplane``: real ONNX inference and its engines; ``dataplane.gateway`` serves them over HTTP through the
  control plane (the only part of the data plane that knows about it);
* ``sim``: the discrete-event simulator, workloads, scenarios, sweeps and reports; ``sim.live`` checks the
  simulator against the live gateway (the only part of ``sim`` that touches the data plane).

This package itself holds what every layer shares; start at :mod:`edgepop.cli`:

* :mod:`edgepop.cli`: the ``edgepop`` command, each sub-command registered by the package that owns it
  (``python -m edgepop`` runs it through :mod:`edgepop.__main__`);
* :mod:`edgepop.errors`: the one-line user error; :mod:`edgepop.registry`: the registry every pluggable policy
  uses, with typed options; :mod:`edgepop.plugins`: users' modules that register policies (``edgepop --plugin``,
  ``EDGEPOP_PLUGINS``), and what a sweep's workers import of them;
* :mod:`edgepop.rng`: the seeded random streams, one per concern; :mod:`edgepop.stats`: the percentile convention;
* :mod:`edgepop.outputs`: output paths checked before the work starts, and written all or nothing;
  :mod:`edgepop.memory`: how glibc's malloc treats freed blocks, per process role; :mod:`edgepop.argtypes`:
  argparse types and the final JSON line of the scripts in ``benchmarks/``; :mod:`edgepop.console`: the
  console the commands print their tables on (wide when piped).
"""

__version__ = "0.1.0"
