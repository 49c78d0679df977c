"""``nearest-balanced``: the nearest site with a free slot, and there the replica that will finish its work soonest.

``nearest-with-capacity`` takes the first replica that can start the request, so at a site holding many replicas of
a model (a cloud region, a big PoP) the first one fills up to its whole batch while its siblings idle: decode steps
slow down and prefills wait behind each other on one GPU although the site has GPUs to spare. A site's own load
balancer would spread the requests; this router does: among the replicas of the nearest site that can start the
request now, it takes the one with the least expected work, (running sequences + 1) x its typical request time
(from the control plane's performance model), so a faster GPU takes proportionally more (ties: the lower replica
id; without estimates, the fewest running sequences). When no replica anywhere can start it, the
nearest-with-capacity rule decides (a cold replica, a queue, or 3040).

``window_ms`` widens "the nearest site" to every replica within that many milliseconds of the nearest one that can
start the request. A cloud region balances over its dozens of co-located replicas; a PoP holds one or two, so with
the default 0 an edge request stays on its nearest PoP's replica whatever its load while PoPs a few milliseconds
away idle. The same window on both deployments gives each the same freedom: to trade up to ``window_ms`` of RTT
for a less loaded replica (ties still go to the nearer).
"""

from __future__ import annotations

import math
from bisect import bisect_right

from controlplane.ordering import SiteRtts
from controlplane.routing.base import ROUTERS, START, Decision, Router
from controlplane.state import Request


@ROUTERS.register("nearest-balanced")
class NearestBalanced(Router):
    """Nearest site that can start the request now, least expected work there (or, with ``window_ms`` > 0, among
    all replicas within ``window_ms`` of the nearest that can start it); else nearest-with-capacity."""

    def __init__(self, state, rng=None, window_ms: float = 0.0):
        super().__init__(state, rng)
        self.check_options(window_ms)
        self.window_ms = float(window_ms)

    @staticmethod
    def check_options(window_ms: float = 0.0) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if not (isinstance(window_ms, int | float) and math.isfinite(window_ms) and 0 <= window_ms <= 1000):
            raise ValueError(f"window_ms must be in [0, 1000] ms, got {window_ms!r}")

    def route(self, req: Request, now: float) -> Decision:
        state = self.state
        near = state._near.get(req.model)  # state.candidates(...), the cache hit inlined (read by ingress row)
        try:
            hit = near[req.ingress]
        except (TypeError, IndexError):  # no list of that model yet, or an ingress that is not a row index
            hit = None
        cands, rtts = hit if hit is not None else state.candidates(req.ingress, req.model)
        d = self._balanced(req, cands, rtts)
        if d is None and len(cands) < len(self.state.by_model.get(req.model, ())):
            cands, rtts = self.state.candidates(req.ingress, req.model, full=True)
            d = self._balanced(req, cands, rtts)
        return d if d is not None else self.nearest_with_capacity(req, cands, rtts)

    def _balanced(self, req: Request, cands, rtts) -> Decision | None:
        kv = req.kv_charge  # req.kv_tokens, inlined (once or twice per request)
        if kv < 0:
            kv = req.prompt_tokens + req.output_tokens
        stats = cands[0].stats if cands else None
        if stats is not None and stats.free <= 0:
            return None  # a saturated model: no replica can start it
        free = stats.free_set if stats is not None else ()
        # r.can_start(kv) and _work(r), inlined: these loops run over a whole site's replicas per request
        # (free_set holds exactly the up, READY replicas with a free slot). First the nearest that can start it,
        # then the rest of its site (candidates come site by site).
        for best, r in enumerate(cands):  # noqa: B007 (the index found is the loop's result)
            if r in free and r.kv_used + kv <= r.kv_capacity:
                break
        else:
            return None
        if self.window_ms > 0:
            return self._windowed(req, cands, rtts, best, free, kv)
        site, best_load = r.site, (r.active + 1) * (r.est_request_ms or 1.0)
        for i in range(best + 1, len(cands)):
            r = cands[i]
            if r.site != site:
                break
            if r in free and r.kv_used + kv <= r.kv_capacity:
                load = (r.active + 1) * (r.est_request_ms or 1.0)
                if load < best_load:
                    best, best_load = i, load
        # the list holds each site's replicas together: ending at this site, it may have been cut inside it
        if cands[-1].site == site and len(cands) < len(self.state.by_model.get(req.model, ())):
            full, full_rtts = self.state.candidates(req.ingress, req.model, full=True)
            return self._least_work(req, full, full_rtts, site=site) or Decision(START, cands[best], rtts[best])
        return Decision(START, cands[best], rtts[best])

    def _windowed(self, req: Request, cands, rtts, first: int, free, kv: int) -> Decision:
        """The least expected work among the replicas that can start ``req`` (``kv``: its KV tokens) within
        ``window_ms`` of ``cands[first]``, the nearest that can (the lists are in RTT order; ties go to the nearer)."""
        n = len(cands)
        # The window's end found by bisection, not by reading every RTT in it: a region's dozens of replicas share
        # one RTT, and a central deployment's RTT lists read each value through its site (SiteRtts: read here
        # without its methods, as window_end and indexing would).
        if type(rtts) is SiteRtts:
            site_rtt, pos = rtts.site_rtt, rtts.pos
            limit = site_rtt[pos[first]] + self.window_ms
            if not first and rtts.end_limit == limit:  # the window from the nearest replica, found before
                end = rtts.end
            else:
                end = bisect_right(pos, limit, first + 1, n, key=site_rtt.__getitem__)
                if not first:  # (a central deployment's list: one per user city, read again by its next request)
                    rtts.end_limit, rtts.end = limit, end
        else:
            limit = rtts[first] + self.window_ms
            end = bisect_right(rtts, limit, first + 1, n)
        chosen = r = cands[first]
        best_load = (r.active + 1) * (r.est_request_ms or 1.0)
        # A replica is taken when it has less work than the best so far and can start the request: the cheap load
        # comparison first, which most replicas of a central region's window fail (the same choice in either order).
        for r in cands[first + 1:end]:  # (a slice iterated: no index read per replica)
            if (load := (r.active + 1) * (r.est_request_ms or 1.0)) < best_load and r in free \
                    and r.kv_used + kv <= r.kv_capacity:
                chosen, best_load = r, load
        best = first if chosen is cands[first] else cands.index(chosen, first + 1, end)  # (each replica once)
        if end == n and n < len(self.state.by_model.get(req.model, ())):  # the truncated list ended in the window
            full, full_rtts = self.state.candidates(req.ingress, req.model, full=True)
            return self._least_work(req, full, full_rtts, limit=limit) or Decision(START, cands[best], rtts[best])
        return Decision(START, cands[best], site_rtt[pos[best]] if type(rtts) is SiteRtts else rtts[best])

    @staticmethod
    def _least_work(req: Request, cands, rtts, site=None, limit: float = math.inf) -> Decision | None:
        """Over the full candidate list (the truncated one ended inside the site or the window): the least-loaded
        replica that can start ``req``, of ``site`` when given, at most ``limit`` ms away (ties: the nearer)."""
        kv, best, best_load = req.kv_tokens, -1, 0.0
        for i, r in enumerate(cands):
            if rtts[i] > limit:
                break
            if (site is None or r.site == site) and r.can_start(kv):
                load = _work(r)
                if best < 0 or load < best_load:
                    best, best_load = i, load
        return None if best < 0 else Decision(START, cands[best], rtts[best])


def _work(r) -> float:
    """Expected work queued on ``r`` once this request joins: (running + 1) x its typical request time."""
    return (r.active + 1) * (r.est_request_ms or 1.0)
