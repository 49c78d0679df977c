"""Deployments: one builder for every control plane, whoever drives it (the simulator, the live gateway, or the
simulated mirror of a live gateway).

A :class:`DeploymentConfig` says how a deployment is built and operated (placement policy, router, autoscaler,
admission limits, and for a central baseline its region set and GPU scale); it is the ``[edge]`` / ``[central]``
table of a scenario and the deployment part of a gateway config. :func:`build_deployment` places replicas with the
configured policy and wraps them in a :class:`ControlPlane` through :func:`build_control_plane`, the one place a
control plane is made, so router, router options, autoscaler, techniques and their defaults are the same live and
simulated. :func:`deployment_from_table` rebuilds a deployment from an explicit placement table (the fidelity
mirror of a running gateway).

A :class:`Deployment` is that control plane plus its fleet, its placement and how requests reach it: ``anycast``
(the edge: users enter at their nearest PoP, the access RTT is measured to it) or ``direct`` (a central baseline:
users reach the region straight from their city, last mile + core RTT).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from controlplane.adapter_index import AdapterIndex
from controlplane.autoscale import AUTOSCALERS
from controlplane.catalog import Catalog
from controlplane.fleet import Fleet, edge_fleet, ingress_site_rtt
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.prefix_index import PrefixIndex
from edgepop.errors import UserError, is_real
from edgepop.memory import collector_paused

ENTRIES = ("anycast", "direct")


@dataclass
class DeploymentConfig:
    """How one deployment is built and operated. ``baseline``, ``gpu_scale``, ``budget``, ``node`` and ``rack`` only
    matter for central: its region set, its budget relative to the edge's, and whether that budget is equal GPUs
    (``gpus``: the edge's GPUs of each type, split between the regions by demand, racked in 8-GPU servers, or with
    ``rack = "edge"`` in servers the size of the edge's nodes) or equal dollars per hour (``usd``: ``node`` boxes
    bought for the same $/hour). ``fill_idle_gpus``: after placement, give every GPU left without a replica one
    (capacity matching, :mod:`controlplane.placement.fill`; the ``central`` policy always does). ``one_llm_per_gpu``: a GPU computes
    for one language model at most (encoders may share it), because the simulator does not slow co-located
    replicas down; false lets memory alone decide (and grants co-located models compute the GPU does not have).

    ``placement``/``placement_options``: a policy of ``controlplane.placement`` and its options; ``router`` /
    ``router_options``: a policy of ``controlplane.routing``; ``autoscaler``/``autoscaler_options``: ``none``,
    ``reactive`` or ``scheduled``; ``queue_limit`` per replica and ``queue_timeout_s``; cold starts take weight
    bytes / ``load_gbs`` + ``init_s``; ``pops`` restricts the edge fleet to these PoP ids. ``utilisation_cap``: the
    share of each replica's (and GPU's) capacity the placement plans to use; what is left absorbs bursts and the
    day's peaks (lower: more replicas for the busiest models, shorter queues, more of them farther away).
    """

    placement: str = "greedy-demand"
    placement_options: dict = field(default_factory=dict)
    router: str = "nearest-with-capacity"
    router_options: dict = field(default_factory=dict)
    autoscaler: str = "none"
    autoscaler_options: dict = field(default_factory=dict)
    queue_limit: int = 64
    queue_timeout_s: float = 30.0
    load_gbs: float = 2.0
    init_s: float = 5.0
    pops: list | None = None
    baseline: str = "global-6"
    gpu_scale: float = 1.0
    budget: str = "gpus"
    node: str = "H100x8"
    rack: str = "server"
    fill_idle_gpus: bool = True
    one_llm_per_gpu: bool = True
    utilisation_cap: float = 0.7

    def check(self, where: str) -> None:
        """Policy names and their options against the registries (one-line UserError naming ``where``)."""
        from controlplane.placement import PLACEMENTS
        from controlplane.routing import ROUTERS

        for field_, registry, options in (("placement", PLACEMENTS, self.placement_options),
                                          ("router", ROUTERS, self.router_options),
                                          ("autoscaler", AUTOSCALERS, self.autoscaler_options)):
            name = getattr(self, field_)
            registry.entry(name, f"{where}: field {field_!r}")
            registry.check(name, options, f"{where} {field_}_options")
        if not (isinstance(self.utilisation_cap, int | float) and 0 < self.utilisation_cap <= 1):  # (NaN fails)
            raise UserError(f"{where}: utilisation_cap must be in (0, 1], got {self.utilisation_cap!r}")
        if self.placement == "central" and self.utilisation_cap != DeploymentConfig.utilisation_cap:
            raise UserError(f"{where}: utilisation_cap has no effect on placement 'central' (it gives every GPU a "
                            f"replica, by demand), got {self.utilisation_cap!r}")
        for name in ("gpu_scale", "load_gbs", "queue_timeout_s"):
            value = getattr(self, name)
            if not (is_real(value) and math.isfinite(value) and value > 0):  # NaN fails too
                raise UserError(f"{where}: {name} must be a positive number, got {value!r}")
        # (a negative init_s would make a cold start shorter than loading the weights, or negative)
        if not (is_real(self.init_s) and math.isfinite(self.init_s) and self.init_s >= 0):
            raise UserError(f"{where}: init_s must be a finite non-negative number of seconds, got {self.init_s!r}")
        from controlplane.fleet import BUDGETS, MAX_CENTRAL_SCALE, RACKS
        if self.gpu_scale > MAX_CENTRAL_SCALE:  # a fleet of millions of GPUs would take hours and all memory
            raise UserError(f"{where}: gpu_scale must be at most {MAX_CENTRAL_SCALE:g}, got {self.gpu_scale!r}")
        if self.pops is not None and (not isinstance(self.pops, list | tuple) or not self.pops
                                      or not all(isinstance(p, str) for p in self.pops)):
            raise UserError(f"{where}: pops must be a non-empty list of PoP ids, got {self.pops!r}")
        from topology.gpus import node_gpus

        if self.budget not in BUDGETS:
            raise UserError(f"{where}: budget must be one of {', '.join(BUDGETS)}, got {self.budget!r}")
        if self.rack not in RACKS:
            raise UserError(f"{where}: rack must be one of {', '.join(RACKS)}, got {self.rack!r}")
        if self.rack != "server" and self.budget != "gpus":
            raise UserError(f"{where}: rack = {self.rack!r} applies to budget = 'gpus' (a 'usd' budget buys "
                            f"{self.node} boxes)")
        try:  # the count too, here: placing finds it only mid-run, naming no file
            node_gpus(self.node)
        except ValueError as exc:
            raise UserError(f"{where}: {exc}") from None
        if isinstance(self.queue_limit, bool) or not isinstance(self.queue_limit, int) or self.queue_limit < 1:
            raise UserError(f"{where}: queue_limit must be an integer >= 1, got {self.queue_limit!r}")


@dataclass
class Deployment:
    """A control plane over a fleet, its placement, and how requests reach it.

    ``entry``: ``anycast`` (edge) or ``direct`` (central). ``ingress_col`` is the workload column the router uses
    as the ingress key (``ingress`` = PoP row for anycast, ``city`` for direct); ``access_col``/``access_ms`` give
    the per-request RTT to that entry point (the workload's ``access_rtt_ms`` for anycast; the last mile only for
    direct, the rest is in the plane's RTT matrix). ``rtt_builder(latency)`` recomputes that matrix (link faults).
    """

    name: str
    plane: ControlPlane
    fleet: Fleet
    table: pd.DataFrame | None = None  # the placement table (model, node, gpu_index, ...) the plane started from
    placement: object = None  # the controlplane.placement.Placement that made it (None when given a table)
    entry: str = "anycast"
    ingress_col: str = "ingress"
    access_col: str | None = "access_rtt_ms"
    access_ms: float = 0.0
    ingress_ids: object = None  # PoP id per ingress key (anycast), to report where requests really entered
    rtt_builder: Callable | None = None


def build_control_plane(cfg: DeploymentConfig, catalog: Catalog, fleet: Fleet, table: pd.DataFrame,
                        rtt: np.ndarray, *, perf=None, rng: np.random.Generator | None = None,
                        typical_tokens: tuple = (512, 128), scenario_start=None, day_s: float = 86_400.0,
                        prefix: PrefixIndex | None = None, adapters: AdapterIndex | None = None,
                        adapter_routing: bool = True, slots: int | None = None,
                        one_llm_per_gpu: bool | None = None) -> ControlPlane:
    """The control plane of ``cfg`` over ``table`` (model, node[, gpu_index]) on ``fleet``.

    ``prefix``/``adapters``: the router-side prefix index and adapter slots (None: that technique is off); with
    ``adapter_routing`` the configured router is wrapped in ``adapter-aware``. ``slots`` overrides every
    replica's concurrent sequences (the live gateway's ``--slots``). ``scenario_start``/``day_s`` are the clock
    of a ``scheduled`` autoscaler (its defaults unless its options say otherwise). ``one_llm_per_gpu``: the rule
    replicas loaded at run time keep (default ``cfg``'s); the placement's: a table placed by memory alone or given
    row by row is not held to it, nor are its replicas when they load again.
    """
    admission = AdmissionConfig(queue_limit=cfg.queue_limit, queue_timeout_s=cfg.queue_timeout_s,
                                load_gbs=cfg.load_gbs, init_s=cfg.init_s)
    scaler_opts = dict(cfg.autoscaler_options)
    if cfg.autoscaler == "scheduled":
        scaler_opts.setdefault("start_utc", scenario_start)
        scaler_opts.setdefault("day_s", day_s)
    plane = ControlPlane(catalog, fleet, table, rtt, router=cfg.router, router_options=cfg.router_options,
                         admission=admission, perf=perf, rng=rng,
                         autoscaler=AUTOSCALERS.create(cfg.autoscaler, options=scaler_opts),
                         typical_tokens=typical_tokens, prefix=prefix, adapters=adapters,
                         adapter_routing=adapter_routing,
                         one_llm_per_gpu=cfg.one_llm_per_gpu if one_llm_per_gpu is None else one_llm_per_gpu)
    if slots is not None:
        plane.set_slots(slots)
    return plane


def _entry(name: str, central: bool, topo, fleet: Fleet) -> dict:
    if central:
        return {"entry": "direct", "ingress_col": "city", "access_col": None, "access_ms": topo.last_mile_ms,
                "rtt_builder": lambda latency: city_site_rtt(topo, fleet, latency)}
    return {"entry": "anycast", "ingress_col": "ingress", "access_col": "access_rtt_ms",
            "ingress_ids": topo.pops.id.to_numpy(), "rtt_builder": lambda latency: ingress_site_rtt(topo, fleet, latency)}


def city_site_rtt(topo, fleet: Fleet, latency=None) -> np.ndarray:
    """Core RTT (ms) from every demand city (rows) straight to every fleet site: users reaching a cloud region."""
    latency = latency or topo.latency
    d = topo.demand
    return latency.site_rtt_matrix(d.lat.to_numpy(), d.lon.to_numpy(), fleet.sites.backbone.to_numpy())


def build_deployment(name: str, cfg: DeploymentConfig, topo, catalog: Catalog, *, perf=None,
                     demand_rps: float = 1.0, mix: dict | None = None, rng_place=None, rng_route=None,
                     typical_tokens: tuple = (512, 128), scenario_start=None, day_s: float = 86_400.0,
                     shape: dict | None = None, rtt_scale: float = 1.0, **plane_options) -> Deployment:
    """Place replicas for ``demand_rps`` with ``mix`` by ``cfg.placement`` and wrap them in a control plane.

    ``name`` ``central`` builds the central baseline (fleet from ``cfg.baseline`` x ``cfg.gpu_scale``, users
    reach it directly); any other name an edge deployment over ``cfg.pops`` (all PoPs when None).
    ``shape`` = {"prompt": {model: mean units}, "output": {model: mean tokens}} sizes replica capacity.
    ``rtt_scale`` multiplies the routing RTT matrix (a gateway injecting scaled or no WAN delay).
    ``plane_options`` go to :func:`build_control_plane` (prefix, adapters, adapter_routing, slots).
    ``mix`` None spreads the demand equally over every model of ``catalog`` (a deployment serves its catalog),
    unlike :meth:`PlacementProblem.build`, whose default is the built-in mix; an empty mix is an error.
    ``cfg`` is checked first (:meth:`DeploymentConfig.check`).
    """
    from controlplane.placement import PlacementProblem, get_policy
    from controlplane.placement.cache import cached_place
    from controlplane.placement.fill import with_idle_gpus_filled

    cfg.check(f"deployment {name!r}")
    central = name == "central"
    options = dict(cfg.placement_options)
    if central:
        options.setdefault("baseline", cfg.baseline)
        if cfg.gpu_scale != 1.0:
            options.setdefault("scale", cfg.gpu_scale)
        if cfg.placement == "central":
            options.setdefault("budget", cfg.budget)
            options.setdefault("node", cfg.node)
            options.setdefault("rack", cfg.rack)
    policy = get_policy(cfg.placement, **options)
    fleet = edge_fleet(topo, pops=list(cfg.pops)) if cfg.pops else None
    shape = shape or {}
    mix = {s.id: 1.0 for s in catalog} if mix is None else mix
    rng_place = rng_place if rng_place is not None else np.random.default_rng(0)
    one_llm = cfg.one_llm_per_gpu and not (policy.explicit or policy.memory_only)  # the rule this plan keeps
    problem = PlacementProblem.build(topo, catalog=catalog, fleet=fleet, total_rps=demand_rps, mix=mix, perf=perf,
                                     prompt_tokens=dict(shape.get("prompt", {})),
                                     output_tokens=dict(shape.get("output", {})),
                                     prompt_mix=dict(shape.get("prompt_mix", {})),
                                     utilisation_cap=cfg.utilisation_cap,
                                     one_llm_per_gpu=one_llm)
    placement = cached_place(policy, problem, rng_place)
    if cfg.fill_idle_gpus and not policy.explicit:
        placement = with_idle_gpus_filled(placement)
    fleet = placement.fleet
    entry = _entry(name, central, topo, fleet)
    # An edge fleet's matrix is the placement problem's own (same function, topology and fleet): not built twice.
    rtt = entry["rtt_builder"](topo.latency) if central else problem.rtt_for(fleet)
    if rtt_scale != 1.0:  # (x 1.0 would copy a PoPs x sites matrix, 72 MB at 3,000 PoPs, to the same values)
        rtt = rtt * rtt_scale
    # Candidate lists are built by whoever drives the plane, for the pairs it will ask for: the simulator for
    # those its workload names (``ClusterState.precompute_pairs``), the gateway for every ingress PoP.
    # Thousands of replicas at a large edge, each with its objects: a full collection over everything alive in
    # the middle of building them frees nothing (the simulator freezes all of it before its run).
    with collector_paused():
        plane = build_control_plane(cfg, catalog, fleet, placement.table, rtt, perf=perf, rng=rng_route,
                                    typical_tokens=typical_tokens, scenario_start=scenario_start, day_s=day_s,
                                    one_llm_per_gpu=one_llm, **plane_options)
    return Deployment(name, plane, fleet, table=placement.table, placement=placement, **entry)


def deployment_from_table(name: str, cfg: DeploymentConfig, topo, catalog: Catalog, pops: list[str],
                          table: pd.DataFrame, *, rng_route=None, rtt_scale: float = 1.0, perf=None,
                          **plane_options) -> Deployment:
    """An edge deployment over ``pops`` whose replicas are given by ``table`` (model, node[, gpu_index][, slots]).

    Used to mirror a running gateway in the simulator: node rows refer to ``edge_fleet(topo, pops)``.
    A ``slots`` column sets each replica's concurrent sequences.
    """
    cfg.check(f"deployment {name!r}")
    fleet = edge_fleet(topo, list(pops))
    entry = _entry(name, False, topo, fleet)
    rtt = entry["rtt_builder"](topo.latency) * rtt_scale
    plane = build_control_plane(cfg, catalog, fleet, table, rtt, perf=perf, rng=rng_route, one_llm_per_gpu=False,
                                **plane_options)
    if "slots" in table:
        for r, s in zip(plane.state.replicas, table.slots.tolist(), strict=True):
            plane.set_slots(int(s), [r])
    return Deployment(name, plane, fleet, table=table, **entry)
