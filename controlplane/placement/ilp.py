"""``ilp``: minimise the evaluator's objective with a mixed-integer program (scipy.optimize.milp / HiGHS).

The MILP (:mod:`controlplane.placement.ilp_model`) plans with each pair's ``candidates_k`` nearest capable sites
and one integer count per (node group, model). Within ``time_limit_s`` the policy runs:

1. the ``warm_start`` policy (greedy-demand by default), then the LP relaxation, whose optimum is a lower bound
   on every plan of the MILP (each in a child process stopped by the clock, below);
2. starting plans: the relaxation's counts rounded (fractional counts rounded up, largest fraction first, while
   the replica still fits its group's GPUs) and the warm-start plan; the one the MILP prices lowest is passed
   to HiGHS as a MIP start (through the ``read_solution_file`` option, which scipy hands to HiGHS verbatim);
3. branch-and-bound: on large problems (more than ``exact_max_integers`` integers) first a third of the node
   budget on the relaxation's neighbourhood (every count between the floor and ceiling of its relaxed value,
   widened to hold the starts: RENS, a standard MIP heuristic), then the full MILP from the best plan so far;
   small problems go straight to the full MILP, solved to optimality within HiGHS's relative gap ``mip_rel_gap``.

Every candidate plan (starts and the MILP's) is scored by the shared evaluator and the best is returned (memory
decides only among plans within :data:`EQUAL_OBJECTIVE_REL` of the best objective), with the phases, the lower
bound (never above a known plan's MILP cost) and the MILP gap in ``Placement.solver``. Counts are packed per GPU (first-fit
decreasing, exact re-seating on small nodes, other nodes of the site as fallback); a replica that still fits
nowhere is dropped and listed in ``Placement.dropped`` (the MILP's per-GPU packing cuts make this rare).

Reproducibility: branch-and-bound stops at ``node_limit`` nodes, a deterministic amount of work, so the same
problem gives the same plan on any machine, process pool or Ray worker. ``time_limit_s`` bounds the whole policy,
warm start included, as a safety net: each step that can take long runs in a child process that is stopped at its
deadline (:mod:`controlplane.placement.deadline`, on Linux; elsewhere, and in a daemonic process, those steps run
to their end and only HiGHS's own limit holds):

- the warm start, with its plan's scoring, by half the budget (:data:`WARM_START_SHARE`: the relaxation, which
  every other plan needs, keeps the rest); stopped, it is left out (``rng`` as it was) and the rounded relaxation
  remains. One that finishes hands back the state it left ``rng`` in: later draws are as had it run here;
- the LP relaxation with its starts (rounded, completed and the rounded plan scored there) by the end of the
  budget; stopped, the warm start's plan is returned, or without one a one-line error asks for a longer limit;
- each HiGHS call half a second after the branch-and-bound deadline, which keeps 1.5 x the relaxation's time for
  scoring the MILP's plan (HiGHS reads its own time limit only between phases); the best plan so far is kept.

Only building the MILP (a tenth of a second at 339 PoPs) and scoring the MILP's plan run unstopped, so the policy
ends within a second of its limit (``solve_s`` reports it). A stopped step says so (``warm_start_status``,
``relaxation_status``: ``stopped_at_deadline``; a phase's ``stopped_at_deadline``), and when the clock stopped a
step or left one out, ``solver["deterministic"]`` is False: the result may depend on machine speed (raise the
limit, or lower ``node_limit``).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controlplane.placement.base import (
    PLACEMENTS,
    InfeasiblePlacementError,
    PlacementError,
    PlacementPolicy,
    PlacementProblem,
    get_policy,
)
from controlplane.placement.deadline import call_with_deadline
from controlplane.placement.ilp_model import IlpModel
from controlplane.placement.packing import pack_groups
from controlplane.placement.result import Placement
from edgepop.errors import UserError

# How long after its time limit a HiGHS call may still return before it is stopped: HiGHS normally returns within
# a few tenths of a second of its limit; the rest of the policy's budget is kept for scoring the plans.
DEADLINE_GRACE_S = 0.5


MAX_TIME_LIMIT_S = 86_400.0  # a day: a longer limit is no limit, and the solver's clock overflows on inf

# The warm start may use this share of the budget: the LP relaxation, which every other plan needs, keeps the rest.
WARM_START_SHARE = 0.5
STOPPED = "stopped_at_deadline"  # a step's status when the clock stopped it
# HiGHS's model status 16 (solution limit): how its branch-and-bound stops at ``mip_max_nodes`` (our node_limit)
# on some problems; scipy's milp reports it as status 4, "not recognized", with this in its message.
HIGHS_SOLUTION_LIMIT = "HiGHS Status 16:"
# Plans whose evaluated objectives differ by less than this share of the best (of 1 ms when it is under 1 ms) are
# equally good, and the one with less memory is returned: the evaluator's LP tells equal plans apart by far less.
EQUAL_OBJECTIVE_REL = 1e-9


@PLACEMENTS.register("ilp")
@dataclass
class IlpPlacement(PlacementPolicy):
    """Options: ``candidates_k`` (static candidate sites per pair, capped by the problem's), ``time_limit_s``
    (whole policy), ``mip_rel_gap`` (HiGHS stops at this relative gap), ``memory_tiebreak_ms_per_gb``,
    ``warm_start`` (``"rounding"``, a policy name, or ``"none"``), ``exact_max_integers``, ``node_limit``
    (branch-and-bound nodes over all phases: the deterministic work limit), ``verbose``."""

    candidates_k: int = 8
    time_limit_s: float = 60.0
    node_limit: int = 400
    mip_rel_gap: float = 0.01
    # HiGHS treats cost coefficients below its 1e-7 dual feasibility tolerance as zero (1e-8 ms/GB let it add
    # replicas for free); at 1e-6 the smallest replica (1.1 GB) costs 1.1e-6 ms, and the default scenario's ~6,000 GB
    # plan 0.006 ms, under 0.1% of its objective.
    memory_tiebreak_ms_per_gb: float = 1e-6
    warm_start: str = "greedy-demand"
    exact_max_integers: int = 2000
    verbose: bool = False

    def _warm_plan(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        """The ``warm_start`` policy's plan: one of the MILP's own plans (the problem's fleet and rules)."""
        policy = get_policy(self.warm_start)
        fix = "use greedy-demand, rounding or none"
        if (policy.memory_only or policy.explicit) and problem.one_llm_per_gpu:
            raise UserError(f"ilp option warm_start {self.warm_start!r} places by memory alone, which one language "
                            f"model per GPU (one_llm_per_gpu) forbids: {fix}")
        try:
            plan = policy.place(problem, rng)
        except PlacementError as exc:  # say whose plan it was (its message names the warm start's policy)
            raise type(exc)(f"ilp's warm start ({self.warm_start}; warm_start = 'rounding' or 'none' skips "
                            f"it): {exc}") from None
        if plan.fleet is not problem.fleet:
            raise UserError(f"ilp option warm_start {self.warm_start!r} places on a fleet of its own, not the "
                            f"problem's: {fix}")
        return plan

    def _warm_start_in_child(self, problem: PlacementProblem, rng: np.random.Generator) -> tuple:
        """Run in a child process: the warm start's plan detached (scored there, under the deadline) and the state
        it left ``rng`` in."""
        return self._warm_plan(problem, rng).detached(), rng.bit_generator.state

    def _relaxation_and_starts(self, problem: PlacementProblem, model: IlpModel,
                               warm_counts: np.ndarray | None) -> tuple:
        """Run in a child process: the LP relaxation and the seconds it took, the starting counts (the relaxation
        rounded; the warm start's), their completed solutions, and the rounded plan detached and scored (None when
        its packing loses a model)."""
        t_lp = time.perf_counter()
        relaxed = model.relaxation()
        lp_s = time.perf_counter() - t_lp
        if relaxed.status != 0:
            raise UserError(f"ilp placement: the LP relaxation failed ({relaxed.message})")
        c_relaxed = relaxed.x[model.prog.n:]
        starts = {} if self.warm_start == "none" else {"rounding": round_relaxation(model, c_relaxed)}
        if warm_counts is not None:
            starts[self.warm_start] = model.unit_counts(warm_counts)
        solutions = {name: model.complete(c) for name, c in starts.items()}
        solutions = {name: x for name, x in solutions.items() if x is not None}
        rounded: dict[str, Placement] = {}
        if "rounding" in solutions:
            self._add_plan(rounded, "rounding", problem, model, solutions["rounding"])
        return relaxed, lp_s, starts, solutions, rounded["rounding"].detached() if rounded else None

    @staticmethod
    def check_options(candidates_k: int = 8, time_limit_s: float = 60.0, node_limit: int = 400,
                      mip_rel_gap: float = 0.01, warm_start: str = "greedy-demand",
                      memory_tiebreak_ms_per_gb: float = 1e-6, exact_max_integers: int = 2000, **_rest) -> None:
        """The options' values (the registry calls it when a scenario is read; :meth:`place` again)."""
        known = [n for n in PLACEMENTS.names() if n != "ilp"]
        if warm_start not in ("rounding", "none", *known):
            raise ValueError(f"warm_start must be 'rounding', 'none' or a placement policy other than ilp "
                             f"({', '.join(known)}), got {warm_start!r}")
        # A policy that says it builds its own fleet is refused here; _warm_plan also checks the plan it returns.
        if warm_start in known and getattr(PLACEMENTS.get(warm_start), "own_fleet", False):
            raise ValueError(f"warm_start {warm_start!r} places on a fleet of its own, not the problem's, so its plan "
                             f"is not one of the MILP's: use greedy-demand, rounding or none")
        for name, value, ok in (("time_limit_s", time_limit_s, 0 < time_limit_s <= MAX_TIME_LIMIT_S),
                                ("mip_rel_gap", mip_rel_gap, 0 <= mip_rel_gap < np.inf),
                                ("candidates_k", candidates_k, candidates_k >= 1),
                                ("node_limit", node_limit, node_limit >= 1),
                                ("exact_max_integers", exact_max_integers, exact_max_integers >= 0),
                                ("memory_tiebreak_ms_per_gb", memory_tiebreak_ms_per_gb,
                                 0 <= memory_tiebreak_ms_per_gb < np.inf)):
            if not ok:  # (NaN fails too)
                rule = {"time_limit_s": f"positive and at most {MAX_TIME_LIMIT_S:,.0f} s (a day)",
                        "mip_rel_gap": "finite and >= 0", "exact_max_integers": ">= 0",
                        "memory_tiebreak_ms_per_gb": "finite and >= 0"}.get(name, ">= 1")
                raise ValueError(f"{name} must be {rule}, got {value!r}")

    def place(self, problem: PlacementProblem, rng: np.random.Generator) -> Placement:
        try:
            self.check_options(self.candidates_k, self.time_limit_s, self.node_limit, self.mip_rel_gap,
                               self.warm_start, self.memory_tiebreak_ms_per_gb, self.exact_max_integers)
        except ValueError as exc:
            raise UserError(f"ilp option {exc}") from None
        # The solver's library, imported before the clock starts (and so in every forked child): timing the
        # relaxation with its import in it would take the import's half second out of the solver's share.
        import scipy.optimize  # noqa: F401

        t0 = time.perf_counter()
        end = t0 + self.time_limit_s
        net = problem.network().in_planning_units()
        plans: dict[str, Placement] = {}  # candidate answers, each scored by the evaluator
        warm_status = None
        if self.warm_start not in ("rounding", "none"):
            # In a child process stopped at its share of the budget; rng advances as if the policy had run here.
            out = call_with_deadline(self._warm_start_in_child, t0 + WARM_START_SHARE * self.time_limit_s,
                                     problem, rng)
            warm_status = STOPPED if out is None else "done"
            if out is not None:
                plans[self.warm_start] = Placement.attached(problem, problem.fleet, out[0])
                rng.bit_generator.state = out[1]
        seed_s = time.perf_counter() - t0
        extra = warm_counts = None
        if plans:  # make sure the MILP has a unit for every replica of the seeded plan
            warm_counts = plans[self.warm_start].counts
            group_of, first = net.site_groups()
            extra = np.zeros((len(first), net.n_models), dtype=bool)
            np.logical_or.at(extra, group_of, warm_counts > 0)
        k = min(int(self.candidates_k), problem.candidates_k)
        model = IlpModel(net, k, self.memory_tiebreak_ms_per_gb, extra)
        mode = "exact" if len(model.unit_group) <= self.exact_max_integers else "rens+exact"
        # The relaxation and its starts run in a child process stopped at the end of the budget: their plan comes
        # back scored, so no time need be kept for that.
        prep = call_with_deadline(self._relaxation_and_starts, end, problem, model, warm_counts)
        if prep is None and not plans:
            raise UserError(f"ilp placement: the LP relaxation did not finish within time_limit_s = "
                            f"{self.time_limit_s:g} s{' (nor did the warm start)' if warm_status == STOPPED else ''}; "
                            "raise time_limit_s (edgepop place: --time-limit)")
        relaxed, lp_s, starts, solutions, rounded = prep or (None, np.inf, {}, {}, None)
        if rounded is not None:
            plans["rounding"] = Placement.attached(problem, problem.fleet, rounded)
        # Scoring the MILP's plan at the end costs about one LP of this size plus packing: keep that time (none
        # left without the relaxation: branch-and-bound is left out, the warm start's plan returned).
        deadline = end - 1.5 * lp_s
        c_relaxed = None if relaxed is None else relaxed.x[model.prog.n:]
        x0 = min(solutions.values(), key=lambda x: model.cost @ x, default=None)
        prep_s = time.perf_counter() - t0
        res, phases, bound = self._branch_and_bound(model, mode, c_relaxed, list(starts.values()), x0, deadline)
        if res is not None and res.x is not None:
            solutions["milp"] = res.x
            self._add_plan(plans, "milp", problem, model, res.x)
        if not plans:
            raise UserError(f"ilp placement found no plan within {self.time_limit_s:g} s; raise the time limit")
        # A lower bound on the MILP's objective (tie-breaker included) can never exceed a feasible plan's cost, but
        # HiGHS's bounds are exact only to its tolerances and can: the bound is capped at the cheapest plan known
        # (every solution here is feasible), which then says "gap 0 within tolerance", no more.
        costs = [float(model.cost @ x) for x in solutions.values()]
        lp_bound = -np.inf if relaxed is None else float(relaxed.fun)
        bound = min(max(lp_bound, bound), *costs) if costs else max(lp_bound, bound)
        # The MILP plans with static candidate sites; the evaluator routes to the k nearest replicas. A plan
        # the MILP ranks higher can score lower there (more so when branch-and-bound stopped early): every
        # candidate plan is scored by the evaluator, and the best wins, memory deciding only at equal objective.
        gb = {n: float(p.table.memory_gb.sum()) for n, p in plans.items()}
        name = choose_plan({n: p.objective_ms for n, p in plans.items()}, gb)
        best = plans[name]
        found = float(model.cost @ solutions[name]) if name in solutions else None
        best.policy = self.name
        status = "no time for branch-and-bound" if all(p.get("skipped") for p in phases) else phases[-1]["status"]
        best.solver = {
            "mode": mode, "plan": name, "status": status if relaxed is not None else "relaxation stopped at deadline",
            "phases": phases, "warm_start": self.warm_start, "warm_start_status": warm_status,
            "warm_start_s": round(seed_s, 3), "relaxation_status": "optimal" if relaxed is not None else STOPPED,
            "node_limit": int(self.node_limit),
            # a step the clock stopped or left out (``skipped``) means the clock, not the node budget, decided
            "deterministic": (all(p["status"] != "time limit" for p in phases) and warm_status != STOPPED
                              and relaxed is not None),
            "ilp_objective_ms": None if found is None else round(found, 6),
            "lower_bound_ms": round(bound, 6) if np.isfinite(bound) else None,
            "milp_gap": None if not found or not np.isfinite(bound) else round(max(0.0, 1 - bound / found), 6),
            "start_objectives_ms": {n: round(float(model.cost @ x), 6) for n, x in solutions.items() if n != "milp"},
            "evaluated_ms": {n: round(p.objective_ms, 6) for n, p in plans.items()},
            "evaluated_gb": {n: round(v, 3) for n, v in gb.items()},
            "prepare_s": round(prep_s, 3), "solve_s": round(time.perf_counter() - t0, 3), "variables": int(model.n),
            "integers": len(model.unit_group), "constraints": int(model.A.shape[0]), "candidates_k": k,
            "dropped_replicas": len(best.dropped)}
        return best

    def _branch_and_bound(self, model: IlpModel, mode: str, c_relaxed: np.ndarray | None, starts: list[np.ndarray],
                          x0: np.ndarray | None, deadline: float):
        """Run HiGHS until ``deadline``: RENS for a third of the time (large problems), then the full MILP.

        Returns (best result or None, phase reports, lower bound from the full MILP or -inf)."""
        res, phases, bound = None, [], -np.inf
        nodes = int(self.node_limit)
        if mode != "exact" and deadline - time.perf_counter() > 0.5:
            # Counts between floor and ceiling of the relaxation, widened to hold the starts: quick to improve
            # when capacity binds; the full MILP then continues from its plan.
            lower, upper = np.zeros(model.n), model.upper.copy()
            lower[model.prog.n:] = np.minimum.reduce([np.floor(c_relaxed + 1e-6), *starts])
            upper[model.prog.n:] = np.maximum.reduce([np.ceil(c_relaxed - 1e-6), *starts])
            res = self._solve(model, lower, upper, x0, deadline, max(1, nodes // 3))
            phases.append(_phase("rens", res))
            if res is not None and res.x is not None and (x0 is None or res.fun < model.cost @ x0):
                x0 = res.x
        elif mode != "exact":  # the clock, not the node budget, left this phase out
            phases.append({"phase": "rens", "status": "time limit", "skipped": True, "objective_ms": None})
        if deadline - time.perf_counter() > 0.5:
            full = self._solve(model, np.zeros(model.n), model.upper, x0, deadline,
                               max(1, nodes - nodes // 3) if mode != "exact" else nodes)
            phases.append(_phase("exact", full))
            if full is not None and full.mip_dual_bound is not None and np.isfinite(full.mip_dual_bound):
                bound = float(full.mip_dual_bound)  # a lower bound for every plan of the MILP
            if full is not None and full.x is not None and (res is None or res.x is None or full.fun <= res.fun):
                res = full
        else:
            phases.append({"phase": "exact", "status": "time limit", "skipped": True, "objective_ms": None})
        return res, phases, bound

    def _solve(self, model: IlpModel, lower: np.ndarray, upper: np.ndarray, x0: np.ndarray | None, deadline: float,
               nodes: int):
        """HiGHS on the MILP within ``[lower, upper]`` from ``x0`` until ``deadline`` (its time limit), stopped
        :data:`DEADLINE_GRACE_S` after it when HiGHS is inside a phase it does not interrupt (None then)."""
        from scipy.optimize import Bounds, milp  # (here, not at the top: every command would pay its import)

        opts = {"time_limit": max(0.0, deadline - time.perf_counter()), "node_limit": int(nodes),
                "mip_rel_gap": float(self.mip_rel_gap), "disp": bool(self.verbose)}
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            # scipy passes options it does not know to HiGHS verbatim, and warns that it does.
            warnings.simplefilter("ignore", RuntimeWarning)
            if x0 is not None:
                start = Path(tmp) / "start.sol"
                model.write_start(x0, start)
                opts["read_solution_file"] = str(start)
            return call_with_deadline(milp, deadline + DEADLINE_GRACE_S, model.cost, constraints=model.constraints,
                                      integrality=model.integrality, bounds=Bounds(lower, upper), options=opts)

    def _add_plan(self, plans: dict, name: str, problem, model: IlpModel, x: np.ndarray) -> None:
        """Add the packed plan of ``x`` as a candidate, unless packing it loses every replica of a model (the MILP
        packs by group; the ledger packs GPU by GPU): then the other candidates stay."""
        try:
            plans[name] = self._placement(problem, model, x)
        except InfeasiblePlacementError:
            pass

    def _placement(self, problem, model: IlpModel, x: np.ndarray) -> Placement:
        net = model.net
        ledger, dropped = pack_groups(net, model.groups, model.group_counts(x[model.prog.n:]),
                                      fallback=model.site_nodes)
        sites = problem.fleet.sites.site_id.to_numpy()
        dropped = [(sites[model.g_site[g]], net.node_gpu[model.first[g]], net.models[m]) for g, m in dropped]
        return Placement(problem, problem.fleet, self.name, ledger.placements(), dropped)


def choose_plan(objective_ms: dict[str, float], memory_gb: dict[str, float]) -> str:
    """The candidate to return: the lowest evaluated objective; among the plans within :data:`EQUAL_OBJECTIVE_REL`
    of it, the one with least memory (the MILP's at equal memory). Memory never buys a worse objective: a price per
    GB added to the objective would, at extreme load, outweigh what a replica serves."""
    best = min(objective_ms.values())
    tied = [n for n, v in objective_ms.items() if v <= best + EQUAL_OBJECTIVE_REL * max(abs(best), 1.0)]
    return min(tied, key=lambda n: (memory_gb[n], n != "milp"))


def _phase(name: str, res) -> dict:
    if res is None:  # stopped at the deadline from outside: HiGHS had not returned
        return {"phase": name, "status": "time limit", "stopped_at_deadline": True, "objective_ms": None}
    message = str(res.message)
    if res.status == 0:
        status = "optimal"
    elif res.status == 1:
        status = "time limit" if "time" in message.lower() else "node limit"
    elif HIGHS_SOLUTION_LIMIT in message:  # scipy passes this HiGHS status on as "not recognized"
        status = "node limit"
    else:
        status = message
    return {"phase": name, "status": status, "objective_ms": None if res.x is None else round(float(res.fun), 6)}


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
