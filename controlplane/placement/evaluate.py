"""The shared placement objective: expected RTT per request once demand is routed to replicas optimally.

Given replica counts per node, demand of each (ingress, model) pair is split over the ``k`` nearest sites that
host the model (a transportation LP): flow to a site is served by that site's nodes, each node's flow of a model is
at most ``replicas x capacity x utilisation_cap``, and the GPU-time all models take on a node (``tp / capacity``
per rps) is at most ``utilisation_cap x GPUs`` — replicas sharing a GPU share its compute. Demand left over costs
``unserved_penalty_ms``. The objective is total (RTT x rps + penalty x unserved rps) / total rps, in ms.

:func:`flow_program` builds the LP pieces; the ILP policy reuses it with integer replica columns added.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from edgepop.errors import UserError


@dataclass
class FlowProgram:
    """LP ``min cost @ x`` s.t. ``A_eq x = b_eq``, ``A_ub x <= b_ub``; columns are [y | u | z]."""

    cost: np.ndarray
    A_eq: sp.csr_matrix
    b_eq: np.ndarray
    A_ub: sp.csr_matrix
    b_ub: np.ndarray
    n_y: int
    n_u: int
    n_z: int

    @property
    def n(self) -> int:
        return self.n_y + self.n_u + self.n_z


def flow_program(net, y_pair: np.ndarray, y_site: np.ndarray, y_rtt: np.ndarray, unit_site: np.ndarray,
                 unit_model: np.ndarray, unit_time_row: np.ndarray, unit_time_coef: np.ndarray,
                 time_rhs: np.ndarray, demand_scale: float = 1.0) -> FlowProgram:
    """Routing LP over flow entries ``y`` (pair -> site, at ``y_rtt`` ms), unserved slack ``u`` per pair and
    serving units ``z`` (a node or a group of nodes of ``unit_site`` serving ``unit_model``).

    Rows: demand (per pair, equality), balance (per site and model: flow in = flow served by units), time (per
    ``time_rhs`` entry: sum of ``unit_time_coef x z`` over its units at most the right-hand side).
    ``demand_scale``: demand is ``pair_demand x demand_scale`` (the objective stays per request); the caller
    scales ``time_rhs`` and the units' bounds alike and divides the flows by it.
    """
    n_pairs, n_y, n_z = len(net.pair_demand), len(y_pair), len(unit_site)
    # Demand rows: each pair's flows plus its slack equal its rate.
    rows = [y_pair, np.arange(n_pairs)]
    cols = [np.arange(n_y), n_y + np.arange(n_pairs)]
    vals = [np.ones(n_y), np.ones(n_pairs)]
    # Balance rows, one per (site, model) present among flows or units.
    y_key = y_site * net.n_models + net.pair_model[y_pair]
    z_key = unit_site * net.n_models + unit_model
    keys, inverse = np.unique(np.concatenate([y_key, z_key]), return_inverse=True)
    rows += [n_pairs + inverse[:n_y], n_pairs + inverse[n_y:]]
    cols += [np.arange(n_y), n_y + n_pairs + np.arange(n_z)]
    vals += [np.ones(n_y), -np.ones(n_z)]
    n_eq = n_pairs + len(keys)
    A_eq = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(n_eq, n_y + n_pairs + n_z))
    b_eq = np.concatenate([net.pair_demand * demand_scale, np.zeros(len(keys))])
    A_ub = sp.csr_matrix((unit_time_coef, (unit_time_row, n_y + n_pairs + np.arange(n_z))),
                         shape=(len(time_rhs), n_y + n_pairs + n_z))
    scale = 1.0 / (net.total_demand * demand_scale)
    cost = np.concatenate([y_rtt * scale, np.full(n_pairs, net.problem.unserved_penalty_ms * scale),
                           np.zeros(n_z)])
    return FlowProgram(cost, A_eq, b_eq, A_ub, np.asarray(time_rhs, dtype=float), n_y, n_pairs, n_z)


@dataclass
class Evaluation:
    """The routed outcome of a placement: objective and where each pair's demand goes."""

    objective_ms: float
    served_rps: float
    unserved_rps: float
    flow_pair: np.ndarray  # per routed flow entry: pair index
    flow_site: np.ndarray  # site row
    flow_rps: np.ndarray
    flow_rtt: np.ndarray
    unserved: np.ndarray  # per pair
    node_flow: np.ndarray  # nodes x models, rps served

    @property
    def served_share(self) -> float:
        total = self.served_rps + self.unserved_rps
        return self.served_rps / total if total else 0.0

    @property
    def mean_served_rtt_ms(self) -> float:
        return float((self.flow_rps * self.flow_rtt).sum() / self.served_rps) if self.served_rps else float("nan")


def evaluate(net, counts: np.ndarray) -> Evaluation:
    """Route ``net``'s demand over ``counts[node, model]`` replicas optimally and score it (see module doc)."""
    counts = np.asarray(counts)
    if counts.shape != (net.n_nodes, net.n_models):
        raise ValueError(f"counts has shape {counts.shape}, expected {(net.n_nodes, net.n_models)}")
    hosting = np.zeros((net.n_sites, net.n_models), dtype=bool)
    np.logical_or.at(hosting, net.node_site, counts > 0)
    cand_site, cand_rtt = net.nearest_sites(hosting, net.problem.candidates_k)
    y_pair, slot = np.nonzero(cand_site >= 0)
    y_site, y_rtt = cand_site[y_pair, slot], cand_rtt[y_pair, slot]
    unit_node, unit_model = np.nonzero(counts > 0)
    busy_nodes, time_row = np.unique(unit_node, return_inverse=True)
    util = net.problem.utilisation_cap
    # The LP's tolerances are absolute (~1e-7): a problem of little total demand (0.001 req/s) is solved scaled
    # up to 1 req/s, or its pairs' demand would drop below them and it would score lower than the same plan at
    # a larger rate. (At 1 req/s or more, unscaled: the same LP as ever.)
    k = max(1.0, 1.0 / net.total_demand)
    prog = flow_program(net, y_pair, y_site, y_rtt, net.node_site[unit_node], unit_model, time_row,
                        net.gpu_time_per_rps[unit_node, unit_model], k * util * net.node_gpus[busy_nodes],
                        demand_scale=k)
    upper = np.concatenate([np.full(prog.n_y + prog.n_u, np.inf),
                            k * counts[unit_node, unit_model] * net.cap[unit_node, unit_model] * util])
    from scipy.optimize import linprog  # (here: importing scipy.optimize costs every command half a second)

    res = linprog(prog.cost, A_ub=prog.A_ub if prog.A_ub.shape[0] else None,
                  b_ub=prog.b_ub if prog.A_ub.shape[0] else None, A_eq=prog.A_eq, b_eq=prog.b_eq,
                  bounds=np.column_stack([np.zeros(prog.n), upper]), method="highs")
    if res.status != 0:  # the LP always has a solution (all demand unserved), so this is a solver failure
        raise UserError(f"placement evaluation LP failed: {res.message}")
    x = res.x / k
    flow = x[:prog.n_y]
    node_flow = np.zeros((net.n_nodes, net.n_models))
    node_flow[unit_node, unit_model] = x[prog.n_y + prog.n_u:]
    keep = flow > 1e-9 / k  # (the LP's zero, in its own scale)
    unserved = np.maximum(x[prog.n_y:prog.n_y + prog.n_u], 0.0)
    return Evaluation(objective_ms=float(res.fun), served_rps=float(flow[keep].sum()),
                      unserved_rps=float(unserved.sum()), flow_pair=y_pair[keep], flow_site=y_site[keep],
                      flow_rps=flow[keep], flow_rtt=y_rtt[keep], unserved=unserved, node_flow=node_flow)
