"""``adapter-aware``: wrap a routing policy so LoRA requests go where their adapter is loaded, within a load gate."""

from __future__ import annotations

from controlplane.routing.base import ROUTERS, Decision, Router
from controlplane.routing.prefer import GATED, PICKED, pick_preferred
from controlplane.state import Request
from edgepop.registry import merge_forwarded

LOADED, FREE_SLOT = 2.0, 1.0


@ROUTERS.register("adapter-aware", forward=("base", "nearest-with-capacity"))
class AdapterAware(Router):
    """Requests naming a LoRA adapter prefer, among the ``k`` nearest ready replicas, one with the adapter loaded,
    else one with a free adapter slot (a load that evicts nothing); a pick the imbalance gate rejects gives way
    to the best balanced replica (``controlplane.routing.prefer``); everything else goes to ``base`` (a policy
    name or a Router instance, e.g. the deployment's own router).
    Reads ``ClusterState.adapters`` (a :class:`controlplane.adapter_index.AdapterIndex`; None = LoRA off).
    """

    def __init__(self, state, rng=None, base: str | Router = "nearest-with-capacity", k: int = 8, max_imbalance: float = 0.25,
                 base_options: dict | None = None, **options):
        super().__init__(state, rng)
        self.check_options(k=k, max_imbalance=max_imbalance)
        if not isinstance(base, Router):  # base_options: options of the base named like ours (its own k)
            base = ROUTERS.create(base, state, rng, options=merge_forwarded(options, base_options, "base"))
        elif options or base_options:
            raise ValueError("options for the base router cannot be given with a Router instance as base "
                             f"(got {sorted({**options, **(base_options or {})})})")
        self.base = base
        self.k, self.max_imbalance = k, max_imbalance
        self.counts = {"adapter_picked": 0, "gated": 0, "base": 0}

    @staticmethod
    def check_options(base="nearest-with-capacity", k: int = 8, max_imbalance: float = 0.25, base_options=None,
                      **_base_options) -> None:
        """The options' values (the registry calls it when a scenario or config is read)."""
        if k < 1 or not max_imbalance >= 0:
            raise ValueError(f"k must be at least 1 and max_imbalance >= 0, got k={k!r}, max_imbalance="
                             f"{max_imbalance!r}")

    def route(self, req: Request, now: float) -> Decision:
        index = self.state.adapters
        if not req.adapter or index is None:
            return self.base.route(req, now)
        name = req.adapter

        def score(r) -> float:
            return LOADED if index.loaded(r, name) else FREE_SLOT if index.free_slot(r) else 0.0

        cands, rtts = self.state.candidates(req.ingress, req.model)
        d, why = pick_preferred(req, cands, rtts, score, self.k, self.max_imbalance)
        self.counts[{PICKED: "adapter_picked", GATED: "gated"}.get(why, "base")] += 1
        return d if d is not None else self.base.route(req, now)

    def forget(self, req: Request) -> None:
        self.base.forget(req)
