"""Run a scenario: one workload, the edge and central deployments on identical arrivals, then the summary.

    from sim.run import run_scenario
    out = run_scenario("default", requests=20_000, seed=3)
    out.requests        # one row per request per deployment
    out.summary         # what summary.json holds
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, default_catalog
from controlplane.deployment import Deployment, build_deployment
from controlplane.perf import clip_mix
from controlplane.perf_models import build_run_perf
from controlplane.placement import PlacementError
from controlplane.routing import ROUTERS
from edgepop.errors import UserError
from edgepop.memory import release_large_blocks
from edgepop.rng import MAX_INT, streams
from edgepop.stats import percentiles
from sim.breakdown import per_gpu_type, per_model
from sim.capacity import GpuBusySampler, capacity_block, sample_interval
from sim.faults import FaultHandler, check_fault_targets, fault_spec, faults_for, parse_fault
from sim.metrics import deployment_summary, gains, slo_met
from sim.request_frame import concat_frames
from sim.run_progress import check_progress, simulation_progress
from sim.scenario import (
    Scenario,
    check_scenario,
    demand_summary,
    load_scenario,
    network_summary,
    no_central,
    with_overrides,
)
from sim.simulator import Simulation
from sim.techniques import TechniqueRuntime
from sim.techniques.batch_policy import with_send_times
from sim.techniques.config import check_block_tokens
from sim.trace_files import trace_block
from sim.traces import TraceFileError, trace_kind
from sim.workload import generate
from sim.workload_config import TRACE_START, check_size
from topology import Topology
from topology.gpus import NODE_SPEC, NoGpusLeft
from topology.jitter import fit as fit_jitter


@dataclass
class RunOutput:
    """What :func:`run_scenario` returns. ``scenario``: the scenario as run (overrides applied); ``requests``: one
    row per request and deployment (the columns of ``requests.parquet``, docs/simulate.md); ``utilisation``: the
    fleet sampled every ``sample_s`` (busy slots, replicas; ``utilisation.parquet``); ``summary``: what
    ``summary.json`` holds; ``placements``: deployment name -> its :class:`controlplane.placement.Placement`
    (``.table``, ``.objective_ms``, ``.solver``); ``workload``: the generated workload (its ``requests`` of
    arrivals, the same for every deployment)."""

    scenario: Scenario
    requests: pd.DataFrame
    utilisation: pd.DataFrame
    summary: dict
    placements: dict = field(default_factory=dict)
    workload: object = None


def with_run_overrides(sc: Scenario, *, requests: int | None = None, duration_s: float | None = None,
                       seed: int | None = None, trace: str | None = None, faults=None) -> Scenario:
    """``sc`` with the command line's size, seed, trace and fault overrides applied (one-line errors)."""
    wl = {}
    if trace is not None:
        wl.update(trace=str(trace), kind=trace_kind(trace), requests=None, duration_s=None)
    is_trace = wl.get("kind", sc.workload.kind) != "poisson"
    if requests is not None:
        if isinstance(requests, bool) or not isinstance(requests, int | np.integer) or requests <= 0:
            raise UserError(f"requests must be a positive integer, got {requests!r}")
        requests = int(requests)
        # the command line's size replaces the scenario's, whichever field it was given in
        wl.update(trace_limit=requests, requests=None, duration_s=None) if is_trace else wl.update(
            requests=requests, duration_s=None)
    if duration_s is not None:
        if isinstance(duration_s, bool) or not isinstance(duration_s, int | float | np.integer | np.floating):
            raise UserError(f"duration must be a number of seconds, got {duration_s!r}")
        if not duration_s > 0:  # (NaN fails too)
            raise UserError(f"duration must be positive, got {duration_s}")
        if duration_s == float("inf"):
            raise UserError("duration must be finite, got inf (a run that would never end)")
        # as the file's duration_s: a replay stops there; it replaces the scenario's size (trace_limit too)
        wl.update(duration_s=duration_s, requests=None)
        if is_trace and requests is None:
            wl.update(trace_limit=None)
    size = {"kind": sc.workload.kind, "requests": sc.workload.requests, "duration_s": sc.workload.duration_s, **wl}
    if size["kind"] == "poisson" and size["requests"] is None and size["duration_s"] is None:
        # a scenario file may leave the size to the command line (--requests / --duration)
        raise UserError(f"{sc.source} [workload]: no size: give requests (a count) or duration_s (seconds) in "
                        "the file, or --requests / --duration")
    if wl:  # the command line's size, checked as the file's is (a trace's without a rate)
        check_size("--requests / --duration", size["requests"], size["duration_s"],
                   None if is_trace else sc.workload.rps, sc.workload.bursts)
    over = {"workload": wl} if wl else {}
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)
                             or not 0 <= seed <= MAX_INT):
        raise UserError(f"seed must be an integer in [0, 2**63 - 1], got {seed!r}")
    if seed is not None:
        over["seed"] = seed
    if faults:
        if isinstance(faults, str):  # one spec, not a list of its characters
            faults = [faults]
        over["faults"] = [replace(parse_fault(f), origin="--fail") if isinstance(f, str) else f for f in faults]
    return with_overrides(sc, **over) if over else sc


@dataclass
class Setup:
    """Everything a scenario's deployments share: topology, catalog, perf model, techniques, random streams,
    the workload and the demand the placements plan for."""

    scenario: Scenario
    topo: object
    catalog: Catalog
    perf: object
    tech: TechniqueRuntime
    rng: dict
    workload: object
    mean_rps: float
    mix: dict
    typical: tuple
    shape: dict
    start_utc: object
    day_s: float

    @property
    def frame(self) -> pd.DataFrame:
        return self.workload.requests

    @property
    def span_s(self) -> float:
        return float(self.frame.arrival_s.max()) if len(self.frame) else 0.0


def scenario_topology(sc: Scenario, topo=None) -> Topology:
    """``topo`` (default: the shipped world) shaped as ``sc`` runs it: last mile, GPU inventory scale, anycast
    misroute, demand weighting (what planning outside a run uses). Shape an unshaped world: shaping twice scales
    the GPUs twice."""
    # a topology given (custom PoPs, one shared by many runs) takes the scenario's last mile, as a loaded one does
    try:
        return (topo or Topology.load(last_mile_ms=sc.last_mile_ms, last_mile=sc.last_mile)).shaped(
            sc.last_mile_ms, sc.last_mile, sc.gpu_inventory_scale, sc.anycast_misroute, seed=sc.seed,
            demand_weight=sc.demand_weight)
    except NoGpusLeft as exc:
        raise UserError(f"{sc.source}: field 'gpu_inventory_scale': {exc}") from None


def prepare(sc: Scenario, topo=None, trace_option: str | None = None) -> Setup:
    """Load what the scenario needs and generate its workload (the ``workload`` random stream). ``trace_option``:
    the command-line option that named the trace (``--trace``), which its file's errors then name."""
    release_large_blocks()  # large runs free many arrays of a few MB: give them back, do not keep holes
    topo = scenario_topology(sc, topo)
    tech = TechniqueRuntime(sc.techniques)  # every call below is the identity when all techniques are off
    catalog = scenario_catalog(sc, tech)
    perf = tech.perf(build_run_perf(sc.perf, topo, sc.prefill_time_scale, sc.decode_time_scale))
    # again: a --trace override may change the workload's blocks (the error names the file and the trace)
    wl = sc.workload
    trace = f" with the {wl.kind} trace {wl.trace or '(shipped)'}" if wl.is_trace else ""
    check_block_tokens(sc.techniques, wl, f"{sc.source} [techniques]{trace}")
    check_fault_targets(sc.faults, topo)  # a typo would be skipped by both fleets: refused before any work
    check_fleet_names(sc, topo)
    rng = streams(sc.seed)
    try:
        workload = generate(sc.workload, topo, catalog, rng["workload"])
    except TraceFileError as exc:  # a trace file's own errors name it; the option, if it came from one
        raise UserError(f"{trace_option} {exc}" if trace_option else f"{sc.source} [workload]: {exc}") from None
    except UserError as exc:  # generation's errors name the field ("workload F: ...") or none, never the file
        head, _, rest = str(exc).partition(": ")
        msg = rest if head == "workload" else f"field {head.removeprefix('workload ')}: {rest}" \
            if head.startswith("workload ") else str(exc)
        raise UserError(f"{sc.source} [workload]: {msg}") from None
    frame = workload.requests
    if not len(frame):  # every figure of the run would be empty
        raise UserError(f"{sc.name}: the workload has no requests (a duration shorter than the gap between "
                        "arrivals?): ask for more requests or a longer duration")
    if sc.jitter:  # one multiplier of the path's mean RTT per request, shared by every deployment
        frame["rtt_factor"] = fit_jitter().factors(len(frame), rng["jitter"])
    span = float(frame.arrival_s.max()) if len(frame) else 0.0
    # (a trace whose requests all arrive at once plans for them within a second, not within a nanosecond)
    floor = 1.0 if sc.workload.is_trace else 1e-9
    mean_rps = sc.planning_rps or (len(frame) / max(span, floor) if len(frame) > 1 else 1.0)
    gen = frame[frame.task == "text-generation"]
    typical = (int(gen.prompt_tokens.mean()), int(gen.output_tokens.mean())) if len(gen) else (512, 128)
    audio = frame.model.isin([s.id for s in catalog if s.unit == "audio-minute"])
    units = frame.prompt_tokens.where(~audio, frame.prompt_tokens / 60.0)
    shape = {"prompt": units.groupby(frame.model).mean().to_dict(),
             "output": frame.output_tokens.groupby(frame.model).mean().to_dict(),
             # speech capacity is costed clip by clip (per started window), not at the mean clip
             "prompt_mix": {m: clip_mix(catalog[m], u) for m, u in units[audio].groupby(frame.model[audio])}}
    return Setup(sc, topo, catalog, perf, tech, rng, workload, mean_rps,
                 frame.model.value_counts(normalize=True).to_dict(), typical, shape,
                 # start_utc = "trace": the day starts at the trace's own first timestamp
                 workload.trace_first_utc.to_pydatetime() if sc.workload.start_utc == TRACE_START
                 else getattr(sc.workload, "start_utc", None),
                 # A replayed trace keeps its own clock, sped up by trace_speed, whatever day_compression says.
                 86_400.0 / sc.workload.trace_speed if sc.workload.is_trace
                 else float(getattr(sc.workload, "day_compression", None) or 86_400.0))


def scenario_catalog(sc: Scenario, tech: TechniqueRuntime | None = None) -> Catalog:
    """The catalog the scenario runs with (its own file or the shipped one, as its techniques change it), once
    every model its workload's mix names is in it (one-line error otherwise: the workload would name neither the
    file nor the field)."""
    tech = tech or TechniqueRuntime(sc.techniques)
    catalog = tech.catalog(Catalog.load(sc.catalog) if sc.catalog else default_catalog())
    for model in sc.workload.mix or {}:
        if model not in catalog:
            raise UserError(f"{sc.source} [workload]: field 'mix': no model {model!r} in the catalog "
                            f"({len(catalog)} models; `edgepop place --list-models` lists them)")
    return catalog


def check_fleet_names(sc: Scenario, topo) -> None:
    """The edge's PoPs and central's baseline against the topology, before any work, naming the file and field
    (the fleets that would find them unknown are built after the workload)."""
    from topology.regions import baseline

    pop_ids = set(topo.pops.id)
    if sc.edge.pops:
        unknown = sorted(set(sc.edge.pops) - pop_ids)
        if unknown:
            raise UserError(f"{sc.source} [edge]: field 'pops': unknown PoP id(s) {', '.join(map(repr, unknown[:5]))} "
                            "(topology/data/pops.csv lists them)")
    for f in sc.faults:  # (node and link targets depend on the fleets: checked when those are built)
        where = getattr(f, "origin", "") or sc.source
        if sc.techniques.disaggregation and getattr(f, "kind", None) in ("pop", "node"):
            # A disaggregated site's replicas share one pool that routes requests inside it, so the requests the
            # control plane loses with a node are not the ones computing there: not modelled, refused.
            raise UserError(f"{where}: fault '{f.kind}:{f.target}' with [techniques] disaggregation: node and "
                            "PoP faults are not modelled for disaggregated pools (link faults are)")
        if getattr(f, "kind", None) == "pop" and f.target not in pop_ids:
            raise UserError(f"{where}: fault 'pop:{f.target}': unknown PoP id (topology/data/pops.csv lists "
                            "them)")
    if sc.central is not None:
        try:
            baseline(sc.central.baseline, topo.regions)
        except UserError as exc:
            raise UserError(f"{sc.source} [central]: field 'baseline': {exc}") from None
        # (its form is checked when the file is read; its GPU type needs the topology's table, and a typo would
        # only fail an equal-dollar budget, far into a sweep, or pass unnoticed under an equal-GPU one)
        m = NODE_SPEC.match(sc.central.node) if isinstance(sc.central.node, str) else None
        if m is not None and m.group(1) not in set(topo.gpus.gpu):
            raise UserError(f"{sc.source} [central]: field 'node': unknown GPU type {m.group(1)!r} in "
                            f"{sc.central.node!r} (known: {', '.join(sorted(topo.gpus.gpu))})")


def scenario_deployment(setup: Setup, name: str) -> Deployment:
    """Deployment ``name`` (``edge`` or ``central``) of the scenario, placed for its workload's demand."""
    sc = setup.scenario
    cfg = sc.edge if name == "edge" else central_config(sc)
    try:
        return build_deployment(name, cfg, setup.topo, setup.catalog, perf=setup.perf, demand_rps=setup.mean_rps,
                                mix=setup.mix, rng_place=setup.rng[f"place_{name}"],
                                rng_route=setup.rng[f"route_{name}"], typical_tokens=setup.typical,
                                scenario_start=setup.start_utc, day_s=setup.day_s, shape=setup.shape,
                                **setup.tech.plane_options(name))
    except PlacementError as exc:  # (the policy knows its options, not the file or table they came from)
        raise type(exc)(f"{sc.source} [{name}]: {exc}") from None


def central_config(sc: Scenario):
    """The central deployment's config; its budget follows the edge's PoPs when only the edge names some."""
    cfg = sc.central
    if cfg is not None and cfg.pops is None and sc.edge.pops:
        cfg = replace(cfg, pops=list(sc.edge.pops))
    return cfg


@dataclass
class DeploymentRun:
    """One simulated deployment of a scenario run: its deployment, request and utilisation frames,
    its summary.json block and run statistics."""
    name: str
    deployment: Deployment
    requests: pd.DataFrame
    utilisation: pd.DataFrame
    block: dict
    stats: dict


def simulate_deployment(setup: Setup, name: str, progress=None, dep: Deployment | None = None) -> DeploymentRun:
    """Build deployment ``name`` (or take ``dep``, built by :func:`scenario_deployment`), run the workload through
    it, and summarise it (its summary.json block)."""
    sc, frame = setup.scenario, setup.frame
    cfg = sc.edge if name == "edge" else sc.central
    t0 = time.perf_counter()
    dep = dep or scenario_deployment(setup, name)
    faults, skipped = faults_for(sc.faults, dep)
    handler = FaultHandler(setup.topo, dep, faults) if faults else None
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dep_frame, orig_arrival = setup.tech.workload(name, frame, dep, setup.topo, setup.start_utc, setup.day_s)
    interval = sample_interval(setup.span_s)
    sim = Simulation(dep, dep_frame, setup.perf, faults=faults, fault_policy=sc.fault_policy,
                     # at most sample_s apart, and some 400 samples over a short run (one a minute saw none)
                     sample_s=min(sc.sample_s, interval),
                     progress=(lambda i, n: progress(name, i, n)) if progress else None,
                     fault_handler=handler, techniques=setup.tech.for_simulation(name))
    sampler = GpuBusySampler(sim, interval)
    res = sim.run()
    # The candidate lists a run builds for the pairs its workload names are set-up: booked with the deployment's
    # build, not the simulation loop.
    run_s = time.perf_counter() - t0 - sim.candidate_lists_s
    build_s += sim.candidate_lists_s
    req = res.requests
    block = deployment_summary(req, res.utilisation, dep.fleet, max(setup.span_s, res.sim_end_s), sc.slo,
                               setup.catalog, sim.gpu_busy_seconds(), billing_s=setup.span_s)
    end = max(setup.span_s, res.sim_end_s)
    block["per_model"] = per_model(req, dep.table)
    block["per_gpu_type"] = per_gpu_type(req, dep.fleet, sim.gpu_busy_seconds_by_type(), end)
    late = [f for f in faults if f.start_s >= end]  # scheduled, but the run was over before it began
    skipped += [f"{fault_spec(f)}: starts after the run ended ({end:.1f} s)" for f in late]
    block["faults"].update(applied=[fault_spec(f) for f in faults if f not in late], skipped=skipped)
    if dep.plane.autoscaler is not None:  # (a static placement's block has none)
        block["autoscaler"] = {"policy": cfg.autoscaler, **dep.plane.autoscaler.activity(),
                               "router_loads": dep.plane.counts["router_loads"]}
    block["capacity"] = capacity_block(dep, req, setup, sc.slo, sampler, setup.span_s)
    setup.tech.summarize(name, block, sim, req, dep_frame, orig_arrival, dep.fleet, setup.start_utc, setup.day_s)
    techniques_block = block.pop("techniques", None)  # keep the block order: placement before techniques
    batch = req.batch.to_numpy(dtype=bool) & (req.outcome == "ok").to_numpy()
    if batch.any():  # async batch: completion from when the user sent it (holds included)
        done = req.arrival_s.to_numpy(dtype=float) + req.e2e_ms.to_numpy(dtype=float) / 1e3
        block["batch_completion_s"] = percentiles((done - frame.arrival_s.to_numpy(dtype=float))[batch])
    block["placement"] = {"policy": cfg.placement, "replicas": int(len(dep.table)),
                          "gpus_placed": placed_gpus(dep.table)}
    # how requests were routed and queued: a gain may be a router's, so the outputs name both sides' rules
    block["routing"] = {"router": cfg.router, "options": ROUTERS.options_in_effect(cfg.router, cfg.router_options),
                        "queue_limit": cfg.queue_limit, "queue_timeout_s": cfg.queue_timeout_s}
    if dep.plane.router.name != cfg.router:  # (adapter-aware wraps the configured router when adapters are on)
        block["routing"]["wrapped_by"] = dep.plane.router.name
    solver = dep.placement.solver if dep.placement is not None else {}
    if "deterministic" in solver:  # a time-budgeted solver (ilp): false when the clock, not its work limit, decided
        block["placement"]["deterministic"] = bool(solver["deterministic"])
    if techniques_block is not None:
        block["techniques"] = techniques_block
    if sc.techniques.batch_policy != "none":  # the frame written: send times, holds (the figures above: releases)
        req = with_send_times(req, frame.arrival_s.to_numpy(dtype=float))
    # (wall times go to the performance block only: the rest of summary.json is the same for the same seed)
    stats = {"build_s": round(build_s, 2), "sim_wall_s": round(run_s, 3), "sim_requests_per_wall_s": round(len(frame) / run_s, 1),
             "placement_from_cache": dep.placement is not None and dep.placement.from_cache}
    return DeploymentRun(name, dep, req, res.utilisation, block, stats)


def placed_gpus(table: pd.DataFrame) -> int:
    """Distinct GPUs holding at least one replica (replicas may share a GPU)."""
    return len({(n, g) for n, gpus in zip(table.node.tolist(), table.gpu_index.tolist(), strict=True) for g in gpus})


def paired_gains(setup: Setup, runs: list) -> dict:
    """Point reductions (``gains``), their intervals (``ci95``), the crossovers and where the edge loses."""
    from sim.gains import Paired, crossovers, headline_gains, loss_sentence

    by = {r.name: r for r in runs}
    slo = setup.scenario.slo
    out = gains(by["edge"].block, by["central"].block)
    p = Paired(by["edge"].requests, by["central"].requests, setup.scenario.seed)
    out["ci95"], e2e_points = headline_gains(p, slo_met(p.e, slo), slo_met(p.c, slo))
    out.update(e2e_points)
    out.update(crossovers(p, min(setup.day_s / 24.0, max(setup.span_s, 1.0) / 12.0)))
    out["edge_loses"] = loss_sentence(out)
    return out


COLLECT_FROM_REQUESTS = 20_000  # runs this large free each deployment's simulation as soon as it ends


def run_scenario(scenario: Scenario | str = "default", *, requests: int | None = None,
                 duration_s: float | None = None, seed: int | None = None, trace: str | None = None,
                 faults=None, topo=None, progress=None, deployments=("edge", "central")) -> RunOutput:
    """Simulate ``scenario`` (an embedded name, a path or a Scenario) with optional overrides. ``topo``: a
    :class:`topology.Topology` to run on instead of the shipped one (a custom PoP list; the scenario's last mile,
    GPU inventory scale and anycast settings are applied to it); ``deployments``: which to simulate. ``progress``:
    True, a bar per deployment on stderr (``edgepop simulate``'s); None or False, none; a function, called as
    ``progress(deployment, requests_done, total)``."""
    check_progress(progress)
    # (a Scenario built or edited in Python skipped the file's checks)
    sc = check_scenario(scenario if isinstance(scenario, Scenario) else load_scenario(scenario))
    deployments = (deployments,) if isinstance(deployments, str) else tuple(deployments or ())
    if not deployments or not set(deployments) <= {"edge", "central"} or len(set(deployments)) < len(deployments):
        raise UserError(f"deployments must be 'edge' and/or 'central', each once, got {deployments!r}")
    sc = with_run_overrides(sc, requests=requests, duration_s=duration_s, seed=seed, trace=trace, faults=faults)
    if sc.central is None and deployments == ("central",):  # (checked before the workload is generated)
        raise UserError(f"only central asked for: {no_central(sc.name)}; nothing to simulate")
    t_wall = time.perf_counter()
    setup = prepare(sc, topo, "--trace" if trace is not None else None)
    prepare_s = time.perf_counter() - t_wall
    runs = []
    with simulation_progress(progress) as report:
        for name in (n for n in deployments if (sc.edge if n == "edge" else sc.central) is not None):
            runs.append(simulate_deployment(setup, name, report))
            if len(setup.frame) >= COLLECT_FROM_REQUESTS:
                # A finished simulation is a web of cycles, some 1 kB a request: free it, or the next run's
                # gc.freeze() keeps it. A full collection walks everything alive (some 60-90 ms with pandas and
                # scipy loaded, whatever it frees): a small run's web is left to the collector's own passes.
                gc.collect()
    blocks = {r.name: r.block for r in runs}
    summary = {"scenario": sc.name, "seed": sc.seed, "requests": int(len(setup.frame)),
               "simulated_span_s": round(setup.span_s, 2),
               # which part of the (compressed) day the run covers: a short run sees a few hours of it only
               "day": {"start_utc": setup.start_utc.isoformat() if setup.start_utc is not None else None,
                       "day_s": round(setup.day_s, 3), "hours_covered": round(24.0 * setup.span_s / setup.day_s, 6)},
               "gpu_inventory_scale": sc.gpu_inventory_scale,
               "baseline": sc.central.baseline if sc.central is not None else None,
               "deployments": blocks, "capacity": {r.name: r.block.pop("capacity") for r in runs},
               "network": network_summary(sc, setup.topo.last_mile)}
    summary.update(demand_summary(sc))
    if (sc.prefill_time_scale, sc.decode_time_scale) != (1.0, 1.0):  # (absent at 1: the default's outputs stay)
        summary["service_time_scale"] = {"prefill": sc.prefill_time_scale, "decode": sc.decode_time_scale}
    wl = sc.workload
    if wl.is_trace:  # where the arrivals came from (a Poisson run's are the scenario's own workload table)
        summary["trace"] = trace_block(wl, setup.workload, int(len(setup.frame)))
    if "edge" in blocks and "central" in blocks:
        summary["gains"] = paired_gains(setup, runs)
    total_sim = sum(r.stats["sim_wall_s"] for r in runs)
    build_s = sum(r.stats["build_s"] for r in runs)
    wall = time.perf_counter() - t_wall
    summary["performance"] = {
        "wall_s": round(wall, 2),
        # where the time went: topology, perf model and workload; placement and control planes; the simulation
        "setup_s": round(prepare_s + build_s, 2), "simulate_s": round(total_sim, 2),
        "summary_s": round(max(0.0, wall - prepare_s - build_s - total_sim), 2),
        **{f"{r.name}_{m}": v for r in runs for m, v in r.stats.items()},
        "simulated_requests_per_wall_s": round(len(runs) * len(setup.frame) / max(total_sim, 1e-9), 1)}
    # The deployments' frames are emptied into the joint one (they are not needed past the gains above).
    return RunOutput(sc, concat_frames([r.requests for r in runs]),
                     pd.concat([r.utilisation for r in runs], ignore_index=True), summary,
                     {r.name: r.deployment.placement for r in runs}, setup.workload)
