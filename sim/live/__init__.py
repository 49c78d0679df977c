"""Sim vs live: the simulator checked against the live gateway it models.

Start with :mod:`sim.live.replay` (``edgepop replay``): it sends a trace to a running ``edgepop serve`` from
emulated client locations and records client-side TTFT, TPOT and E2E. :mod:`sim.live.fidelity` then builds the
simulated mirror of that gateway (the same deployment builder, the same placement, router and limits), runs the
same requests through the simulator with a measured service-time profile (:mod:`sim.live.live_profile`, through
the gateway; or :mod:`dataplane.engine_profile`, the bare engine) and compares percentiles.

This is the only part of ``sim`` that imports ``dataplane``.
"""
