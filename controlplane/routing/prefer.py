"""Shared building block of preference routers (prefix-aware, adapter-aware): take the best-scored nearby replica
unless that would pile load onto it.

A preference router scores each of the ``k`` nearest ready replicas (longest cached prefix, adapter loaded, ...)
and takes the highest score (ties: the nearer). The imbalance gate keeps it honest: when the pick's load (running +
queued per slot) exceeds the least-loaded of those ``k`` by more than ``max_imbalance``, the preference is dropped
and the caller falls back to its base policy, so a popular prefix or adapter never swamps one node.
"""

from __future__ import annotations

from controlplane.routing.base import QUEUE, START, Decision
from controlplane.state import READY, Replica, Request

PICKED, GATED, NONE = "picked", "gated", "none"


def pick_preferred(req: Request, cands: list[Replica], rtts: list[float], score, k: int,
                   max_imbalance: float) -> tuple[Decision | None, str]:
    """The best-scored of the ``k`` nearest up, ready replicas that can take ``req`` (start now or queue).

    ``score(replica) -> float``; only scores above 0 count as a preference. Returns (decision, PICKED) or
    (None, GATED) when the imbalance gate tripped, (None, NONE) when nothing scored above 0.
    """
    kv = req.kv_tokens
    best, best_score, best_start, min_load, seen = -1, 0.0, False, float("inf"), 0
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
        s = score(r)
        if s > best_score:
            best, best_score, best_start = i, s, start
    if best < 0:
        return None, NONE
    r = cands[best]
    if r.load - min_load > max_imbalance:
        return None, GATED
    return Decision(START if best_start else QUEUE, r, rtts[best]), PICKED
