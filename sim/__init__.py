"""The simulator: workloads, scenarios, the SimPy simulation of a deployment, sweeps and reports.

Reading guide (each docs page's "Where the code is" says more: docs/simulate.md, docs/workloads.md,
docs/sweep.md, docs/frontier.md, docs/techniques.md, docs/fidelity.md, docs/fidelity-models.md;
docs/speed.md: how fast it runs and why):

* :mod:`sim.run`: **start here**: ``run_scenario`` prepares a scenario, builds each deployment with
  :func:`controlplane.deployment.build_deployment` and simulates it on the same arrivals (its progress bar:
  :mod:`sim.run_progress`);
* scenarios: :mod:`sim.scenario` (a scenario file: workload, ``[edge]``/``[central]`` deployments, SLOs,
  techniques, faults), its checks :mod:`sim.validate`;
* workloads: :mod:`sim.workload` (the requests, generated or replayed), :mod:`sim.workload_config` (the
  ``[workload]`` table), :mod:`sim.arrivals` (the Poisson process over demand cities), :mod:`sim.sessions`
  (chat sessions and prefix blocks), :mod:`sim.tokens` (request sizes), :mod:`sim.traces` (trace readers),
  :mod:`sim.trace_files` (which trace files a run read, as outputs name them; a grid's up-front read of them);
* the simulation: :mod:`sim.simulator` (the request path as SimPy processes, with its mixins
  :mod:`sim.node_faults` (faults on nodes and PoPs) and :mod:`sim.readouts` (what a finished run hands back),
  fed by :mod:`sim.arrival_feed` on the timers of :mod:`sim.timers`) and :mod:`sim.engine` (continuous
  batching on one replica, advanced analytically between batch changes; :mod:`sim.decode_bias` measures what
  that costs; its service times are memoised by :mod:`controlplane.perf_cached`); :mod:`sim.gpu_busy` counts GPU
  busy time,
  :mod:`sim.request_frame` builds the per-request frame; :mod:`sim.faults`: PoP, node and link failures;
* results: :mod:`sim.metrics` (summaries), :mod:`sim.capacity` (GPUs, replicas, capacity, cost),
  :mod:`sim.gains` (paired gains with intervals), :mod:`sim.breakdown` (per model and GPU type),
  :mod:`sim.report` (+ :mod:`sim.report_deployments`, how each side was placed and routed) and
  :mod:`sim.plots` (report.md and its plots), all written by :mod:`sim.outputs`
  (requests.parquet, summary.json, report.md, all or nothing), :mod:`sim.rejections` (why requests did not end ok,
  by error code); :mod:`sim.sensitivity` and :mod:`sim.replicates` (their figures :mod:`sim.sensitivity_plot`,
  :mod:`sim.replicates_plot`)
  (the headline under other assumptions, and over seeds);
* sweeps: :mod:`sim.grid` (+ :mod:`sim.grid_keys`, its key checks), :mod:`sim.sweep` (+
  :mod:`sim.sweep_variant`, :mod:`sim.sweep_plot`, :mod:`sim.sweep_ray`, :mod:`sim.pool_worker`: the local pool's
  workers;
  :mod:`sim.sweep_plugins`: users' policies in the workers);
  :mod:`sim.frontier` (least budget per SLO, + :mod:`sim.frontier_args`, its argument checks,
  :mod:`sim.frontier_brackets`, its least budgets and ratios, overall and per seed, :mod:`sim.frontier_report`,
  :mod:`sim.frontier_plot`);
* :mod:`sim.techniques`: serving techniques behind one seam;
* :mod:`sim.live`: the simulator checked against the live gateway; :mod:`sim.load_validation`: one simulated
  replica checked against published closed-loop benchmark runs (``edgepop validate``, with its figure
  :mod:`sim.validate_plots`);
* commands: :mod:`sim.cli` (``edgepop simulate``, ``edgepop sweep``), :mod:`sim.cli_frontier`,
  :mod:`sim.cli_estimate`, :mod:`sim.cli_validate`.

Extension points: ``sim.techniques.TECHNIQUES``, ``sim.faults.FAULT_POLICIES``,
``sim.techniques.batch_policy.BATCH_POLICIES``, ``sim.traces.TRACE_FORMATS``.
"""
