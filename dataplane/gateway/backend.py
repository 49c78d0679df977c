"""What serves the gateway's requests: the deployment (topology, fleet, placement, control plane) and the engines.

The deployment is built by :func:`controlplane.deployment.build_deployment`, the same builder the simulator uses,
from the gateway config's deployment part (:meth:`GatewayConfig.deployment_config`): by default the ``per-pop``
placement, one replica of every served model at every configured PoP (on the first node there with room), or
the PoPs the config's ``[placement]`` table names; a scenario may name another policy, router, router options and
autoscaler, which then apply live exactly as they do simulated.

Every replica the control plane placed gets an engine of its own (its own batch, queue and KV cache) over the
model's ``stand_in`` data-plane model, as the control plane believes it does: requests at different emulated
PoPs are never batched together. The engines share one loaded model per stand-in and this machine's cores, so
the emulation is faithful in geography, admission and batching, not in aggregate compute: the simulator mirrors
the shared cores when asked to model a live host (``sim.live``, docs/fidelity.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import UTC, datetime

import pandas as pd

from controlplane.adapter_index import AdapterIndex
from controlplane.catalog import AdapterSpec
from controlplane.deployment import Deployment, build_deployment
from controlplane.prefix_index import PrefixIndex
from dataplane import registry
from dataplane.engine_batch import BatchConfig
from dataplane.engine_lm import LMEngineConfig
from dataplane.errors import InvalidInputError
from dataplane.gateway.config import GatewayConfig
from dataplane.gateway.scenario_plan import ScenarioPlan
from dataplane.lora import Adapter, AdapterError, load_adapter
from dataplane.prefix_cache import PrefixCacheConfig
from dataplane.service import DataPlane, DataPlaneConfig
from dataplane.session import PROVIDERS, SessionConfig, resolve_provider
from edgepop.errors import UserError
from edgepop.rng import streams


class Backend:
    """Topology, served catalog, :class:`Deployment` (control plane included) and the data plane (one engine per
    replica)."""

    def __init__(self, cfg: GatewayConfig, topo=None):
        from topology import Topology

        self.config = cfg
        # The topology as the simulator shapes a scenario's (sim.run.prepare): last mile, GPU inventory, anycast,
        # demand weighting.
        topo = topo if topo is not None else Topology.load(last_mile_ms=cfg.last_mile_ms, last_mile=cfg.last_mile)
        self.topo = topo.shaped(cfg.last_mile_ms, cfg.last_mile, cfg.gpu_inventory_scale, cfg.anycast_misroute,
                                seed=cfg.seed, demand_weight=cfg.demand_weight)
        # A scenario's demand, estimate inputs and catalog (its workload's), or the gateway's own: it places and
        # routes as the simulator does for the same scenario.
        self.plan = cfg.scenario_plan or ScenarioPlan()
        full = self.plan.load_catalog()
        for m in cfg.models:
            if m not in full:
                where = f"the scenario's catalog {self.plan.catalog}" if self.plan.catalog else \
                    "the catalog (`edgepop place --list-models` or controlplane/data/catalog.toml lists them)"
                raise UserError(f"{cfg.source}: field 'models': {m!r} is not in {where}")
        for name in ("placement", "stand_ins", "lora_adapters"):
            for m in getattr(cfg, name):
                if m not in cfg.models:
                    raise UserError(f"{cfg.source}: field {name!r}: {m!r} is configured but not listed in 'models'")
        known = set(self.topo.pops.id)
        unknown = [p for p in cfg.pops if p not in known]
        if unknown:  # (the fleet's own check would not name the config field)
            raise UserError(f"{cfg.source}: field 'pops': unknown PoP id(s) {', '.join(map(repr, unknown[:5]))} "
                            "(topology/data/pops.csv lists them)")
        catalog = full.subset(list(dict.fromkeys(cfg.models)))
        self.stand_in: dict[str, str] = {}
        for spec in catalog:
            name = cfg.stand_ins.get(spec.id, spec.stand_in)
            at = f"{cfg.source}: field 'stand_ins'" if spec.id in cfg.stand_ins else cfg.source  # (or the catalog's)
            try:
                card = registry.get_card(name)
            except Exception as exc:
                raise UserError(f"{at}: stand-in of {spec.id!r}: {exc}") from None
            if card.task != spec.task:
                raise UserError(f"{at}: stand-in {name!r} serves {card.task}, but {spec.id!r} is {spec.task}")
            self.stand_in[spec.id] = name
        self.dp = DataPlane(DataPlaneConfig(
            session=SessionConfig(provider=cfg.provider, intra_op_threads=cfg.threads),
            lm=LMEngineConfig(max_batch=cfg.lm_max_batch, kv_budget_tokens=cfg.lm_kv_budget_tokens,
                              prefix_cache=PrefixCacheConfig(cfg.lm_prefix_block, cfg.lm_prefix_cache_mb << 20)
                              if cfg.lm_prefix_cache_mb else None),
            batch=BatchConfig(max_batch=cfg.encoder_max_batch, max_wait_ms=cfg.encoder_max_wait_ms)))
        self.adapters = self._load_adapters(cfg, catalog)
        # The served adapters are declared on their catalog entries, so the control plane's adapter slots and the
        # adapter-aware router know them as they know the simulator's.
        self.catalog = catalog.with_adapters({
            m: tuple(AdapterSpec(n, m, a.rank, float(sum(x.nbytes + y.nbytes for x, y in a.tensors.values())))
                  for n, a in table.items())
            for m, table in self.adapters.items()})
        rng = streams(cfg.seed)  # the simulator's streams for the same seed: the same router draws
        # The plane's clock is the simulator's: seconds since a start whose UTC time is known. Live that is now,
        # on the real clock (a scheduled autoscaler's start_utc and day_s are the real ones, whatever its options
        # say: a compressed day would put its working hours at the wrong time).
        self.started_utc = datetime.now(UTC)
        self.t0 = time.monotonic()
        self.deployment_cfg = d = cfg.deployment_config()
        if d.autoscaler == "scheduled":
            d = self.deployment_cfg = replace(d, autoscaler_options={
                **d.autoscaler_options, "start_utc": self.started_utc.isoformat(), "day_s": 86_400.0})
        self.deployment: Deployment = build_deployment(
            "edge", d, self.topo, self.catalog, rng_place=rng["place_edge"],
            rng_route=rng["route_edge"], slots=cfg.slots, perf=self.plan.perf_model(self.topo),
            prefix=PrefixIndex(cfg.lm_prefix_block) if cfg.lm_prefix_cache_mb else None,
            adapters=AdapterIndex(cfg.lora_slots) if self.adapters else None,
            **self.plan.deployment_inputs(list(self.catalog.ids)))
        self.plane = self.deployment.plane
        self._concurrency: dict[str, int] = {}  # engine key -> its batch size
        self.plane.state.precompute()
        fleet = self.deployment.fleet
        self.site_ids = fleet.sites.site_id.to_numpy()
        self.node_ids = fleet.nodes.node_id.to_numpy()
        self.pop_ids = self.topo.pops.id.to_numpy()

    def _load_adapters(self, cfg: GatewayConfig, catalog) -> dict[str, dict[str, Adapter]]:
        """Validate every declared LoRA adapter against its model's stand-in (one-line UserError if bad)."""
        out: dict[str, dict[str, Adapter]] = {}
        for model, table in cfg.lora_adapters.items():
            if catalog[model].task != "text-generation":
                raise UserError(f"{cfg.source}: field 'lora_adapters': {model!r} is "
                                f"{catalog[model].task}; only text-generation models take adapters")
            lm = self.dp.enable_lora(self.stand_in[model])
            out[model] = {}
            for name, path in table.items():
                try:
                    out[model][name] = load_adapter(path, lm.spec)
                except AdapterError as exc:
                    raise UserError(f"{cfg.source}: field 'lora_adapters': {model!r}.{name}: {exc}") from None
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
        """Load every stand-in and start every replica's engine, so no request pays for a model build."""
        for r in self.plane.state.replicas:
            self.dp.engine(self.stand_in[r.model], r.id)

    def task(self, model: str) -> str:
        return self.catalog[model].task

    def pop_of(self, replica) -> str:
        """The id of the PoP (site) a replica is at."""
        return str(self.site_ids[replica.site])

    def engine_key(self, replica) -> str:
        """The engine that executes ``replica``'s requests: the replica's own, ``<stand-in>@<replica id>`` (the
        engine thread's name and its metrics label)."""
        return f"{self.stand_in[replica.model]}@{replica.id}"

    def engine_concurrency(self, key: str) -> int:
        """Requests the engine ``key`` runs at once (its batch); asked on every shedding estimate, so memoised."""
        n = self._concurrency.get(key)
        if n is None:
            task = registry.get_card(key.rsplit("@", 1)[0]).task
            n = self._concurrency[key] = (self.config.lm_max_batch if task == "text-generation"
                                          else self.config.encoder_max_batch)
        return n

    def parallel_engines(self) -> float | None:
        """How many engines the host runs at full speed at once: on CPU the engines share its cores (each uses
        ``threads`` of them, all with 0), so a third busy engine on two cores slows the other two; None on GPUs,
        where each replica's engine is its own device."""
        if resolve_provider(self.config.provider) != PROVIDERS["cpu"]:
            return None
        cores = os.cpu_count() or 1
        return cores / min(self.config.threads, cores) if self.config.threads else 1.0

    def placement(self) -> pd.DataFrame:
        """Every replica the control plane knows now, with its ``status`` (``ready``, ``loading``, or ``cold``:
        scaled to zero by the autoscaler, its GPU memory freed); an autoscaler adds rows and changes statuses."""
        reps = self.plane.state.replicas
        return pd.DataFrame(
            {"model": [r.model for r in reps], "node": [r.node for r in reps],
             "node_id": [self.node_ids[r.node] for r in reps], "pop": [self.site_ids[r.site] for r in reps],
             "gpu": [r.gpu for r in reps], "slots": [r.slots for r in reps], "replica": [r.id for r in reps],
             "status": [r.status for r in reps]},
            columns=["model", "node", "node_id", "pop", "gpu", "slots", "replica", "status"])

    def describe(self) -> dict:
        """What this deployment is (``GET /edgepop/deployment``; the replay tool mirrors it in the simulator)."""
        c = self.config
        d = self.deployment_cfg
        return {
            "pops": list(c.pops), "router": d.router, "router_options": dict(d.router_options),
            "autoscaler": d.autoscaler, "autoscaler_options": dict(d.autoscaler_options),
            "placement_policy": d.placement, "queue_limit": d.queue_limit, "queue_timeout_s": d.queue_timeout_s,
            "delay": c.delay, "delay_scale": c.delay_scale,
            "last_mile_ms": self.topo.last_mile_ms, "last_mile": c.last_mile,
            "gpu_inventory_scale": c.gpu_inventory_scale, "anycast_misroute": c.anycast_misroute,
            "demand_weight": c.demand_weight, "default_location": list(c.default_location),
            "seed": c.seed, "scenario": c.scenario, **self.plan.describe(),
            "threads": c.threads, "provider": c.provider,
            "host_cores": os.cpu_count(),
            "engines": "per-replica", "lm_max_batch": c.lm_max_batch, "lm_kv_budget_tokens": c.lm_kv_budget_tokens,
            "stand_ins": dict(self.stand_in),
            "prefix_block": c.lm_prefix_block if c.lm_prefix_cache_mb else None,
            "lora_adapters": {m: sorted(t) for m, t in self.adapters.items()},
            "placement": self.placement().to_dict(orient="records"),
        }

    def close(self) -> None:
        self.dp.close()

