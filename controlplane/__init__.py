"""The control plane: a pure library that the simulator and the live gateway drive the same way.

No simulated-time clock is read here: the caller passes the time ``now`` (seconds) to every method whose outcome
depends on it (``submit``, ``finish``, ``poll``, ``drain``, ``cancel``, faults, releasing adapters; acquiring
one takes its time ``t``). The :class:`~controlplane.plane.ControlPlane` methods that take no time change
nothing that depends on it: admission checks (``check``), engine limits (``set_slots``), prefix-block pins
(``pin_prefix``, ``prefix_hit``, ``prefix_computed``, ``unpin_prefix``: reference counts and LRU order, not
timestamps) and queries (``next_wakeup``, ``snapshot``). One deliberate exception: the ``ilp`` placement's solve
budget is wall-clock time (``time.perf_counter``, :mod:`controlplane.placement.deadline`), a backstop by design:
when it rather than the node limit ends the solve, the plan may depend on machine speed (``solver.deterministic``
is false; docs/placement.md). No SimPy, no HTTP, no threads (that deadline's solver step alone runs in a forked
child process).

Reading guide (details in docs/controlplane.md, docs/placement.md, docs/routing.md and docs/perf-model.md):

* :mod:`controlplane.catalog` (models, sizes, LoRA adapter declarations) and :mod:`controlplane.fleet` (GPU
  nodes at sites); :mod:`controlplane.forecast`: demand per ingress PoP and model, what placement plans for;
* :mod:`controlplane.placement` (which replicas run where; policies by name) and :mod:`controlplane.routing`
  (where each request goes; policies by name); :mod:`controlplane.ordering`: the nearest few of many sites,
  shared by both;
* :mod:`controlplane.state` (replicas, slots, KV budget, site queues; the per-ingress candidate lists routers
  read are :mod:`controlplane.candidates`) and :mod:`controlplane.plane` (the
  :class:`~controlplane.plane.ControlPlane` facade: submit, finish, poll; prefix pins and adapter slots, kept in
  :mod:`controlplane.prefix_index` and :mod:`controlplane.adapter_index`);
* :mod:`controlplane.deployment`: **start here to build one**: ``build_deployment`` (the simulator, the live
  gateway) and ``deployment_from_table`` (the fidelity mirror), both through ``build_control_plane``;
* service times: :mod:`controlplane.perf` (the ``PerfModel`` interface and the roofline), built on
  :mod:`controlplane.perf_arch` (FLOPs and bytes of one pass) and :mod:`controlplane.perf_params` (the fitted
  constants); :mod:`controlplane.perf_profile` (a measured table) and :mod:`controlplane.perf_models` (models by
  name), :mod:`controlplane.perf_scaled` (any of them slowed by a factor: a calibration stress test),
  :mod:`controlplane.perf_cached` (any of them memoised, as the simulator and the gateway read them); the fit:
  :mod:`controlplane.perf_rows` (the reference rows), :mod:`controlplane.perf_calibration` (the
  fit), :mod:`controlplane.perf_validation` (its cross-validation) and :mod:`controlplane.perf_coverage` (what
  the rows cover);
* :mod:`controlplane.autoscale`, :mod:`controlplane.billing`, :mod:`controlplane.outcomes` (Workers AI codes);
* :mod:`controlplane.validation` (``edgepop validate``'s fidelity report) and :mod:`controlplane.cli` (the
  control-plane commands of ``edgepop``).

Extension points (registries of :mod:`edgepop.registry`): ``controlplane.routing.ROUTERS``,
``controlplane.placement.PLACEMENTS``, ``controlplane.autoscale.AUTOSCALERS``,
``controlplane.perf_models.PERF_MODELS``.
"""
