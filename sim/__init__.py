"""The simulator: workloads, scenarios, the SimPy simulation of a deployment, sweeps and reports.

Reading guide:

* :mod:`sim.scenario` (a scenario file: workload, ``[edge]``/``[central]`` deployments, SLOs, techniques,
  faults) and :mod:`sim.workload` (requests from city populations, or a replayed trace, :mod:`sim.traces`);
* :mod:`sim.run`: **start here**: ``run_scenario`` prepares a scenario, builds each deployment with
  :func:`controlplane.deployment.build_deployment` and simulates it on the same arrivals;
* :mod:`sim.simulator` (the request path as SimPy processes) and :mod:`sim.engine` (continuous batching on one
  replica, advanced analytically between batch changes; :mod:`sim.decode_bias` measures what that costs);
* :mod:`sim.metrics`, :mod:`sim.report` and :mod:`sim.plots` (summary.json, report.md, plots);
* :mod:`sim.grid`, :mod:`sim.sweep` (+ :mod:`sim.sweep_variant`, :mod:`sim.sweep_ray`): parameter sweeps;
* :mod:`sim.techniques`: serving techniques behind one seam; :mod:`sim.faults`: PoP, node and link failures;
* :mod:`sim.live`: the simulator checked against the live gateway; :mod:`sim.load_validation`: one simulated
  replica checked against published closed-loop benchmark runs (``edgepop validate``, :mod:`sim.cli_validate`).

Extension points: ``sim.techniques.TECHNIQUES``, ``sim.faults.FAULT_POLICIES``,
``sim.techniques.batch_policy.BATCH_POLICIES``, ``sim.traces.TRACE_FORMATS``.
"""
