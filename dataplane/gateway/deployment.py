"""The emulated deployment: which PoPs, which catalog models on which PoP's GPU nodes, and the engines behind them.

Placement is an explicit small table (model, node) built over ``controlplane.fleet.edge_fleet(topo, pops)``: by
default every model gets one replica at every configured PoP (on the first node there with room), or the PoPs
the config's ``[placement]`` table names. A :class:`controlplane.plane.ControlPlane` over that table routes every
request. All replicas of every catalog model are executed by the model's ``stand_in`` data-plane model through
ONE shared :class:`dataplane.service.DataPlane`: the emulated PoPs share this machine's cores, so the emulation is
faithful in geography and admission, not in aggregate compute (see docs/readme/gateway.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet, ingress_site_rtt
from controlplane.plane import AdmissionConfig, ControlPlane
from dataplane import registry
from dataplane.engine_batch import BatchConfig
from dataplane.engine_lm import LMEngineConfig
from dataplane.errors import InvalidInputError
from dataplane.gateway.config import GatewayConfig
from dataplane.lora import Adapter, AdapterError, load_adapter
from dataplane.prefix_cache import PrefixCacheConfig
from dataplane.service import DataPlane, DataPlaneConfig
from dataplane.session import SessionConfig
from edgepop.errors import UserError


def build_placement(cfg: GatewayConfig, plane: ControlPlane, fleet, topo) -> pd.DataFrame:
    """Add one READY replica per (model, PoP) to ``plane``; returns the placement table that resulted."""
    nodes = fleet.nodes
    rows = []
    for model in cfg.models:
        pops = cfg.placement.get(model, cfg.pops)
        stray = sorted(set(pops) - set(cfg.pops))
        if stray:
            raise UserError(f"gateway config: field 'placement': {model!r} names PoP(s) {', '.join(stray)} "
                            f"that are not among the served pops ({', '.join(cfg.pops)})")
        for pop in pops:
            at = np.flatnonzero(nodes.site_id.to_numpy() == pop)
            if len(at) == 0:
                raise UserError(f"gateway config: PoP {pop!r} has no GPU nodes in the topology")
            for node in at:
                if plane.state.fits(plane.catalog[model], int(node)) is None:
                    continue
                r = plane.add_replica(model, int(node), now=0.0, cold=False)
                if cfg.slots is not None:
                    r.slots = cfg.slots
                rows.append({"model": model, "node": int(node), "node_id": nodes.node_id.iloc[node],
                             "pop": pop, "gpu": r.gpu, "slots": r.slots, "replica": r.id})
                break
            else:
                raise UserError(f"gateway config: {model!r} does not fit on any GPU node of PoP {pop!r}")
    return pd.DataFrame(rows, columns=["model", "node", "node_id", "pop", "gpu", "slots", "replica"])


class Deployment:
    """Topology, catalog subset, edge fleet, control plane and the shared data plane of one gateway."""

    def __init__(self, cfg: GatewayConfig, topo=None):
        from topology import Topology

        self.config = cfg
        self.topo = topo if topo is not None else Topology.load(last_mile_ms=cfg.last_mile_ms)
        full = default_catalog()
        for m in cfg.models:
            if m not in full:
                raise UserError(f"gateway config: field 'models': {m!r} is not in the catalog "
                                "(`edgepop place --list-models` or controlplane/data/catalog.toml lists them)")
        for m in list(cfg.placement) + list(cfg.stand_ins) + list(cfg.lora_adapters):
            if m not in cfg.models:
                raise UserError(f"gateway config: {m!r} is configured but not listed in 'models'")
        self.catalog = full.subset(list(dict.fromkeys(cfg.models)))
        self.stand_in: dict[str, str] = {}
        for spec in self.catalog:
            name = cfg.stand_ins.get(spec.id, spec.stand_in)
            try:
                card = registry.get_card(name)
            except Exception as exc:
                raise UserError(f"gateway config: stand-in of {spec.id!r}: {exc}") from None
            if card.task != spec.task:
                raise UserError(f"gateway config: stand-in {name!r} serves {card.task}, but {spec.id!r} is "
                                f"{spec.task}")
            self.stand_in[spec.id] = name
        self.fleet = edge_fleet(self.topo, list(cfg.pops))
        self.rtt = ingress_site_rtt(self.topo, self.fleet)
        admission = AdmissionConfig(queue_limit=cfg.queue_limit, queue_timeout_s=cfg.queue_timeout_s)
        empty = pd.DataFrame({"model": pd.Series(dtype=object), "node": pd.Series(dtype=np.int64)})
        self.plane = ControlPlane(self.catalog, self.fleet, empty, self.rtt, router=cfg.router,
                                  admission=admission, rng=np.random.default_rng(cfg.seed))
        self.placement = build_placement(cfg, self.plane, self.fleet, self.topo)
        self.plane.state.precompute()
        self.site_ids = self.fleet.sites.site_id.to_numpy()
        self.node_ids = self.fleet.nodes.node_id.to_numpy()
        self.pop_ids = self.topo.pops.id.to_numpy()
        self.dp = DataPlane(DataPlaneConfig(
            session=SessionConfig(provider=cfg.provider, intra_op_threads=cfg.threads),
            lm=LMEngineConfig(max_batch=cfg.lm_max_batch, kv_budget_tokens=cfg.lm_kv_budget_tokens,
                              prefix_cache=PrefixCacheConfig(cfg.lm_prefix_block, cfg.lm_prefix_cache_mb << 20)
                              if cfg.lm_prefix_cache_mb else None),
            batch=BatchConfig(max_batch=cfg.encoder_max_batch, max_wait_ms=cfg.encoder_max_wait_ms)))
        self.adapters = self._load_adapters(cfg)

    def _load_adapters(self, cfg: GatewayConfig) -> dict[str, dict[str, Adapter]]:
        """Validate every declared LoRA adapter against its model's stand-in (one-line UserError if bad)."""
        out: dict[str, dict[str, Adapter]] = {}
        for model, table in cfg.lora_adapters.items():
            if self.catalog[model].task != "text-generation":
                raise UserError(f"gateway config: field 'lora_adapters': {model!r} is "
                                f"{self.catalog[model].task}; only text-generation models take adapters")
            lm = self.dp.enable_lora(self.stand_in[model])
            out[model] = {}
            for name, path in table.items():
                try:
                    out[model][name] = load_adapter(path, lm.spec)
                except AdapterError as exc:
                    raise UserError(f"gateway config: field 'lora_adapters': {model!r}.{name}: {exc}") from None
        return out

    def adapter(self, model: str, name) -> Adapter:
        """The adapter ``name`` of ``model``; an unknown one is bad input (400, code 5006)."""
        served = self.adapters.get(model, {})
        if not isinstance(name, str) or name not in served:
            listed = ", ".join(sorted(served)) or "none"
            raise InvalidInputError(f"field 'lora': adapter {name!r} is not served for {model!r} "
                                    f"(adapters: {listed})")
        return served[name]

    def warm(self) -> None:
        """Load every stand-in and start its engine, so no request pays for a model build."""
        for name in dict.fromkeys(self.stand_in.values()):
            self.dp.engine(name)

    def task(self, model: str) -> str:
        return self.catalog[model].task

    def describe(self) -> dict:
        """What this deployment is (``GET /edgepop/deployment``; the replay tool mirrors it in the simulator)."""
        c = self.config
        return {
            "pops": list(c.pops), "router": c.router, "queue_limit": c.queue_limit,
            "queue_timeout_s": c.queue_timeout_s, "delay": c.delay, "delay_scale": c.delay_scale,
            "last_mile_ms": self.topo.last_mile_ms, "default_location": list(c.default_location),
            "seed": c.seed, "scenario": c.scenario, "threads": c.threads, "provider": c.provider,
            "stand_ins": dict(self.stand_in),
            "lora_adapters": {m: sorted(t) for m, t in self.adapters.items()},
            "placement": self.placement.to_dict(orient="records"),
        }

    def close(self) -> None:
        self.dp.close()
