"""Routers not shipped with edgepop are checked: every decision they return must keep the routing contract.

The contract (docs/routing.md, :class:`~controlplane.routing.base.Router`): a :class:`Decision` whose action is

* START: ``replica`` is a replica of this control plane and of the request's model, up and READY, that can start
  the request now (``replica.can_start(req.kv_tokens)``);
* QUEUE: ``replica`` is a replica of this control plane and of the request's model (it may be COLD or LOADING: a
  cold one loads for it);
* REJECT: no replica (``code``: a Workers AI code, or None for 3040).

and, for START and QUEUE, ``rtt_ms`` is the RTT from the request's ingress to the replica's site
(``state.rtt[req.ingress, replica.site]``). The :class:`~controlplane.plane.ControlPlane` wraps a router whose class
is defined outside the :mod:`controlplane.routing` package, once, when it is built (:func:`check_outside`), in a
:class:`CheckedRouter`: a decision that breaks the contract, or an exception the router raises, becomes one
``UserError`` naming the router and the request. Shipped routers are not wrapped (they keep the contract, which
``tests/controlplane/test_router_contract.py`` checks by forcing the wrapper on them), so their per-request path
pays nothing.
"""

from __future__ import annotations

import math

from controlplane.routing.base import QUEUE, REJECT, START, Decision, Router
from controlplane.state import READY, Replica, Request
from edgepop.errors import UserError
from edgepop.registry import defined_in

SHIPPED_PACKAGE = "controlplane.routing"


def is_shipped(router: Router) -> bool:
    """Whether ``router``'s class is defined in the :mod:`controlplane.routing` package (shipped with edgepop)."""
    return defined_in(router, SHIPPED_PACKAGE)


def describe(router: Router) -> str:
    """``router 'name' (module.QualName)``, how errors name a router."""
    cls = type(router)
    return f"router {getattr(router, 'name', '?')!r} ({cls.__module__}.{cls.__qualname__})"


class CheckedRouter(Router):
    """Calls ``inner`` and checks each decision against the routing contract (see the module docstring); a broken
    decision or an exception other than ``UserError`` raised by ``inner`` is a one-line ``UserError``."""

    def __init__(self, inner: Router, state=None):
        super().__init__(inner.state if state is None else state, getattr(inner, "rng", None))
        self.inner = inner
        self.name = inner.name
        self.label = describe(inner)

    def route(self, req: Request, now: float) -> Decision:
        try:
            d = self.inner.route(req, now)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure of code edgepop does not ship: one line, chained)
            raise UserError(f"{self.label} failed on request {req.id}: {type(exc).__name__}: {exc} "
                            "(EDGEPOP_TRACEBACK=1 shows where)") from exc
        problem = self.violation(req, d)
        if problem is not None:
            raise UserError(f"{self.label} on request {req.id} (model {req.model}): {problem}")
        return d

    def forget(self, req: Request) -> None:
        try:
            self.inner.forget(req)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UserError(f"{self.label} failed in forget() on request {req.id}: "
                            f"{type(exc).__name__}: {exc}") from exc

    def violation(self, req: Request, d) -> str | None:
        """What is wrong with decision ``d`` for ``req`` (None: it keeps the contract)."""
        if not isinstance(d, Decision):
            return f"returned {d!r} ({type(d).__name__}), not a Decision"
        if d.action not in (START, QUEUE, REJECT):
            return f"returned action {d.action!r}; a Decision's action is {START!r}, {QUEUE!r} or {REJECT!r}"
        r = d.replica
        if d.action == REJECT:
            if r is not None:
                return f"rejected it but named replica {_name(r)}; a REJECT names no replica"
            if d.code is not None and (isinstance(d.code, bool) or not isinstance(d.code, int)):
                return f"rejected it with code {d.code!r}; a REJECT's code is a Workers AI code (an integer) or None"
            return None
        if r is None:
            return (f"{d.action.upper()} with replica None; {START!r} and {QUEUE!r} name a replica of the request's "
                    "model")
        replicas = self.state.replicas
        rid = getattr(r, "id", None)
        if not (isinstance(r, Replica) and type(rid) is int and 0 <= rid < len(replicas) and replicas[rid] is r):
            return f"{d.action.upper()} on {r!r}, which is not a replica of this control plane"
        if r.spec.id != req.model:
            return (f"{d.action.upper()} on replica {_name(r)}, a replica of {r.spec.id}, not of the request's "
                    f"model")
        if d.action == START and not r.can_start(req.kv_tokens):
            return (f"START on replica {_name(r)}, which cannot start it now ({_why_not(r, req)}); START needs a "
                    "replica that is up, READY and can_start(req.kv_tokens): QUEUE or REJECT instead")
        rtt = float(self.state.rtt[req.ingress, r.site])
        got = d.rtt_ms
        if isinstance(got, bool) or not isinstance(got, int | float) or not math.isclose(got, rtt, rel_tol=1e-9,
                                                                                        abs_tol=1e-9):
            return (f"{d.action.upper()} on replica {_name(r)} with rtt_ms {got!r}; the RTT from ingress "
                    f"{req.ingress} to its site is {rtt:g} ms (state.rtt[ingress, replica.site])")
        return None


def _name(r) -> str:
    return f"{getattr(r, 'id', '?')} (node row {getattr(r, 'node', '?')})"


def _why_not(r: Replica, req: Request) -> str:
    if not r.up:
        return "its node is down"
    if r.status != READY:
        return f"it is {r.status}"
    if r.active >= r.slots:
        return f"{r.active} of its {r.slots} slots are busy"
    return f"KV {r.kv_used} + {req.kv_tokens} tokens > its {r.kv_capacity}"


def check_outside(router: Router, state=None, force: bool = False) -> Router:
    """``router`` with every router in it whose class is not shipped (:func:`is_shipped`) wrapped in a
    :class:`CheckedRouter`, once: the router itself when it is not shipped, else the routers it holds (a
    fallback, a base), replaced in place. ``force``: wrap ``router`` itself whatever its class (what the contract
    test does to the shipped routers). ``state``: the control plane's cluster state (default: the router's)."""
    if isinstance(router, CheckedRouter):
        return router
    if force or not is_shipped(router):
        return CheckedRouter(router, state)
    for key, value in list(vars(router).items()):
        if isinstance(value, Router):
            setattr(router, key, check_outside(value, state))
    return router
