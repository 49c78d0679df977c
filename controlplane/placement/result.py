"""A placement: which replica runs on which GPUs of which node, scored by the shared evaluator."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pandas as pd

from controlplane.fleet import Fleet
from controlplane.placement.base import InfeasiblePlacementError, PlacementProblem
from controlplane.placement.evaluate import Evaluation, evaluate
from controlplane.placement.validate import checked_plan

TABLE_COLUMNS = ["replica_id", "model", "node", "node_id", "site", "site_id", "gpu", "gpu_index", "memory_gb"]


class Placement:
    """Replicas of a policy's decision on ``fleet``, one row each in :attr:`table`, and their evaluation.

    ``placed``: (node row of ``fleet.nodes``, model index into ``problem.models``, GPU indices on that node) per
    replica, integers. ``dropped``: replicas a policy decided but could not pack onto GPUs, as (site_id, gpu,
    model) — reported, not placed. Raises :class:`~controlplane.placement.base.InvalidPlacementError` for a plan
    that breaks the placement rules (an index out of range, GPU indices that are not ``tensor_parallel`` distinct
    GPUs of the node, a GPU's memory over its limit: :func:`controlplane.placement.validate.checked_plan`) and
    :class:`InfeasiblePlacementError` when a demanded model ends up with no replica at all.
    """

    from_cache = False  # read back from the disk cache (controlplane.placement.cache) rather than computed

    def __init__(self, problem: PlacementProblem, fleet: Fleet, policy: str,
                 placed: Iterable[tuple[int, int, tuple[int, ...]]], dropped: Iterable[tuple] = (),
                 solver: dict | None = None):
        self.problem, self.fleet, self.policy = problem, fleet, policy
        self.net = problem.network(fleet)
        placed = sorted(checked_plan(self.net, policy, placed))
        self.dropped = list(dropped)
        self.solver = dict(solver or {})
        self.counts = np.zeros((self.net.n_nodes, self.net.n_models), dtype=int)
        for n, m, _ in placed:
            self.counts[n, m] += 1
        missing = [problem.models[m] for m in np.flatnonzero(self.counts.sum(axis=0) == 0)]
        if missing:
            raise InfeasiblePlacementError(
                f"policy {policy!r} could place no replica of {', '.join(missing[:3])}"
                f"{' and more' if len(missing) > 3 else ''} in fleet {fleet.name!r} "
                f"({self.net.gpu_limit.dot(self.net.node_gpus) / 1e9:.0f} GB of GPU memory): demand for it "
                f"cannot be served{_exclusive_hint(self.net)}")
        nodes = fleet.nodes
        node = np.array([p[0] for p in placed], dtype=int)
        model = np.array([p[1] for p in placed], dtype=int)
        self.table = pd.DataFrame({
            "replica_id": np.arange(len(placed)),
            "model": np.array(problem.models, dtype=object)[model],
            "node": node,
            "node_id": nodes.node_id.to_numpy()[node],
            "site": nodes.site.to_numpy()[node],
            "site_id": nodes.site_id.to_numpy()[node],
            "gpu": nodes.gpu.to_numpy()[node],
            "gpu_index": [p[2] for p in placed],
            "memory_gb": self.net.replica_bytes[model] / 1e9,
        }, columns=TABLE_COLUMNS)
        self._evaluation: Evaluation | None = None

    @property
    def evaluation(self) -> Evaluation:
        """The shared evaluator's verdict (an LP over the whole demand: computed when first asked for, since a
        simulation that only needs the table never pays for it)."""
        if self._evaluation is None:
            self._evaluation = evaluate(self.net, self.counts)
        return self._evaluation

    def detached(self) -> tuple:
        """This placement, scored, without its problem and fleet: small and picklable (a child process hands a
        plan back this way); :meth:`attached` rebuilds it on the same problem and fleet."""
        index = {m: i for i, m in enumerate(self.problem.models)}
        placed = [(int(n), index[m], tuple(g)) for n, m, g in
                  zip(self.table.node, self.table.model, self.table.gpu_index, strict=True)]
        return self.policy, placed, self.dropped, self.solver, self.evaluation

    @classmethod
    def attached(cls, problem: PlacementProblem, fleet: Fleet, parts: tuple) -> Placement:
        """The placement :meth:`detached` gave ``parts`` for, on ``problem`` and ``fleet``, with its score."""
        policy, placed, dropped, solver, evaluation = parts
        placement = cls(problem, fleet, policy, placed, dropped, solver)
        placement._evaluation = evaluation
        return placement

    # ------------------------------------------------------------------ scores
    @property
    def objective_ms(self) -> float:
        """Expected RTT per request in ms (unserved demand at ``unserved_penalty_ms``), see evaluate."""
        return self.evaluation.objective_ms

    def coverage(self, thresholds=(25, 50, 100)) -> pd.DataFrame:
        """Per model: demand, replicas, sites, share of demand whose nearest replica is within each threshold
        (RTT only, capacity ignored), the planned share actually served, and mean routed RTT."""
        net, ev = self.net, self.evaluation
        hosting = np.zeros((net.n_sites, net.n_models), dtype=bool)
        np.logical_or.at(hosting, net.node_site, self.counts > 0)
        _, nearest = net.nearest_sites(hosting, 1)
        nearest = nearest[:, 0]
        rows = []
        for m, model in enumerate(net.models):
            pairs = net.pair_model == m
            demand = net.pair_demand[pairs]
            row = {"model": model, "demand_rps": float(demand.sum()), "replicas": int(self.counts[:, m].sum()),
                   "sites": int(hosting[:, m].sum())}
            for t in thresholds:
                row[f"within_{t:g}ms"] = float(demand[nearest[pairs] <= t].sum() / demand.sum())
            flows = pairs[ev.flow_pair]
            served = float(ev.flow_rps[flows].sum())
            row["served_share"] = served / row["demand_rps"]
            row["mean_rtt_ms"] = float(ev.flow_rps[flows].dot(ev.flow_rtt[flows]) / served) if served else np.nan
            rows.append(row)
        return pd.DataFrame(rows).set_index("model")

    def memory_use(self) -> pd.DataFrame:
        """Per node: committed replica memory and the node's GPU memory (GB)."""
        nodes = self.fleet.nodes
        used = np.bincount(self.table.node.to_numpy(), weights=self.table.memory_gb.to_numpy(),
                           minlength=len(nodes))
        out = nodes[["node_id", "site_id", "gpu", "gpus"]].copy()
        out["used_gb"] = used
        out["total_gb"] = nodes.memory_gb.to_numpy()
        out["replicas"] = np.bincount(self.table.node.to_numpy(), minlength=len(nodes))
        return out

    def memory_by_gpu(self) -> pd.DataFrame:
        """Per GPU type: used and total GB and the used share."""
        g = self.memory_use().groupby("gpu")[["used_gb", "total_gb"]].sum()
        g["share"] = g.used_gb / g.total_gb
        return g

    def gpu_usage_bytes(self) -> list[np.ndarray]:
        """Committed bytes on every GPU of every node, recomputed from :attr:`table`."""
        usage = [np.zeros(int(n)) for n in self.fleet.nodes.gpus]
        per_gpu = {m: self.problem.catalog[m].bytes_per_gpu for m in self.problem.models}
        for node, model, gpus in zip(self.table.node, self.table.model, self.table.gpu_index, strict=True):
            usage[node][list(gpus)] += per_gpu[model]
        return usage

    def check_memory(self) -> None:
        """Assert the packing invariant (see :mod:`controlplane.placement.base`) on :attr:`table` again, written
        independently of the check every plan passes when it is built (the tests' reference, e.g. after the table
        was edited); raises ``AssertionError``."""
        tp = {m: self.problem.catalog[m].tensor_parallel for m in self.problem.models}
        for row in self.table.itertuples():
            gpus = row.gpu_index
            assert len(set(gpus)) == len(gpus) == tp[row.model], f"replica {row.replica_id}: GPUs {gpus}"
            assert all(0 <= g < self.fleet.nodes.gpus.iat[row.node] for g in gpus), f"replica {row.replica_id}"
        limit = self.fleet.nodes.gpu_memory_gb.to_numpy() * 1e9 * self.problem.memory_factor
        for node, usage in enumerate(self.gpu_usage_bytes()):
            assert (usage <= limit[node] + 1.0).all(), \
                f"node {self.fleet.nodes.node_id.iat[node]}: {usage.max() / 1e9:.2f} GB on a GPU over the limit"

    def assignment(self) -> pd.DataFrame:
        """The evaluator's routing: rps of each (ingress PoP, model) served at each site, with the RTT."""
        net, ev = self.net, self.evaluation
        return pd.DataFrame({
            "ingress": self.problem.topo.pops.id.to_numpy()[net.pair_ingress[ev.flow_pair]],
            "model": np.array(net.models, dtype=object)[net.pair_model[ev.flow_pair]],
            "site_id": self.fleet.sites.site_id.to_numpy()[ev.flow_site],
            "rps": ev.flow_rps, "rtt_ms": ev.flow_rtt})

    def summary(self, thresholds=(25, 50, 100)) -> dict:
        """A JSON-able summary: objective, coverage per model and overall, memory use, solver figures."""
        cov = self.coverage(thresholds)
        w = cov.demand_rps / cov.demand_rps.sum()
        mem = self.memory_by_gpu()
        ev = self.evaluation
        return {
            "policy": self.policy, "fleet": self.fleet.name, "total_rps": _significant(self.problem.total_rps),
            "objective_ms": round(self.objective_ms, 4), "served_share": round(ev.served_share, 6),
            "unserved_rps": _significant(ev.unserved_rps),
            "mean_served_rtt_ms": None if np.isnan(ev.mean_served_rtt_ms) else round(ev.mean_served_rtt_ms, 4),
            "replicas": len(self.table), "dropped_replicas": len(self.dropped),
            "dropped": [{"site_id": str(s), "gpu": str(g), "model": str(m)} for s, g, m in self.dropped],
            "coverage": {f"within_{t:g}ms": round(float(cov[f"within_{t:g}ms"].dot(w)), 6) for t in thresholds},
            "models": {m: {k: _json_number(v) for k, v in r.items()} for m, r in cov.to_dict("index").items()},
            "memory": {"used_gb": round(float(mem.used_gb.sum()), 2), "total_gb": round(float(mem.total_gb.sum()), 2),
                       "by_gpu": {g: {"used_gb": round(float(r.used_gb), 2), "total_gb": round(float(r.total_gb), 2),
                                      "share": round(float(r.share), 6)} for g, r in mem.iterrows()}},
            "solver": self.solver,
        }

    def to_json(self, **kw) -> str:
        """:meth:`summary` as a JSON string (``kw`` goes to ``json.dumps``)."""
        return json.dumps(self.summary(), **kw)

    def __repr__(self) -> str:
        return (f"Placement({self.policy!r}, fleet={self.fleet.name!r}, replicas={len(self.table)}, "
                f"objective_ms={self.objective_ms:.3f})")


def _exclusive_hint(net) -> str:
    """Why a model got no replica, where the reason is plain: one language model per GPU asks for more GPUs than
    the fleet has ("" otherwise)."""
    llms = int(net.exclusive.sum())
    need, have = int(net.tp[net.exclusive].sum()), int(net.node_gpus.sum())
    if not llms or need <= have:
        return ""
    return (f" (one_llm_per_gpu gives each of the {llms} language models GPUs of its own: {need} for one replica "
            f"each, and the fleet has {have}; set one_llm_per_gpu = false, give the fleet more GPUs or serve "
            "fewer models)")


def _significant(v: float) -> float:
    """``v`` to 6 significant digits (a rate of 0.00001 req/s is not 0.0)."""
    return float(f"{float(v):.6g}")


def _json_number(v):
    """Rounded float (None for NaN, e.g. the mean RTT of a model nothing serves), or the value as is."""
    if isinstance(v, float | np.floating):
        return None if np.isnan(v) else round(float(v), 6)
    return int(v) if isinstance(v, np.integer) else v
