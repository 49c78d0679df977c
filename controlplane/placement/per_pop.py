"""``per-pop``: one replica of every model at every PoP of the fleet (or at the PoPs listed for it).

A fixed, explicit deployment rather than a plan for a demand: what the live gateway serves by default (a handful
of emulated PoPs, each holding every served model) and what a scenario names when the simulator must mirror such a
gateway exactly. Each replica goes on the first node of its PoP with room for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controlplane.placement.base import PLACEMENTS, PlacementError, PlacementPolicy, PlacementProblem
from controlplane.placement.packing import GpuLedger
from controlplane.placement.result import Placement


@PLACEMENTS.register("per-pop")
@dataclass
class PerPop(PlacementPolicy):
    """Options: ``pops``: model id -> the PoP ids that hold it, one replica each (default: every PoP of the fleet
    where it fits; a PoP listed for a model that has no node with room for it is an error, and so are an empty
    list and a PoP listed twice for one model)."""

    pops: dict = field(default_factory=dict)
    explicit = True  # class attribute, not an option: a fixed deployment, kept as named

    @staticmethod
    def check_options(pops: dict | None = None) -> None:
        """The option's shape (the registry calls it when a scenario is read; the PoPs are checked against the
        fleet when it is placed)."""
        if pops is None:
            return
        if not isinstance(pops, dict):
            raise ValueError(f"pops must be a table of model id = [PoP ids], got {pops!r}")
        for model, wanted in pops.items():
            if not isinstance(wanted, list) or not all(isinstance(p, str) for p in wanted):
                raise ValueError(f"pops.{model} must be a list of PoP ids, got {wanted!r}")
            if not wanted:  # (it would place no replica of a model that is served)
                raise ValueError(f"pops.{model} is empty: list the PoPs that hold it, or leave it out to place it "
                                 "at every PoP")
            twice = sorted({p for p in wanted if wanted.count(p) > 1})
            if twice:  # one replica per listed PoP: a repeat is a slip, not a replica count
                raise ValueError(f"pops.{model} names PoP(s) {', '.join(twice)} more than once")

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        try:
            self.check_options(self.pops)
        except ValueError as exc:
            raise PlacementError(f"per-pop placement: {exc}") from None
        net = problem.network()
        ledger = GpuLedger(net)
        fleet = problem.fleet
        sites = fleet.sites.site_id.tolist()
        node_site = fleet.nodes.site_id.to_numpy()
        stray = sorted(set(self.pops) - set(problem.models))
        if stray:
            raise PlacementError(f"per-pop placement: pops names model(s) {', '.join(stray)} that are not served")
        placed = []
        for m, model in enumerate(problem.models):
            listed = model in self.pops
            wanted = self.pops.get(model, sites)  # (its shape checked above)
            missing = sorted(set(wanted) - set(sites))
            if missing:
                shown = ", ".join(sites[:12]) + (f", ... ({len(sites)} in all)" if len(sites) > 12 else "")
                raise PlacementError(f"per-pop placement: {model!r} names PoP(s) {', '.join(missing)} that are not "
                                     f"among the served pops ({shown})")
            for pop in wanted:
                for node in np.flatnonzero(node_site == pop).tolist():
                    gpus = ledger.add(node, m)
                    if gpus is not None:
                        placed.append((node, m, gpus))
                        break
                else:
                    if not listed:
                        continue
                    raise PlacementError(f"per-pop placement: {model!r} does not fit on any GPU node of PoP {pop!r}")
        return Placement(problem, fleet, self.name, placed)
