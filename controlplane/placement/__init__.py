"""Placement: which model replicas run on which GPU node, by a policy picked by name.

    from controlplane.placement import PlacementProblem, get_policy
    problem = PlacementProblem.build(topo, total_rps=20_000)
    placement = get_policy("greedy-demand").place(problem, np.random.default_rng(0))
    placement.table, placement.objective_ms, placement.coverage(), placement.memory_use()

Policies: ``everywhere-fits``, ``greedy-demand``, ``ilp``, ``central``, ``per-pop`` (see their modules). All are scored by
:func:`controlplane.placement.evaluate.evaluate`.
"""

from controlplane.placement import central, everywhere, greedy, ilp, per_pop  # noqa: F401  (register the policies)
from controlplane.placement.base import (
    PLACEMENTS,
    TASK_REQUEST_SHAPE,
    InfeasiblePlacementError,
    ModelTooLargeError,
    PlacementError,
    PlacementPolicy,
    PlacementProblem,
    UnknownPolicyError,
    check_policy_name,
    get_policy,
    policy_names,
)
from controlplane.placement.evaluate import Evaluation, evaluate
from controlplane.placement.result import TABLE_COLUMNS, Placement

__all__ = [
    "TABLE_COLUMNS", "TASK_REQUEST_SHAPE", "Evaluation", "InfeasiblePlacementError", "ModelTooLargeError",
    "Placement", "PlacementError", "PlacementPolicy", "PlacementProblem", "UnknownPolicyError", "evaluate",
    "PLACEMENTS", "check_policy_name", "get_policy", "policy_names",
]
