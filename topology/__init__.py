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
* latency: :mod:`topology.geo` (geodesy and constants), :mod:`topology.latency` (the backbone model),
  :mod:`topology.borders` (borders no terrestrial link crosses), :mod:`topology.last_mile` (the access network's
  round trip), :mod:`topology.jitter` (per-request RTT variability), :mod:`topology.rtt_cache` (derived RTT
  matrices cached in memory and on disk);
* its fit: :mod:`topology.rtt_sets` (the measured RTT sets), :mod:`topology.calibration` (the fit and its
  cross-validation), :mod:`topology.wan_fidelity` (the tables ``edgepop validate`` prints);
* :mod:`topology.report` (summaries and the map) and :mod:`topology.cli` (``edgepop topology``).
"""

from topology.demand import demand_rates, diurnal_factor, load_demand_points, local_hour
from topology.geo import FIBRE_KM_PER_MS, fibre_rtt_ms, haversine_km
from topology.gpus import build_nodes, load_gpus
from topology.latency import LatencyModel, LatencyParams, build_backbone, core_rtt_ms, default_model
from topology.pops import load_pops, load_tiers
from topology.regions import BASELINE_SETS, baseline, load_regions
from topology.world import Topology

__all__ = [
    "BASELINE_SETS", "FIBRE_KM_PER_MS", "LatencyModel", "LatencyParams", "Topology", "baseline", "build_backbone",
    "build_nodes", "core_rtt_ms", "default_model", "demand_rates", "diurnal_factor", "fibre_rtt_ms",
    "haversine_km", "load_demand_points", "load_gpus", "load_pops", "load_regions", "load_tiers", "local_hour",
]
