"""Capacity matching: give every GPU a replica, in proportion to demand, so no owned GPU sits idle.

A placement policy decides where replicas go for its own objective (latency, cost); it may leave GPUs without any
replica, and a deployment would then own GPUs it never uses while requests queue elsewhere. :func:`fill_idle_gpus`
puts a replica on each such GPU (or group of GPUs of one node, for a tensor-parallel model) by water-filling: the
next replica goes to the model whose planned load per unit of placed capacity (demand / replica capacity, the
*pressure*) is highest in the GPU's scope, so placed capacity follows demand. A scope is a set of sites that share
demand: one cloud region for a central baseline (its own users), the whole fleet for the edge. Only idle GPUs are
filled, one replica each: replicas are never stacked on a GPU that already computes for another.
"""

from __future__ import annotations

import numpy as np

from controlplane.placement.packing import GpuLedger


def idle_gpus(ledger: GpuLedger) -> list[np.ndarray]:
    """Per node, the indices of its GPUs that hold no replica."""
    limit = ledger.net.gpu_limit
    return [np.flatnonzero(free >= limit[n] - 1.0) for n, free in enumerate(ledger.free)]


def place_on(ledger: GpuLedger, node: int, model: int, gpus: tuple[int, ...]) -> tuple[int, ...]:
    """Seat one replica of ``model`` on the given GPUs of ``node`` (they must have room)."""
    return ledger.seat(node, model, gpus)


def fill_idle_gpus(net, ledger: GpuLedger, placed: list, scopes: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Fill the idle GPUs of each scope; returns how many replicas were added (appended to ``placed``).

    ``scopes``: (site indices, demand rps per model) pairs. Within a scope, while an idle GPU group can take a
    model with demand there, the model of highest pressure (demand / capacity placed in the scope; a model with no
    replica there first) gets a replica on the node where it runs fastest (ties: most idle GPUs, then lowest row),
    a single-GPU model preferring nodes whose idle GPUs no wanted multi-GPU model could use.
    """
    idle = idle_gpus(ledger)
    n_idle = np.array([len(g) for g in idle])
    counts = np.zeros((net.n_nodes, net.n_models), dtype=int)
    for node, m, _ in placed:
        counts[node, m] += 1
    added = 0
    for sites, demand in scopes:
        members = np.flatnonzero(np.isin(net.node_site, sites))
        if members.size == 0:
            continue
        demand = np.asarray(demand, dtype=float)
        capacity = (counts[members] * net.cap[members]).sum(axis=0)
        wanted = demand > 0
        while True:
            room = n_idle[members]
            if not room.any():
                break
            # A model fits an idle group on a node when the node holds it and has tp idle GPUs.
            ok = net.fits[members] & (room[:, None] >= net.tp[None, :]) & wanted[None, :]
            usable = ok.any(axis=0)
            if not usable.any():
                break
            with np.errstate(divide="ignore"):
                pressure = np.where(capacity > 0, demand / np.maximum(capacity, 1e-300), np.inf)
            pressure = np.where(usable, pressure, -1.0)
            m = int(np.argmax(pressure))  # ties: the lower model index
            # Fastest node for m; a single-GPU model keeps off idle groups that a wanted multi-GPU model could use.
            score = net.cap[members, m] + 1e-6 * room
            if net.tp[m] == 1:
                score = score - 1e12 * (ok & (net.tp[None, :] > 1)).any(axis=1)
            score = np.where(ok[:, m], score, -np.inf)
            node = int(members[int(np.argmax(score))])
            gpus = tuple(int(g) for g in idle[node][: int(net.tp[m])])
            placed.append((node, m, place_on(ledger, node, m, gpus)))
            idle[node] = idle[node][int(net.tp[m]):]
            n_idle[node] -= int(net.tp[m])
            counts[node, m] += 1
            capacity[m] += net.cap[node, m]
            added += 1
    return added


def fleet_scope(net) -> list[tuple[np.ndarray, np.ndarray]]:
    """One scope over every site, with the problem's total demand per model (the edge's)."""
    demand = np.zeros(net.n_models)
    np.add.at(demand, net.pair_model, net.pair_demand)
    return [(np.arange(net.n_sites), demand)]


def with_idle_gpus_filled(placement):
    """``placement`` plus a replica on each of its idle GPUs (one scope: the whole fleet), as a new Placement;
    the same object when no GPU was idle."""
    from controlplane.placement.result import Placement

    net = placement.net
    ledger = GpuLedger(net)
    index = {m: i for i, m in enumerate(net.models)}
    placed = []
    for node, model, gpus in zip(placement.table.node, placement.table.model, placement.table.gpu_index,
                                 strict=True):
        placed.append((int(node), index[model], place_on(ledger, int(node), index[model], tuple(gpus))))
    if not fill_idle_gpus(net, ledger, placed, fleet_scope(net)):
        return placement
    solver = dict(placement.solver, idle_gpus_filled=len(placed) - len(placement.table))
    filled = Placement(placement.problem, placement.fleet, placement.policy, placed, placement.dropped, solver)
    filled.from_cache = placement.from_cache  # the plan it completes was read back or computed
    return filled
