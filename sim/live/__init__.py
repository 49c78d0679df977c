"""Sim vs live: the simulator checked against the live gateway it models (docs/fidelity.md).

Start with :mod:`sim.live.replay` (``edgepop replay``, parsed by :mod:`sim.live.cli`): it sends a trace to a
running ``edgepop serve`` from emulated client locations and records client-side TTFT, TPOT and E2E, each
request through :mod:`sim.live.client`. :mod:`sim.live.run` drives one replay end to end: it measures the
service-time profile, replays the trace, simulates the same requests and writes the comparison (its figure:
:mod:`sim.live.replay_plots`). :mod:`sim.live.fidelity` builds the simulated mirror of that gateway (the same
deployment, placement, router and limits, by :func:`controlplane.deployment.deployment_from_table`), runs the
same requests through the simulator and compares percentiles; :mod:`sim.live.decompose` splits each request's
time into the same components on both sides.

The profile: by default the live-host profile of :mod:`sim.live.host_profile` (the stand-in's engine, engines
sharing the host and the gateway's own costs; the engine rows read by :mod:`sim.live.served_profile` from the
gateway's timelines), which :mod:`sim.live.host_model` runs on (the live host modelled: engine iterations,
shared cores, the gateway's costs; one replica's engine in :mod:`sim.live.host_engine`, the figures it reads off
the profile in :mod:`sim.live.host_params`). The alternatives
(``--profile-source``): service times through the gateway (:mod:`sim.live.live_profile`) or the bare engine
(:mod:`dataplane.engine_profile`). :mod:`sim.live.pooling` pools several profiles per row;
:mod:`sim.live.matrix` runs traces x loads on one deployment (``benchmarks/bench_fidelity_live.py``), with
:mod:`sim.live.host_speed` probing the host's speed beside every profile and replay.

This is the only part of ``sim`` that imports ``dataplane``.
"""
