"""Placement: which model replicas run on which GPU node, by a policy picked by name (docs/placement.md).

    from controlplane.placement import PlacementProblem, get_policy
    problem = PlacementProblem.build(topo, total_rps=20_000)
    placement = get_policy("greedy-demand").place(problem, np.random.default_rng(0))
    placement.table, placement.objective_ms, placement.coverage(), placement.memory_use()

Policies: ``everywhere-fits``, ``greedy-demand``, ``ilp``, ``central``, ``per-pop`` (see their modules). All are scored by
:func:`controlplane.placement.evaluate.evaluate`.

Reading guide (start at :mod:`controlplane.placement.base`):

* :mod:`controlplane.placement.base`: the problem, the policy interface and the ``PLACEMENTS`` registry;
  :mod:`controlplane.placement.network`: the arrays the evaluator and the policies share (who can host what);
* :mod:`controlplane.placement.evaluate`: the shared objective; :mod:`controlplane.placement.result`: a
  ``Placement``; :mod:`controlplane.placement.packing`: replicas packed onto a node's GPUs;
* the policies: :mod:`controlplane.placement.everywhere`, :mod:`controlplane.placement.greedy` (with its routing
  state :mod:`controlplane.placement.greedy_routing`, its per-site demand lists :mod:`controlplane.placement.takers`
  and its swap search :mod:`controlplane.placement.local_search`), :mod:`controlplane.placement.ilp` (its MILP in
  :mod:`controlplane.placement.ilp_model`, its wall-clock budget enforced by
  :mod:`controlplane.placement.deadline`), :mod:`controlplane.placement.central`,
  :mod:`controlplane.placement.per_pop`;
* around them: :mod:`controlplane.placement.fill` (capacity matching: every owned GPU gets a replica),
  :mod:`controlplane.placement.cache` (deterministic plans cached on disk) and :mod:`controlplane.placement.cli`
  (``edgepop place``).
"""

from controlplane.placement import central, everywhere, greedy, ilp, per_pop  # noqa: F401  (register the policies)
from controlplane.placement.base import (
    PLACEMENTS,
    TASK_REQUEST_SHAPE,
    InfeasiblePlacementError,
    InvalidPlacementError,
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
    "TABLE_COLUMNS", "TASK_REQUEST_SHAPE", "Evaluation", "InfeasiblePlacementError", "InvalidPlacementError",
    "ModelTooLargeError", "Placement", "PlacementError", "PlacementPolicy", "PlacementProblem", "UnknownPolicyError", "evaluate",
    "PLACEMENTS", "check_policy_name", "get_policy", "policy_names",
]
