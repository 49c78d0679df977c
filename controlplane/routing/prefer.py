"""Shared building block of preference routers (prefix-aware, adapter-aware): take the best-scored nearby replica
unless that would pile load onto it.

A preference router scores each of the ``k`` nearest ready replicas (longest cached prefix, adapter loaded, ...)
and takes the highest score (ties: the nearer). The imbalance gate keeps it honest: a replica whose load (running +
queued per slot) exceeds the least-loaded of those ``k`` by more than ``max_imbalance`` is out of the running, and
when that drops the best-scored one, the request takes the best of the balanced rest -- the nearest of them when
none scores -- so a popular prefix or adapter never swamps one node (even when it sits on the nearest replica).
"""

from __future__ import annotations

from controlplane.routing.base import QUEUE, START, Decision
from controlplane.state import READY, Replica, Request

PICKED, GATED, NONE = "picked", "gated", "none"


def pick_preferred(req: Request, cands: list[Replica], rtts: list[float], score, k: int,
                   max_imbalance: float) -> tuple[Decision | None, str]:
    """The best-scored of the ``k`` nearest up, ready replicas that can take ``req`` (start now or queue).

    ``score(replica) -> float``; only scores above 0 count as a preference. Returns (decision, PICKED); or
    (decision, GATED) when the gate dropped the best-scored replica and the decision is the best balanced one;
    or (None, NONE) when nothing scored above 0 or nothing nearby can take the request (the caller's base policy
    decides then).
    """
    kv = req.kv_tokens
    min_load, seen, able = float("inf"), 0, []
    for i, r in enumerate(cands):
        if not r.up or r.status != READY:
            continue
        seen += 1
        if seen > k:
            break
        load = r.load
        if load < min_load:
            min_load = load
        start = r.can_start(kv)
        if not start and (req.reject_if_busy or not r.has_queue_room()):
            continue
        able.append((i, start, load, score(r)))
    if not able or max(a[3] for a in able) <= 0:
        return None, NONE
    best = max(able, key=lambda a: (a[3], -a[0]))
    why = PICKED
    if best[2] - min_load > max_imbalance:
        balanced = [a for a in able if a[2] - min_load <= max_imbalance]
        if not balanced:
            return None, NONE
        best, why = max(balanced, key=lambda a: (a[3], -a[0])), GATED
    i, start = best[0], best[1]
    return Decision(START if start else QUEUE, cands[i], rtts[i]), why
