"""``ilp``: minimise the evaluator's objective with a mixed-integer program (scipy.optimize.milp / HiGHS).

The MILP (:mod:`controlplane.placement.ilp_model`) plans with each pair's ``candidates_k`` nearest capable sites
and one integer count per (node group, model). The solve runs in three steps within ``time_limit_s``:

1. the LP relaxation, whose optimum is a lower bound on every plan of the MILP;
2. a starting plan: the relaxation's counts rounded (fractional counts rounded up in decreasing fraction while
   the replica still fits the group's GPUs, down otherwise), or another policy's plan (``warm_start``);
3. HiGHS branch-and-bound from that start (passed as a MIP start through the ``read_solution_file`` option,
   which scipy hands to HiGHS verbatim): over the whole MILP when it has at most ``exact_max_integers`` integer
   variables (small problems are solved to proven optimality), otherwise over the relaxation's neighbourhood —
   every count between the floor and the ceiling of its relaxed value (RENS, a standard MIP heuristic).

The result reports the mode, HiGHS status, the lower bound and the gap. Counts are packed per GPU (first-fit
decreasing, exact re-seating on small nodes, other nodes of the site as fallback); a replica that still fits
nowhere (the MILP checks memory per group, not per GPU) is dropped and listed in ``Placement.dropped``.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, milp

from controlplane.placement.base import PlacementPolicy, PlacementProblem, get_policy, register_policy
from controlplane.placement.ilp_model import IlpModel
from controlplane.placement.packing import pack_groups
from controlplane.placement.result import Placement
from edgepop.errors import UserError


@register_policy("ilp")
@dataclass
class IlpPlacement(PlacementPolicy):
    """Options: ``candidates_k`` (static candidate sites per pair, capped by the problem's), ``time_limit_s``
    (whole policy), ``mip_rel_gap`` (HiGHS stops at this relative gap), ``memory_tiebreak_ms_per_gb``,
    ``warm_start`` (``"rounding"``, a policy name, or ``"none"``), ``exact_max_integers``, ``verbose``."""

    candidates_k: int = 8
    time_limit_s: float = 10.0
    mip_rel_gap: float = 0.01
    memory_tiebreak_ms_per_gb: float = 1e-8
    warm_start: str = "greedy-demand"
    exact_max_integers: int = 2000
    verbose: bool = False

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        if self.time_limit_s <= 0 or self.mip_rel_gap < 0 or self.candidates_k < 1:
            raise UserError("ilp options: time_limit_s must be positive, mip_rel_gap non-negative, candidates_k >= 1")
        if self.warm_start == self.name:
            raise UserError("ilp option warm_start cannot be 'ilp' itself")
        t0 = time.perf_counter()
        net = problem.network()
        seeded = None  # the warm-start policy's plan, already scored by the evaluator
        if self.warm_start not in ("rounding", "none"):
            seeded = get_policy(self.warm_start).place(problem, rng)
        extra = None
        if seeded is not None:  # make sure the MILP has a unit for every replica of the seeded plan
            group_of, first = net.site_groups()
            extra = np.zeros((len(first), net.n_models), dtype=bool)
            np.logical_or.at(extra, group_of, seeded.counts > 0)
        k = min(int(self.candidates_k), problem.candidates_k)
        model = IlpModel(net, k, self.memory_tiebreak_ms_per_gb, extra)
        t_lp = time.perf_counter()
        relaxed = model.relaxation()
        reserve = time.perf_counter() - t_lp  # scoring the MILP's plan afterwards costs about one such LP
        if relaxed.status != 0:
            raise UserError(f"ilp placement: the LP relaxation failed ({relaxed.message})")
        c_relaxed = relaxed.x[model.prog.n:]
        starts = {}  # name -> counts per unit
        if self.warm_start != "none":
            starts["rounding"] = round_relaxation(model, c_relaxed)
        if seeded is not None:
            starts[self.warm_start] = model.unit_counts(seeded.counts)
        completed = {name: model.complete(c) for name, c in starts.items()}
        completed = {name: x for name, x in completed.items() if x is not None}
        x0 = min(completed.values(), key=lambda x: model.cost @ x, default=None)
        n_int = len(model.unit_group)
        mode = "exact" if n_int <= self.exact_max_integers else "rens"
        lower, upper = np.zeros(model.n), model.upper.copy()
        if mode == "rens":  # counts between floor and ceiling of the relaxation, widened to hold the starts
            lower[model.prog.n:] = np.minimum.reduce([np.floor(c_relaxed + 1e-6), *starts.values()])
            upper[model.prog.n:] = np.maximum.reduce([np.ceil(c_relaxed - 1e-6), *starts.values()])
        prep_s = time.perf_counter() - t0
        left = self.time_limit_s - prep_s - reserve
        res, status = None, "no time left for branch-and-bound"
        if left > 0.2:
            res = self._solve(model, lower, upper, x0, left)
            status = {0: "optimal", 1: "time limit"}.get(res.status, res.message)
        bound = float(relaxed.fun)
        if mode == "exact" and res is not None and res.mip_dual_bound is not None and res.status == 0:
            bound = max(bound, float(res.mip_dual_bound))
        solver = {"mode": mode, "status": status, "warm_start": self.warm_start, "lower_bound_ms": round(bound, 6),
                  "start_objectives_ms": {n: round(float(model.cost @ x), 6) for n, x in completed.items()},
                  "prepare_s": round(prep_s, 3), "variables": int(model.n), "integers": n_int,
                  "constraints": int(model.A.shape[0]), "candidates_k": k}
        # The MILP plans with static candidate sites; the evaluator routes to the k nearest replicas. A plan
        # the MILP ranks higher can score lower there (more so when branch-and-bound stopped early): every
        # candidate plan is scored by the evaluator and the best one is returned.
        plans = [(n, completed[n]) for n in completed if n != self.warm_start]
        if res is not None and res.x is not None:
            plans.append(("milp", res.x))
        best = seeded
        if best is not None:  # the seeded plan as this policy's answer, unless a better one turns up
            best.policy, best.solver = self.name, dict(solver, plan=self.warm_start)
        for name, x in plans:
            found = float(model.cost @ x)
            placement = self._placement(problem, model, x, dict(
                solver, plan=name, ilp_objective_ms=round(found, 6), milp_gap=round(max(0.0, 1 - bound / found), 6)))
            if best is None or placement.objective_ms < best.objective_ms - 1e-9:
                best = placement
        if best is None:
            raise UserError(f"ilp placement found no plan within {self.time_limit_s:g} s; raise the time limit")
        best.solver["solve_s"] = round(time.perf_counter() - t0, 3)
        return best

    def _solve(self, model: IlpModel, lower: np.ndarray, upper: np.ndarray, x0: np.ndarray | None, seconds: float):
        opts = {"time_limit": float(seconds), "mip_rel_gap": float(self.mip_rel_gap), "disp": bool(self.verbose)}
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            # scipy passes options it does not know to HiGHS verbatim, and warns that it does.
            warnings.simplefilter("ignore", RuntimeWarning)
            if x0 is not None:
                start = Path(tmp) / "start.sol"
                model.write_start(x0, start)
                opts["read_solution_file"] = str(start)
            return milp(model.cost, constraints=model.constraints, integrality=model.integrality,
                        bounds=Bounds(lower, upper), options=opts)

    def _placement(self, problem, model: IlpModel, x: np.ndarray, solver: dict) -> Placement:
        net = model.net
        ledger, dropped = pack_groups(net, model.groups, model.group_counts(x[model.prog.n:]),
                                      fallback=model.site_nodes)
        sites = problem.fleet.sites.site_id.to_numpy()
        dropped = [(sites[model.g_site[g]], net.node_gpu[model.first[g]], net.models[m]) for g, m in dropped]
        return Placement(problem, problem.fleet, self.name, ledger.placements(), dropped, solver)


def round_relaxation(model: IlpModel, c_relaxed: np.ndarray) -> np.ndarray:
    """Integer counts per unit from relaxed ones: floors packed onto the GPUs, then fractional counts rounded
    up (largest fraction first) wherever the replica still fits a node of its group; every demanded model
    gets at least one replica where one fits (largest relaxed count first)."""
    net = model.net
    floor = np.floor(c_relaxed + 1e-6)
    ledger, dropped = pack_groups(net, model.groups, model.group_counts(floor))
    c = floor.copy()
    for g, m in dropped:
        c[model.unit_index[g, m]] -= 1
    ceiling = model.upper[model.prog.n:]

    def add(u: int) -> bool:
        members = model.groups[model.unit_group[u]]
        ranked = members[np.argsort(ledger.busy[members] / net.node_gpus[members], kind="stable")]
        if c[u] + 1 <= ceiling[u] and any(ledger.add_repacking(int(n), int(model.unit_model[u])) for n in ranked):
            c[u] += 1
            return True
        return False

    frac = c_relaxed - c
    for u in np.argsort(-frac, kind="stable"):
        if frac[u] <= 1e-6:
            break
        add(int(u))
    for m in range(net.n_models):
        units = np.flatnonzero(model.unit_model == m)
        if c[units].sum() == 0:
            for u in units[np.argsort(-c_relaxed[units], kind="stable")]:
                if add(int(u)):
                    break
    return c
