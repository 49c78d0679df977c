"""Arrays shared by the evaluator and the policies for one (problem, fleet): who can host what, at what rate.

Demand is a list of *pairs* (ingress PoP, model) with positive rate. A node *fits* a model when one replica's
``bytes_per_gpu`` fits a GPU (times the memory factor) and the node has ``tensor_parallel`` GPUs. A site is
*capable* of a model when one of its nodes fits it. Each pair's *static candidates* are its ``k`` nearest capable
sites (what the optimising policies plan with); the evaluator uses the ``k`` nearest sites that actually host a
replica, a superset of the static candidates that host one.
"""

from __future__ import annotations

import copy

import numpy as np

from controlplane.fleet import Fleet
from controlplane.ordering import first_k_stable
from controlplane.perf import capacity_rps, capacity_rps_mix


class Network:
    """Capacities, fit masks, demand pairs and candidate sites of ``problem`` on ``fleet``."""

    def __init__(self, problem, fleet: Fleet):
        self.problem, self.fleet = problem, fleet
        self.models = problem.models
        self.specs = problem.specs
        self.rtt = problem.rtt_for(fleet)
        nodes = fleet.nodes
        self.n_nodes, self.n_sites, self.n_models = len(nodes), len(fleet.sites), len(self.models)
        self.node_site = nodes.site.to_numpy().astype(int)
        self.node_gpus = nodes.gpus.to_numpy().astype(int)
        self.node_gpu = nodes.gpu.to_numpy()
        self.gpu_limit = nodes.gpu_memory_gb.to_numpy() * 1e9 * problem.memory_factor  # bytes per GPU
        self.tp = np.array([s.tensor_parallel for s in self.specs])
        self.bytes_per_gpu = np.array([s.bytes_per_gpu for s in self.specs])
        self.replica_bytes = np.array([s.replica_bytes for s in self.specs])
        self.util = problem.utilisation_cap
        # Models that need a GPU's compute to themselves (see packing): generative ones, when the problem says so.
        self.exclusive = np.array([s.generative and problem.one_llm_per_gpu for s in self.specs], dtype=bool)

        self.fits = (self.gpu_limit[:, None] >= self.bytes_per_gpu[None, :]) & \
                    (self.node_gpus[:, None] >= self.tp[None, :])
        # Replicas of one model alone a node can hold: GPU "slots" of bytes_per_gpu, tp of them per replica.
        slots = np.floor(self.gpu_limit[:, None] / self.bytes_per_gpu[None, :]) * self.node_gpus[:, None]
        self.max_replicas = np.where(self.fits, np.floor(slots / self.tp[None, :]), 0).astype(int)
        self.cap = self._capacities()  # rps of one replica at 100% (nodes x models), 0 where it does not fit
        # GPU-time one rps of model m takes on node n (in GPUs busy): tp / capacity.
        with np.errstate(divide="ignore"):
            self.gpu_time_per_rps = np.where(self.cap > 0, self.tp[None, :] / np.maximum(self.cap, 1e-300), 0.0)
        self.site_capable = np.zeros((self.n_sites, self.n_models), dtype=bool)
        np.logical_or.at(self.site_capable, self.node_site, self.fits)

        d = problem.demand.to_numpy()
        self.pair_ingress, self.pair_model = np.nonzero(d)
        self.pair_demand = d[self.pair_ingress, self.pair_model]
        self.total_demand = float(self.pair_demand.sum())
        self.cand_site, self.cand_rtt = self.nearest_sites(self.site_capable, problem.candidates_k)

    def in_planning_units(self) -> Network:
        """This network, or for a trickle of demand (under 1 req/s in total) the same problem with every rate
        scaled up to 1 req/s: the policies' thresholds and the solvers' tolerances are absolute rps, and the pairs'
        rates must stand clear of them."""
        return self if self.total_demand >= 1.0 else self.rescaled(1.0 / self.total_demand)

    def rescaled(self, k: float) -> Network:
        """A copy whose rates are ``k`` times these (demand, replica capacity; GPU time per rps divided by ``k``):
        the same placement problem in other units."""
        out = copy.copy(self)
        out.pair_demand, out.total_demand = self.pair_demand * k, self.total_demand * k
        out.cap, out.gpu_time_per_rps = self.cap * k, self.gpu_time_per_rps / k
        return out

    def _capacities(self) -> np.ndarray:
        p = self.problem
        out = np.zeros((self.n_nodes, self.n_models))
        for gpu in np.unique(self.node_gpu):
            rows = self.node_gpu == gpu
            for m, spec in enumerate(self.specs):
                mix = p.prompt_mix.get(spec.id)
                rate = (capacity_rps_mix(p.perf, spec, gpu, mix, p.output_tokens[spec.id]) if mix
                        else capacity_rps(p.perf, spec, gpu, p.prompt_tokens[spec.id], p.output_tokens[spec.id]))
                out[rows, m] = np.where(self.fits[rows, m], rate, 0.0)
        return out

    def nearest_sites(self, mask: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Per pair, the ``k`` nearest sites where ``mask[site, model]`` holds (padded with -1 / inf), by RTT."""
        k = int(min(k, self.n_sites))
        site = np.full((len(self.pair_demand), k), -1, dtype=int)
        rtt = np.full((len(self.pair_demand), k), np.inf)
        # Models allowed at the same sites (most of them, when every GPU fits them) share one partial sort of the
        # ingress rows their pairs need: thousands of rows per model at thousands of PoPs.
        groups: dict[bytes, list[int]] = {}
        for m in range(self.n_models):
            groups.setdefault(mask[:, m].tobytes(), []).append(m)
        for models in groups.values():
            pairs = np.flatnonzero(np.isin(self.pair_model, models))
            allowed = np.flatnonzero(mask[:, models[0]])
            if len(pairs) == 0 or len(allowed) == 0:
                continue
            rows, row_of = np.unique(self.pair_ingress[pairs], return_inverse=True)
            sub = self.rtt[np.ix_(rows, allowed)]
            kk = min(k, len(allowed))
            order = first_k_stable(sub, kk)  # (rtt, site) order: ties resolve to the lower site index
            site[pairs, :kk] = allowed[order][row_of]
            rtt[pairs, :kk] = np.take_along_axis(sub, order, axis=1)[row_of]
        return site, rtt

    def site_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Identical nodes of a site (same GPU type and count) grouped: (group of each node, first node per group).

        The ILP decides replica counts per group; packing spreads them over the group's nodes.
        """
        keys = [f"{s}|{g}|{n}" for s, g, n in zip(self.node_site, self.node_gpu, self.node_gpus, strict=True)]
        _, first, group = np.unique(np.array(keys), return_index=True, return_inverse=True)
        order = np.argsort(first)  # number groups in node order
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return rank[group], first[order]

