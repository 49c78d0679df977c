"""What a scenario's run plans and estimates with beyond its ``[edge]`` table, for a gateway that serves it.

The simulator places a scenario's edge for its workload's demand (mean requests/s, model mix, mean prompt and
output per model) and its control plane estimates every replica's typical request with the workload's mean
generation prompt and output, through the scenario's service-time model (``perf``, slowed by
``prefill_time_scale``/``decode_time_scale``, memoised by :class:`controlplane.perf_cached.CachedPerf`).
``edgepop serve --scenario`` (a composition root: it generates the workload) hands those inputs to the gateway
as a :class:`ScenarioPlan`, with the scenario's own catalog file if it names one and the ``[edge]`` fields the
gateway config has no field of (``fill_idle_gpus``, ``utilisation_cap``, ``one_llm_per_gpu``, cold-start
``load_gbs`` and ``init_s``), so the live deployment places and routes as the simulated one does: the same
replicas, and the same decisions from routers that read the estimates (``nearest-balanced``, ``latency-load``,
``least-ttft``). Without a scenario the gateway keeps its own plan: 1 request/s spread equally over its models, a
512-token prompt with 128 output tokens, the roofline, the shipped catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.perf_models import build_run_perf

# The [edge] fields a scenario may set that the gateway config has no field of
EDGE_FIELDS = ("fill_idle_gpus", "utilisation_cap", "one_llm_per_gpu", "load_gbs", "init_s")


@dataclass(frozen=True)
class ScenarioPlan:
    """A scenario's planning and estimate inputs (see the module docstring).

    ``mix``: model -> share of the workload's requests (None: equal over the served models); ``shape``: the
    placement's ``{"prompt"|"output"|"prompt_mix": {model: ...}}``; ``typical_tokens``: (prompt, output) of the
    control plane's estimates; ``deployment``: :class:`controlplane.deployment.DeploymentConfig` fields of the
    scenario's ``[edge]`` that the gateway config does not set itself (:data:`EDGE_FIELDS`); ``catalog``: the
    scenario's own catalog file (None: the shipped one); ``pops``: the PoPs its edge is placed over (None: all).
    """

    perf: str = "roofline"
    prefill_time_scale: float = 1.0
    decode_time_scale: float = 1.0
    demand_rps: float = 1.0
    mix: dict | None = None
    shape: dict = field(default_factory=dict)
    typical_tokens: tuple = (512, 128)
    deployment: dict = field(default_factory=dict)
    catalog: str | None = None
    pops: tuple | None = None

    def load_catalog(self):
        """The catalog the served models are read from: the scenario's own, or the shipped one."""
        from controlplane.catalog import Catalog, default_catalog

        return Catalog.load(self.catalog) if self.catalog else default_catalog()

    def perf_model(self, topo):
        """The service-time model the control plane estimates with, as the simulator reads it."""
        return build_run_perf(self.perf, topo, self.prefill_time_scale, self.decode_time_scale)

    def deployment_inputs(self, served: list[str]) -> dict:
        """``build_deployment``'s demand, mix, shape and typical tokens for a gateway serving ``served``.

        The scenario's demand for the models it sends that are served; a served model its workload never sends
        gets the least share it gives any model (a gateway serves every model it lists). A gateway serving
        exactly the scenario's models places as the simulator does.
        """
        if self.mix is None:
            return {"demand_rps": self.demand_rps, "mix": None, "shape": dict(self.shape),
                    "typical_tokens": tuple(self.typical_tokens)}
        least = min(self.mix.values(), default=1.0)
        shares = {m: s for m, s in self.mix.items() if m in served}  # (in the scenario's order, as it places)
        same = len(shares) == len(self.mix) == len(served)
        shares.update({m: least for m in served if m not in shares})
        shape = {k: {m: v for m, v in table.items() if m in shares} for k, table in self.shape.items()}
        return {"demand_rps": self.demand_rps if same else self.demand_rps * sum(shares.values()), "mix": shares,
                "shape": shape, "typical_tokens": tuple(self.typical_tokens)}

    def mismatch(self, served: list[str], pops: list[str], all_pops: list[str]) -> str | None:
        """A line when the gateway serves other models or PoPs than the scenario's workload and edge (the live
        placement is then not the simulated one), or None. ``all_pops``: the topology's, which a scenario naming
        none is placed over."""
        if self.mix is None:
            return None
        unsent = [m for m in served if m not in self.mix]
        unserved = [m for m in self.mix if m not in served]
        scenario_pops = list(self.pops) if self.pops else list(all_pops)
        parts = ([f"serves {len(unsent)} model(s) its workload never sends ({', '.join(unsent)}: each placed for the "
                  "least share the workload gives a model)"] if unsent else []) + \
                ([f"does not serve {len(unserved)} model(s) the workload sends ({', '.join(unserved)})"]
                 if unserved else [])
        if set(pops) != set(scenario_pops):
            parts.append(f"serves {len(pops)} PoP(s) where the scenario's edge has {len(scenario_pops)}")
        if not parts:
            return None
        return ("note: this gateway " + " and ".join(parts) + "; its placement is not the simulator's for this "
                "scenario (--models and --pops as the scenario's workload and edge give it)")

    def describe(self) -> dict:
        """The plan as ``GET /edgepop/deployment`` shows it (the replay mirror estimates with the same inputs)."""
        return {"perf": self.perf, "prefill_time_scale": self.prefill_time_scale,
                "decode_time_scale": self.decode_time_scale, "typical_tokens": list(self.typical_tokens),
                "planning_rps": self.demand_rps, "catalog": self.catalog, **self.deployment}  # (pops: the config's)
