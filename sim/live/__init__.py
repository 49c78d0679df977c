"""Sim vs live: the simulator checked against the live gateway it models.

Start with :mod:`sim.live.replay` (``edgepop replay``): it sends a trace to a running ``edgepop serve`` from
emulated client locations and records client-side TTFT, TPOT and E2E. :mod:`sim.live.fidelity` then builds the
simulated mirror of that gateway (the same deployment builder, the same placement, router and limits), runs the
same requests through the simulator with a measured service-time profile (:mod:`sim.live.live_profile`, through
the gateway; or :mod:`dataplane.engine_profile`, the bare engine) and compares percentiles.
:mod:`sim.live.host_model` models the live host (its engines' iterations, shared cores, the gateway's own
costs) from the profile of :mod:`sim.live.host_profile`; :mod:`sim.live.pooling` pools several profiles per row;
:mod:`sim.live.matrix` runs traces x loads on one deployment (``benchmarks/bench_fidelity_live.py``).

This is the only part of ``sim`` that imports ``dataplane``.
"""
