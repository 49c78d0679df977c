"""A policy's plan checked before it becomes a :class:`~controlplane.placement.result.Placement`.

A plan is a list of ``placed`` tuples, one per replica: (node row of ``fleet.nodes``, index into
``problem.models``, GPU indices on that node). :func:`checked_plan` refuses, with one
:class:`~controlplane.placement.base.InvalidPlacementError` naming the policy, the replica and the bound:

* an item that is not three parts of integers (a bool or a float is not an index);
* a node row outside ``[0, n_nodes)`` or a model index outside ``[0, n_models)`` (-1 is not "the last one");
* GPU indices that are not ``tensor_parallel`` distinct GPUs of the node, each in ``[0, gpus)``;
* GPU memory over its limit: on every GPU the replicas' ``bytes_per_gpu`` sum to at most the GPU's memory times
  the problem's memory factor (the placement invariant of :mod:`controlplane.placement.base`).

The checks after the first pass are vectorised over the whole plan: a few milliseconds for thousands of replicas.
"""

from __future__ import annotations

from itertools import chain
from operator import index

import numpy as np

from controlplane.placement.base import InvalidPlacementError

MEMORY_SLACK_BYTES = 1.0  # rounding of summed float sizes, as everywhere memory is compared


def checked_plan(net, policy: str, placed) -> list[tuple[int, int, tuple[int, ...]]]:
    """``placed`` as (node, model, GPUs) tuples of Python ints, in the policy's order, once every rule holds on
    ``net`` (a :class:`~controlplane.placement.network.Network` of the problem and fleet); else one
    :class:`InvalidPlacementError`."""
    who = f"policy {policy!r}"
    rows = []
    for i, item in enumerate(placed):
        try:
            n, m, gpus = item
            gpus = tuple(gpus)
            if type(n) is bool or type(m) is bool or any(type(g) is bool for g in gpus):
                raise TypeError
            row = (index(n), index(m), tuple(map(index, gpus)))
        except (TypeError, ValueError):
            raise InvalidPlacementError(
                f"{who}: placed[{i}] = {item!r} is not (node row, model index, GPU indices) of integers") from None
        rows.append(row)
    if not rows:
        return rows
    node = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    model = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    width = np.fromiter((len(r[2]) for r in rows), dtype=np.int64, count=len(rows))

    def first(bad: np.ndarray) -> int | None:
        hit = np.flatnonzero(bad)
        return int(hit[0]) if len(hit) else None

    if (i := first((node < 0) | (node >= net.n_nodes))) is not None:
        raise InvalidPlacementError(f"{who}: placed[{i}] = {rows[i]!r} names node row {rows[i][0]}; fleet "
                                    f"{net.fleet.name!r} has node rows 0 to {net.n_nodes - 1}")
    if (i := first((model < 0) | (model >= net.n_models))) is not None:
        raise InvalidPlacementError(f"{who}: placed[{i}] = {rows[i]!r} names model index {rows[i][1]}; "
                                    f"problem.models has indices 0 to {net.n_models - 1}")
    if (i := first(width != net.tp[model])) is not None:
        raise InvalidPlacementError(
            f"{who}: placed[{i}] = {rows[i]!r} puts {net.models[rows[i][1]]} on {width[i]} GPU(s); its "
            f"tensor_parallel is {net.tp[model[i]]}: a replica takes that many distinct GPUs of its node")
    rep = np.repeat(np.arange(len(rows)), width)
    gpu = np.fromiter(chain.from_iterable(r[2] for r in rows), dtype=np.int64, count=int(width.sum()))
    gpus_of = net.node_gpus[node[rep]]
    if (j := first((gpu < 0) | (gpu >= gpus_of))) is not None:
        i = int(rep[j])
        raise InvalidPlacementError(
            f"{who}: placed[{i}] = {rows[i]!r} names GPU {gpu[j]} of node {_node(net, rows[i][0])}, whose GPUs are "
            f"0 to {gpus_of[j] - 1}")
    key = rep * (int(net.node_gpus.max()) + 1) + gpu
    key.sort()
    if (j := first(key[1:] == key[:-1])) is not None:
        i = int(key[j] // (int(net.node_gpus.max()) + 1))
        raise InvalidPlacementError(f"{who}: placed[{i}] = {rows[i]!r} names a GPU twice; a replica takes "
                                    "distinct GPUs")
    start = np.concatenate(([0], np.cumsum(net.node_gpus)[:-1]))
    slot = start[node[rep]] + gpu
    used = np.bincount(slot, weights=net.bytes_per_gpu[model[rep]], minlength=int(net.node_gpus.sum()))
    limit = np.repeat(net.gpu_limit, net.node_gpus)
    if (s := first(used > limit + MEMORY_SLACK_BYTES)) is not None:
        n = int(np.searchsorted(start, s, side="right") - 1)
        g = s - int(start[n])
        on = np.flatnonzero(slot == s)  # (in the policy's order: the replica that crosses the bound is named)
        k = int(rep[on[first(np.cumsum(net.bytes_per_gpu[model[rep[on]]]) > limit[s] + MEMORY_SLACK_BYTES)]])
        factor = net.problem.memory_factor
        bound = (f"limit of {limit[s] / 1e9:g} GB ({net.fleet.nodes.gpu_memory_gb.iat[n]:g} GB x memory factor "
                 f"{factor:g})") if factor != 1 else f"{limit[s] / 1e9:g} GB of memory"
        raise InvalidPlacementError(
            f"{who}: placed[{k}] = {rows[k]!r} ({net.models[rows[k][1]]}) overfills GPU {g} of node "
            f"{_node(net, n)}: its {len(on)} replicas need {used[s] / 1e9:.2f} GB, over its {bound}")
    return rows


def _node(net, n: int) -> str:
    nodes = net.fleet.nodes
    return f"{nodes.node_id.iat[n]} (row {n}, {nodes.gpus.iat[n]} x {nodes.gpu.iat[n]})"
