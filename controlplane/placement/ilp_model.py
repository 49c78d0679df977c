"""The MILP behind the ``ilp`` placement policy: variables, constraints and helpers to seed and decode it.

Columns: flows ``y`` (pair -> static candidate site), unserved slack ``u`` per pair, served flow ``z`` per unit
and the integer replica count ``c`` per unit, where a *unit* is (node group, model) and a group is the identical
nodes (GPU type and count) of one site. Rows: the evaluator's demand, site balance and GPU-time rows
(:func:`~controlplane.placement.evaluate.flow_program`), replica capacity ``z <= c x rate x utilisation_cap``,
group memory, at least one replica per demanded model, and ``y[p, own site] <= demand_p x replicas there``
(the facility-location tightening, for the 0-ms flows). Counts are bounded by the per-GPU slots and by
GPUs / tp (more replicas could add no GPU time). Objective: the evaluator's plus a per-GB tie-breaker, capped
per replica at a small share of what the replica's capacity is worth (so it never outweighs serving demand).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from controlplane.placement.evaluate import flow_program

# The most a replica's memory tie-breaker may cost, as a share of what its capacity is worth serving demand that
# would otherwise go unserved (unserved_penalty_ms x its planned capacity / total demand).
TIEBREAK_SHARE_OF_WORTH = 0.01


class IlpModel:
    """The MILP of one problem on its fleet: matrix, bounds, integrality and the maps back to units."""

    def __init__(self, net, k: int, tiebreak: float, extra_units: np.ndarray | None = None):
        self.net = net
        cand_site, cand_rtt = net.nearest_sites(net.site_capable, k)
        y_pair, slot = np.nonzero(cand_site >= 0)
        y_site, y_rtt = cand_site[y_pair, slot], cand_rtt[y_pair, slot]
        self.group_of, self.first = net.site_groups()
        first = self.first
        size = np.bincount(self.group_of, minlength=len(first))
        self.g_site = g_site = net.node_site[first]
        wanted = np.zeros((len(first), net.n_models), dtype=bool)
        reach = np.zeros((net.n_sites, net.n_models), dtype=bool)
        reach[y_site, net.pair_model[y_pair]] = True
        wanted |= reach[g_site]
        if extra_units is not None:
            wanted |= extra_units
        self.unit_group, self.unit_model = ug, um = np.nonzero(net.fits[first] & wanted)
        util = net.util
        gpus = net.node_gpus[first] * size
        prog = flow_program(net, y_pair, y_site, y_rtt, g_site[ug], um, ug,
                            net.gpu_time_per_rps[first[ug], um], util * gpus)
        self.prog, n_c = prog, len(ug)
        self.n = n = prog.n + n_c
        units = np.arange(n_c)
        c_col = prog.n + units
        # Replica capacity: z_u - cap_u * util * c_u <= 0.
        cap = net.cap[first[ug], um]
        z_col = prog.n_y + prog.n_u + units
        link = sp.csr_matrix((np.concatenate([np.ones(n_c), -cap * util]),
                              (np.concatenate([units, units]), np.concatenate([z_col, c_col]))), shape=(n_c, n))
        # Group memory in GB (1e-5 GB below the limit so solver tolerances cannot over-commit).
        memory = sp.csr_matrix((net.replica_bytes[um] / 1e9, (ug, c_col)), shape=(len(first), n))
        at_least_one = sp.csr_matrix((np.ones(n_c), (um, c_col)), shape=(net.n_models, n))
        strong = self._local_links(y_pair, y_site, y_rtt, c_col)
        useful = size[ug] * (net.node_gpus[first[ug]] // net.tp[um])
        upper_c = np.minimum(size[ug] * net.max_replicas[first[ug], um], useful)
        packing, packing_rhs = self._packing_cuts(c_col, upper_c, gpus)
        solo, solo_rhs = self._exclusive_rows(c_col, upper_c, gpus)
        packing, packing_rhs = sp.vstack([packing, solo]), np.concatenate([packing_rhs, solo_rhs])
        pad = sp.csr_matrix((prog.A_eq.shape[0], n_c)), sp.csr_matrix((prog.A_ub.shape[0], n_c))
        self.A = sp.vstack([sp.hstack([prog.A_eq, pad[0]]), sp.hstack([prog.A_ub, pad[1]]), link, memory,
                            at_least_one, strong, packing]).tocsr()
        inf = np.inf
        self.lo = np.concatenate([prog.b_eq, np.full(prog.A_ub.shape[0] + n_c + len(first), -inf),
                                  np.ones(net.n_models), np.full(strong.shape[0] + len(packing_rhs), -inf)])
        self.hi = np.concatenate([prog.b_eq, prog.b_ub, np.zeros(n_c), gpus * net.gpu_limit[first] / 1e9 - 1e-5,
                                  np.full(net.n_models, inf), np.zeros(strong.shape[0]), packing_rhs])
        # The tie-breaker must not outweigh serving demand: a replica's memory price is capped at a small share
        # (TIEBREAK_SHARE_OF_WORTH) of what its capacity is worth to demand otherwise unserved. A fixed price per GB
        # outweighs that at extreme load (at 1e8 req/s a 70B replica's 4 req/s are worth 4e-5 ms of the mean, its
        # 83 GB cost 8e-5 ms) and the MILP would leave demand unserved to save memory; at ordinary loads the cap is
        # orders of magnitude above the price and changes nothing.
        worth = net.problem.unserved_penalty_ms * cap * util / net.total_demand
        self.cost = np.concatenate([prog.cost, np.minimum(tiebreak * net.replica_bytes[um] / 1e9,
                                                          TIEBREAK_SHARE_OF_WORTH * worth)])
        self.upper = np.concatenate([np.full(prog.n, inf), upper_c])
        self.integrality = np.concatenate([np.zeros(prog.n), np.ones(n_c)])
        self.groups = [np.flatnonzero(self.group_of == g) for g in range(len(first))]
        # The other nodes of each group's site: where a replica that does not fit its group may still go.
        self.site_nodes = [np.flatnonzero((net.node_site == g_site[g]) & (self.group_of != g))
                           for g in range(len(first))]
        self.unit_index = np.full((len(first), net.n_models), -1)
        self.unit_index[ug, um] = units

    @property
    def constraints(self):
        """The rows as a ``scipy.optimize.LinearConstraint``."""
        # scipy.optimize is imported where it is used: importing it costs every command half a second
        from scipy.optimize import LinearConstraint

        return LinearConstraint(self.A, self.lo, self.hi)

    def relaxation(self):
        """The LP relaxation (its optimum is a lower bound on the MILP's)."""
        from scipy.optimize import Bounds, milp

        return milp(self.cost, constraints=self.constraints, bounds=Bounds(np.zeros(self.n), self.upper))

    def _packing_cuts(self, c_col, upper_c, gpus) -> tuple[sp.csr_matrix, np.ndarray]:
        """Per-GPU packing, which group memory alone misses, as valid inequalities for multi-GPU groups.

        For a dual-feasible function f (here Fekete-Schepers u_k, k = 1..6) the items on one GPU satisfy
        sum f(bytes / GPU limit) <= 1, so over a group: sum_u tp_u f(x_u) c_u <= GPUs. E.g. a 70B replica
        (41.7 GB of a 48 GB L40S on each of two GPUs) leaves no room for an 11 GB model on that node.
        """
        net, ug, um = self.net, self.unit_group, self.unit_model
        multi = net.node_gpus[self.first[ug]] >= 2
        x = net.bytes_per_gpu[um] / net.gpu_limit[self.first[ug]]
        coefs = []
        for k in range(1, 7):
            scaled = (k + 1) * x
            f = np.where(np.isclose(scaled, np.round(scaled)), x, np.floor(scaled + 1e-12) / k)
            coefs.append(np.where(multi, net.tp[um] * f, 0.0))
        return self._gpu_rows(coefs, c_col, upper_c, gpus)

    def _exclusive_rows(self, c_col, upper_c, gpus) -> tuple[sp.csr_matrix, np.ndarray]:
        """One language model per GPU (``net.exclusive``): a group's exclusive replicas span at most its GPUs,
        sum_u tp_u c_u <= GPUs, which memory alone does not say (a small model leaves room for another)."""
        um = self.unit_model
        coef = np.where(self.net.exclusive[um], self.net.tp[um], 0).astype(float)
        return self._gpu_rows([coef], c_col, upper_c, gpus)

    def _gpu_rows(self, coefs, c_col, upper_c, gpus) -> tuple[sp.csr_matrix, np.ndarray]:
        """Rows sum_u coef_u c_u <= GPUs of the group, per group and coefficient vector, where they can bind."""
        ug = self.unit_group
        rows, cols, vals, rhs = [], [], [], []
        for coef in coefs:
            for g in np.unique(ug[coef > 0]):
                units = np.flatnonzero((ug == g) & (coef > 0))
                if coef[units] @ upper_c[units] <= gpus[g] + 1e-9:
                    continue  # cannot bind
                rows.append(np.full(len(units), len(rhs)))
                cols.append(c_col[units])
                vals.append(coef[units])
                rhs.append(float(gpus[g]) + 1e-9)
        if not rhs:
            return sp.csr_matrix((0, self.n)), np.zeros(0)
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(rhs), self.n)), np.array(rhs)

    def _local_links(self, y_pair, y_site, y_rtt, c_col) -> sp.csr_matrix:
        """y[p, own site] - demand_p * (replicas of the model at that site) <= 0, for flows at 0 ms."""
        net = self.net
        sel = np.flatnonzero(y_rtt <= 0)
        key_y = y_site[sel] * net.n_models + net.pair_model[y_pair[sel]]
        key_u = self.g_site[self.unit_group] * net.n_models + self.unit_model
        order = np.argsort(key_u, kind="stable")
        lo, hi = np.searchsorted(key_u[order], key_y, "left"), np.searchsorted(key_u[order], key_y, "right")
        rows, cols, vals = [np.arange(len(sel))], [sel], [np.ones(len(sel))]
        for r, (a, b) in enumerate(zip(lo, hi, strict=True)):
            u = order[a:b]
            rows.append(np.full(len(u), r))
            cols.append(c_col[u])
            vals.append(np.full(len(u), -net.pair_demand[y_pair[sel[r]]]))
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(sel), self.n))

    def unit_counts(self, node_counts: np.ndarray) -> np.ndarray:
        """Replica counts per unit from counts per (node, model) (replicas outside the units are left out)."""
        per_group = np.zeros((len(self.first), self.net.n_models))
        np.add.at(per_group, self.group_of, node_counts)
        return per_group[self.unit_group, self.unit_model]

    def group_counts(self, c: np.ndarray) -> np.ndarray:
        """Counts per (group, model) from counts per unit."""
        out = np.zeros((len(self.first), self.net.n_models), dtype=int)
        out[self.unit_group, self.unit_model] = np.round(c).astype(int)
        return out

    def complete(self, c: np.ndarray) -> np.ndarray | None:
        """A full solution vector with integers fixed at ``c`` (routing solved as an LP), or None."""
        lb = np.concatenate([np.zeros(self.prog.n), c])
        ub = np.concatenate([self.upper[:self.prog.n], c])
        from scipy.optimize import Bounds, milp

        res = milp(self.cost, constraints=self.constraints, bounds=Bounds(lb, ub))
        return res.x if res.status == 0 else None

    def write_start(self, x: np.ndarray, path: Path) -> None:
        """Write ``x`` as a HiGHS solution file (read back through the ``read_solution_file`` option)."""
        rows = self.A @ x
        lines = ["Model status", "Feasible", "", "# Primal solution values", "Feasible",
                 f"Objective {float(self.cost @ x)!r}", f"# Columns {self.n}"]
        lines += [f"c{j} {v!r}" for j, v in enumerate(x.tolist())]
        lines += [f"# Rows {len(rows)}"] + [f"r{i} {v!r}" for i, v in enumerate(rows.tolist())]
        lines += ["", "# Dual solution values", "None", ""]
        path.write_text("\n".join(lines))
