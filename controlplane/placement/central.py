"""``central``: a cloud baseline with the edge's budget in a few regions, every GPU serving, capacity matched to demand.

The fleet is :func:`controlplane.fleet.central_fleet` of the problem's fleet: equal GPUs (the same GPUs of each type,
split between the regions by their users' demand) or equal dollars per hour (``budget = "usd"``: standard cloud
boxes bought for the same $/hour, split the same way). Each (ingress, model) pair's demand is assigned to its
nearest region able to host the model. Each region then

1. places one replica of every model its users ask for (largest per-GPU footprint first): a generative model, or
   one whose demand needs a GPU's compute or more, gets GPUs of its own; a light encoder shares a GPU with room;
2. gives every GPU still idle a replica by water-filling (:func:`controlplane.placement.fill.fill_idle_gpus`):
   the next replica goes to the model with the highest demand per unit of placed capacity in the region, so each
   model's share of the region's GPUs follows its share of the region's demand.

So central replicates each model across its regions' GPUs as a cloud operator would, and owns no idle GPU while
its users' requests queue (the equal-capacity rule every deployment follows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.fleet import BUDGETS, MAX_CENTRAL_SCALE, RACKS, central_fleet
from controlplane.placement.base import PLACEMENTS, PlacementError, PlacementPolicy, PlacementProblem
from controlplane.placement.fill import fill_idle_gpus, idle_gpus, place_on
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement
from edgepop.errors import UserError, is_real
from topology.gpus import node_gpus


@PLACEMENTS.register("central")
@dataclass
class Central(PlacementPolicy):
    """Options: ``baseline``: a named region set (``us-east``, ``big3``, ``global-6``, ``global-12``) or
    comma-separated ids; ``scale``: central's budget relative to the problem's fleet (1.0 = the same, 0.5 = half);
    ``budget``: ``gpus`` (equal GPUs of each type, split between the regions by demand) or ``usd`` (equal dollars
    per hour, spent on ``node`` boxes, e.g. ``H100x8``); ``rack``: equal GPUs in 8-GPU servers (``server``) or in
    servers the size of the edge's nodes (``edge``); ``keep_groups``: a region's first replica of a model goes to
    a node where it leaves the idle GPU group a larger tensor-parallel model of the region needs (false: to the most
    idle of the fastest nodes, the rule switched off, to measure what it buys); ``without_gpus``: comma-separated
    GPU types of the edge's fleet left out of central's budget (an ablation: central then has fewer GPUs than the edge,
    or with ``budget = "usd"`` fewer dollars)."""

    baseline: str = "global-6"
    scale: float = 1.0
    budget: str = "gpus"
    node: str = "H100x8"
    rack: str = "server"
    keep_groups: bool = True
    without_gpus: str = ""
    own_fleet = True  # class attribute, not an option: the regions' fleet is built per call

    @staticmethod
    def check_options(baseline: str = "global-6", scale: float = 1.0, budget: str = "gpus", node: str = "H100x8",
                      rack: str = "server", keep_groups: bool = True, without_gpus: str = "") -> None:
        """The options' values (the registry calls it when a scenario is read; :meth:`place` again). The baseline's
        regions and the node's GPU type are checked against the topology when it places (``baseline`` reads them)."""
        if not is_real(scale) or not 0 < scale <= MAX_CENTRAL_SCALE:  # (NaN fails)
            raise ValueError(f"scale must be positive and at most {MAX_CENTRAL_SCALE:g}, got {scale!r}")
        if budget not in BUDGETS:
            raise ValueError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
        if rack not in RACKS:
            raise ValueError(f"rack must be one of {', '.join(RACKS)}, got {rack!r}")
        if rack != "server" and budget != "gpus":
            raise ValueError(f"rack {rack!r} applies to budget 'gpus', not {budget!r}")
        node_gpus(node)  # checked whatever the budget: a typo is one
        if not isinstance(keep_groups, bool | np.bool_):
            raise ValueError(f"keep_groups must be true or false, got {keep_groups!r}")
        if not isinstance(without_gpus, str):
            raise ValueError(f"without_gpus must be a string of comma-separated GPU types, got {without_gpus!r}")

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        try:
            self.check_options(self.baseline, self.scale, self.budget, self.node, self.rack, self.keep_groups,
                               self.without_gpus)
            like = problem.fleet.without_gpus(self.without_gpus)
        except (ValueError, UserError) as exc:
            raise PlacementError(f"central placement: {exc}") from None
        fleet = central_fleet(problem.topo, self.baseline, like=like, scale=self.scale,
                              budget=self.budget, node=self.node, rack=self.rack)
        net = problem.network(fleet)
        need = np.zeros((net.n_sites, net.n_models))
        np.add.at(need, (net.cand_site[:, 0], net.pair_model), net.pair_demand)
        placed = self._plan(net, need, every_model_first=False, keep_groups=self.keep_groups)
        demanded = set(np.flatnonzero(need.sum(axis=0) > 0).tolist())
        if demanded - {m for _, m, _ in placed}:
            # The regions' GPUs went to their biggest models before a small one had a replica anywhere (a few
            # GPUs in each region): plan again, one replica of every model first, where most of its demand is.
            placed = self._plan(net, need, every_model_first=True, keep_groups=self.keep_groups)
        # the option the budget used: the rack of equal GPUs, the box bought with equal dollars
        used = {"rack": self.rack} if self.budget == "gpus" else {"node": self.node}
        if not self.keep_groups:  # the ablations are named only when on, so the default's report is unchanged
            used["keep_groups"] = False
        if self.without_gpus.strip():
            used["without_gpus"] = self.without_gpus
        return Placement(problem, fleet, self.name, placed,
                         solver={"baseline": self.baseline, "budget": self.budget, "scale": self.scale, **used})

    def _plan(self, net, need: np.ndarray, every_model_first: bool, keep_groups: bool = True) -> list:
        """Cover each region's models (largest per-GPU footprint first), after one replica of every demanded
        model in the region with most of its demand that can hold it when ``every_model_first``; then fill.
        ``keep_groups``: the first replicas' rule that leaves idle GPU groups for tensor-parallel models."""
        ledger = GpuLedger(net)
        placed: list = []
        order = sorted(range(net.n_models), key=lambda m: (-net.bytes_per_gpu[m], -net.tp[m], m))
        members = [np.flatnonzero(net.node_site == site) for site in range(net.n_sites)]
        if every_model_first:
            for m in order:
                if need[:, m].sum() <= 0:
                    continue
                for site in np.argsort(-need[:, m], kind="stable").tolist():
                    before = len(placed)
                    self._cover(net, ledger, members[site], m, need[site], placed, keep_groups)
                    if len(placed) > before:
                        break
        for site in range(net.n_sites):
            held = {m for n, m, _ in placed if net.node_site[n] == site}
            for m in order:
                if need[site, m] > 0 and m not in held:
                    self._cover(net, ledger, members[site], m, need[site], placed, keep_groups)
        fill_idle_gpus(net, ledger, placed, [(np.array([s]), need[s]) for s in range(net.n_sites)])
        return placed

    @staticmethod
    def _cover(net, ledger: GpuLedger, members: np.ndarray, m: int, need: np.ndarray, placed: list,
               keep_groups: bool = True) -> None:
        """The region's first replica of ``m`` (``need``: the region's demand, rps per model): on idle GPUs of the
        fastest node when its demand needs at least one GPU's compute or is a generative model, else sharing the
        GPU with the most room (an encoder next to a chat model). Among the fastest nodes, one where it would not
        take the node's last idle GPU group a multi-GPU model the region wants could use: in two-GPU servers, each
        small model alone in a pair would leave the region no pair for its tensor-parallel model (two share one).
        Without ``keep_groups``, the most idle of the fastest nodes."""
        fits = members[net.fits[members, m]]
        if fits.size == 0:
            return  # no node of the region can hold it: its demand goes to the next region (routing)
        idle = idle_gpus(ledger)
        if net.specs[m].generative or need[m] * net.gpu_time_per_rps[fits, m].min() >= 1.0:
            free = [int(n) for n in fits if len(idle[int(n)]) >= net.tp[m]]
            if free:
                tp = int(net.tp[m])
                multi = np.flatnonzero((need > 0) & (net.tp > tp)).tolist()

                def keeps_groups(n: int) -> bool:
                    if not keep_groups:
                        return True
                    return not any(net.fits[n, k] and len(idle[n]) >= net.tp[k] > len(idle[n]) - tp for k in multi)

                node = max(free, key=lambda n: (net.cap[n, m], keeps_groups(n), len(idle[n]), -n))
                placed.append((node, m, place_on(ledger, node, m, tuple(int(g) for g in idle[node][:net.tp[m]]))))
                return
        best, limit = None, net.gpu_limit
        for n in (int(x) for x in fits):
            if net.tp[m] > 1:
                gpus = ledger.slot(n, m)
                key = None if gpus is None else (0, min(ledger.free[n][list(gpus)]), net.cap[n, m], -n)
            else:  # one GPU: a busy one with the most room, an idle one only when no busy one has room
                free = ledger.free[n]
                room = np.flatnonzero((free >= net.bytes_per_gpu[m] - 1.0) & ~(net.exclusive[m] & ledger.solo[n]))
                if room.size == 0:
                    continue
                shared = room[free[room] < limit[n] - 1.0]
                g = int(shared[np.argmax(free[shared])]) if shared.size else int(room[0])
                gpus, key = (g,), (int(shared.size > 0), free[g], net.cap[n, m], -n)
            if key is not None and (best is None or key > best[0]):
                best = (key, n, gpus)
        if best is not None:
            _, node, gpus = best
            placed.append((node, m, place_on(ledger, node, m, tuple(gpus))))
