"""Packing replicas onto the GPUs of a node: several models may share a GPU, memory is never over-committed.

A replica of a model with ``tensor_parallel = k`` takes ``bytes_per_gpu`` on each of ``k`` distinct GPUs of one
node. :class:`GpuLedger` keeps the free bytes of every GPU and what each node holds. ``add`` places a replica
first-fit (the lowest-index GPUs with room), so adds in decreasing size order are first-fit decreasing;
``add_repacking`` falls back to an exact search that re-seats everything the node already holds (small nodes).

With the problem's ``one_llm_per_gpu`` (what the simulator's deployments use), a GPU computes for at most one
generative replica (encoders may still share it): the simulator runs co-located replicas as if each had the GPU
to itself, so two language models on one GPU would double the compute the GPU really has.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

# Float slack for comparing byte counts that were summed in a different order.
_SLACK_BYTES = 1.0
# Exact re-seating is a depth-first search; bound its work so a hopeless node costs milliseconds.
_REPACK_STEPS = 20_000


class GpuLedger:
    """Free memory (bytes) per GPU of every node of a :class:`~controlplane.placement.network.Network`."""

    def __init__(self, net):
        self.net = net
        self.free = [np.full(int(g), float(limit)) for g, limit in zip(net.node_gpus, net.gpu_limit, strict=True)]
        self.held: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in range(net.n_nodes)]
        self.busy = np.zeros(net.n_nodes)  # GPUs spanned by the replicas held (spreads load over equal nodes)
        self.solo = [np.zeros(int(g), dtype=bool) for g in net.node_gpus]  # holds an exclusive (LLM) replica
        # per model, as plain Python values: slot() runs millions of times and numpy scalar reads dominate it
        self._tp = [int(t) for t in net.tp]
        self._bytes = [float(b) for b in net.bytes_per_gpu]
        self._need = [b - _SLACK_BYTES for b in self._bytes]
        self._exclusive = [bool(e) for e in net.exclusive]
        # Per node, its GPUs' free bytes and exclusive flags as Python lists for slot(), made when first asked
        # after a change (None: changed since; every change goes through seat, remove or add_repacking).
        self._lists: list[tuple[list[float], list[bool]] | None] = [None] * net.n_nodes

    def slot(self, node: int, model: int) -> tuple[int, ...] | None:
        """The GPUs a new replica of ``model`` would take on ``node`` (first fit), or None if it does not fit."""
        tp, need = self._tp[model], self._need[model]
        # a node has at most a few GPUs: a Python scan beats a numpy call here (greedy asks millions of times)
        lists = self._lists[node]
        if lists is None:
            lists = self._lists[node] = (self.free[node].tolist(), self.solo[node].tolist())
        free, solo = lists
        if self._exclusive[model]:
            room = [g for g, f in enumerate(free) if f >= need and not solo[g]]
        else:
            room = [g for g, f in enumerate(free) if f >= need]
        return tuple(room[:tp]) if len(room) >= tp else None

    def add(self, node: int, model: int) -> tuple[int, ...] | None:
        """Place one replica; returns its GPUs, or None (and changes nothing) when it does not fit."""
        gpus = self.slot(node, model)
        if gpus is not None:
            self.seat(node, model, gpus)
        return gpus

    def seat(self, node: int, model: int, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """Record a replica of ``model`` on the given GPUs of ``node`` (the caller checked that they have room)."""
        free, size = self.free[node], self._bytes[model]
        for g in gpus:  # a replica spans a few GPUs: scalar updates beat a fancy-indexed one
            free[g] -= size
        self.held[node].append((model, gpus))
        self.busy[node] += self._tp[model]
        if self._exclusive[model]:
            solo = self.solo[node]
            for g in gpus:
                solo[g] = True
        self._lists[node] = None
        return gpus

    def remove(self, node: int, model: int, gpus: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """Take one replica of ``model`` off ``node`` (the one on ``gpus``, or the last added); returns its GPUs."""
        held = self.held[node]
        i = max(i for i, (m, g) in enumerate(held) if m == model and (gpus is None or g == gpus))
        _, gpus = held.pop(i)
        free, size = self.free[node], self._bytes[model]
        for g in gpus:
            free[g] += size
        self.busy[node] -= self._tp[model]
        if self._exclusive[model]:
            solo = self.solo[node]
            for g in gpus:
                solo[g] = False  # a GPU holds at most one exclusive replica
        self._lists[node] = None
        return gpus

    def add_repacking(self, node: int, model: int) -> bool:
        """Place one replica, re-seating the node's replicas if first fit fails (exact search, bounded)."""
        if self.add(node, model) is not None:
            return True
        if self.net.node_gpus[node] > 4:  # large nodes: first fit is all we try
            return False
        models = sorted([m for m, _ in self.held[node]] + [model],
                        key=lambda m: (-self.net.bytes_per_gpu[m], -self.net.tp[m], m))
        seats = _seat(self.net, models, float(self.net.gpu_limit[node]), int(self.net.node_gpus[node]))
        if seats is None:
            return False
        self.free[node][:] = float(self.net.gpu_limit[node])
        self.held[node] = []
        self.busy[node] = 0.0
        self.solo[node][:] = False
        self._lists[node] = None
        for m, gpus in zip(models, seats, strict=True):
            self.seat(node, m, gpus)
        return True

    def placements(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """Every replica held, as (node, model, GPUs)."""
        return [(node, m, gpus) for node, held in enumerate(self.held) for m, gpus in held]


def _seat(net, models: list[int], limit: float, n_gpus: int) -> list[tuple[int, ...]] | None:
    """GPUs for each of ``models`` (largest first) on one node with ``n_gpus`` GPUs of ``limit`` bytes, or None."""
    free = [limit] * n_gpus
    solo = [False] * n_gpus
    seats: list[tuple[int, ...]] = []
    steps = 0

    def place(i: int) -> bool:
        nonlocal steps
        if i == len(models):
            return True
        steps += 1
        if steps > _REPACK_STEPS:
            return False
        need, tp = net.bytes_per_gpu[models[i]] - _SLACK_BYTES, int(net.tp[models[i]])
        exclusive = bool(net.exclusive[models[i]])
        tried = set()
        for gpus in combinations(range(n_gpus), tp):
            key = tuple(sorted((free[g], solo[g]) for g in gpus))
            if key in tried or any(free[g] < need or (exclusive and solo[g]) for g in gpus):
                continue  # GPUs with equal free memory (and LLM flag) are interchangeable: try one of them
            tried.add(key)
            for g in gpus:
                free[g] -= need + _SLACK_BYTES
                solo[g] = solo[g] or exclusive
            seats.append(gpus)
            if place(i + 1):
                return True
            seats.pop()
            for g in gpus:
                free[g] += need + _SLACK_BYTES
                if exclusive:
                    solo[g] = False
        return False

    return seats if place(0) else None


def pack_groups(net, groups: list[np.ndarray], counts: np.ndarray, ledger: GpuLedger | None = None,
                fallback: list[np.ndarray] | None = None):
    """Pack ``counts[g, m]`` replicas onto the nodes of each group ``groups[g]`` (arrays of node rows).

    Replicas go in decreasing per-GPU size; each goes to the least busy node of its group where it fits (first
    fit over that node's GPUs, then an exact re-seat on small nodes). Once every group is packed, replicas that
    did not fit try the nodes of ``fallback[g]`` (e.g. the other nodes of the same site). Returns
    (ledger, dropped) with ``dropped`` a list of (group, model) that fit nowhere.
    """
    ledger = ledger or GpuLedger(net)
    order = sorted(range(net.n_models), key=lambda m: (-net.bytes_per_gpu[m], -net.tp[m], m))
    left = []
    for g, members in enumerate(groups):
        members = np.asarray(members, dtype=int)
        for m in order:
            for _ in range(int(counts[g, m])):
                ranked = members[np.argsort(ledger.busy[members] / net.node_gpus[members], kind="stable")]
                if not any(ledger.add(int(n), m) is not None for n in ranked) and \
                        not any(ledger.add_repacking(int(n), m) for n in ranked):
                    left.append((g, m))
    dropped = []
    for g, m in left:
        spare = fallback[g] if fallback is not None else ()
        if not any(net.fits[n, m] and ledger.add_repacking(int(n), m) for n in spare):
            dropped.append((g, m))
    return ledger, dropped


def pack_nodes(net, counts: np.ndarray, ledger: GpuLedger | None = None):
    """Pack ``counts[node, m]`` replicas per node; see :func:`pack_groups`."""
    return pack_groups(net, [np.array([n]) for n in range(net.n_nodes)], counts, ledger)
