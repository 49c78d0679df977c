"""edgepop topology: PoPs, GPU nodes, cloud regions, user demand and the WAN latency model (docs/topology.md).

Public API::

    from topology import Topology, core_rtt_ms
    topo = Topology.load()                      # shipped PoPs, GPUs, regions, demand
    core_rtt_ms(51.5, -0.1, 40.7, -74.0)        # London - New York, data centre to data centre (ms)
    topo.user_pop_rtt(lat, lon)                 # users x PoPs matrix with last mile
    topo.ingress(lat, lon)                      # anycast ingress PoP per user

Reading guide (start at :mod:`topology.world`: ``Topology``, the world an experiment runs in):

* what is where: :mod:`topology.pops` (PoP cities and their tiers), :mod:`topology.gpus` (GPU types and the
  nodes each PoP holds), :mod:`topology.regions` (cloud regions and the baseline sets), :mod:`topology.demand`
  (demand cities and the diurnal curve); every table read through :mod:`topology.tables` (validated CSV
  loading);
* latency: :mod:`topology.geo` (geodesy and constants), :mod:`topology.backbone` (the graph: nodes and links),
  :mod:`topology.latency` (the model over it),
  :mod:`topology.borders` (borders no terrestrial link crosses), :mod:`topology.last_mile` (the access network's
  round trip), :mod:`topology.jitter` (per-request RTT variability), :mod:`topology.rtt_cache` (derived RTT
  matrices cached in memory and on disk; every disk cache's folder and atomic writes: :mod:`topology.cache_files`);
* its fit: :mod:`topology.rtt_sets` (the measured RTT sets), :mod:`topology.calibration` (the fit and its
  cross-validation), :mod:`topology.wan_fidelity` (the tables ``edgepop validate`` prints);
* :mod:`topology.report` (summaries and the map) and :mod:`topology.cli` (``edgepop topology``).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topology.demand import demand_rates, diurnal_factor, load_demand_points, local_hour
    from topology.geo import FIBRE_KM_PER_MS, fibre_rtt_ms, haversine_km
    from topology.gpus import build_nodes, load_gpus
    from topology.latency import LatencyModel, LatencyParams, build_backbone, core_rtt_ms, default_model
    from topology.pops import load_pops, load_tiers
    from topology.regions import BASELINE_SETS, baseline, load_regions
    from topology.world import Topology

# The public names are imported on first use (PEP 562): ``import topology.cli`` (to build ``edgepop --help``) or
# ``from topology import geo`` need not load the world's tables, pandas and scipy first.
_EXPORTS = {
    "BASELINE_SETS": "topology.regions",
    "FIBRE_KM_PER_MS": "topology.geo",
    "LatencyModel": "topology.latency",
    "LatencyParams": "topology.latency",
    "Topology": "topology.world",
    "baseline": "topology.regions",
    "build_backbone": "topology.latency",
    "build_nodes": "topology.gpus",
    "core_rtt_ms": "topology.latency",
    "default_model": "topology.latency",
    "demand_rates": "topology.demand",
    "diurnal_factor": "topology.demand",
    "fibre_rtt_ms": "topology.geo",
    "haversine_km": "topology.geo",
    "load_demand_points": "topology.demand",
    "load_gpus": "topology.gpus",
    "load_pops": "topology.pops",
    "load_regions": "topology.regions",
    "load_tiers": "topology.pops",
    "local_hour": "topology.demand",
}

__all__ = [
    "BASELINE_SETS", "FIBRE_KM_PER_MS", "LatencyModel", "LatencyParams", "Topology", "baseline", "build_backbone",
    "build_nodes", "core_rtt_ms", "default_model", "demand_rates", "diurnal_factor", "fibre_rtt_ms",
    "haversine_km", "load_demand_points", "load_gpus", "load_pops", "load_regions", "load_tiers", "local_hour",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

