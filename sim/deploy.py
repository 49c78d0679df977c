"""Build the edge and central deployments of a scenario: fleet, placement, control plane, request entry."""

from __future__ import annotations

import numpy as np

from controlplane.autoscale import make_autoscaler
from controlplane.fleet import Fleet, ingress_site_rtt
from controlplane.plane import AdmissionConfig, ControlPlane
from sim.scenario import DeploymentConfig
from sim.simulator import Deployment


def city_site_rtt(topo, fleet: Fleet, latency=None) -> np.ndarray:
    """Core RTT (ms) from every demand city (rows) straight to every fleet site: users reaching a cloud region."""
    latency = latency or topo.latency
    d = topo.demand
    return latency.site_rtt_matrix(d.lat.to_numpy(), d.lon.to_numpy(), fleet.sites.backbone.to_numpy())


def edge_rtt_builder(topo, fleet):
    return lambda latency: ingress_site_rtt(topo, fleet, latency)


def central_rtt_builder(topo, fleet):
    return lambda latency: city_site_rtt(topo, fleet, latency)


def build_deployment(name: str, cfg: DeploymentConfig, topo, catalog, perf, demand_rps: float, mix: dict,
                     rng_place: np.random.Generator, rng_route: np.random.Generator, typical_tokens=(1000, 130),
                     scenario_start=None, day_s: float = 86_400.0, shape: dict | None = None):
    """Place models for ``demand_rps`` with ``mix`` and wrap the result in a control plane.

    ``shape`` = {"prompt": {model: mean units}, "output": {model: mean tokens}} sizes replica capacity.
    Returns (Deployment, Placement, rtt_builder). The edge routes by anycast ingress PoP (access RTT from the
    workload); central deployments are reached directly from each user's city (last mile + core RTT).
    """
    from controlplane.fleet import edge_fleet
    from controlplane.placement import PlacementProblem, get_policy

    options = dict(cfg.placement_options)
    if name == "central":
        options.setdefault("baseline", cfg.baseline)
        if cfg.gpu_scale != 1.0:
            options.setdefault("scale", cfg.gpu_scale)
    policy = get_policy(cfg.placement, **options)
    fleet = edge_fleet(topo, pops=cfg.pops) if cfg.pops else None
    shape = shape or {}
    problem = PlacementProblem.build(topo, catalog=catalog, fleet=fleet, total_rps=demand_rps, mix=mix, perf=perf,
                                     prompt_tokens=dict(shape.get("prompt", {})),
                                     output_tokens=dict(shape.get("output", {})))
    placement = policy.place(problem, rng_place)
    fleet = placement.fleet
    central = name == "central"
    rtt_builder = central_rtt_builder(topo, fleet) if central else edge_rtt_builder(topo, fleet)
    admission = AdmissionConfig(queue_limit=cfg.queue_limit, queue_timeout_s=cfg.queue_timeout_s,
                                load_gbs=cfg.load_gbs, init_s=cfg.init_s)
    scaler_opts = dict(cfg.autoscaler_options)
    if cfg.autoscaler == "scheduled":
        scaler_opts.setdefault("start_utc", scenario_start)
        scaler_opts.setdefault("day_s", day_s)
    plane = ControlPlane(catalog, fleet, placement.table, rtt_builder(topo.latency), router=cfg.router,
                         router_options=cfg.router_options, admission=admission, perf=perf, rng=rng_route,
                         autoscaler=make_autoscaler(cfg.autoscaler, **scaler_opts), typical_tokens=typical_tokens)
    if central:
        dep = Deployment("central", plane, fleet, ingress_col="city", access_col=None, access_ms=topo.last_mile_ms)
    else:
        dep = Deployment("edge", plane, fleet, ingress_col="ingress", access_col="access_rtt_ms",
                         ingress_ids=topo.pops.id.to_numpy())
    return dep, placement, rtt_builder
