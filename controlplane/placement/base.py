"""The placement problem, the policy interface and the policy registry.

A placement decides how many replicas of each model run on each GPU node of a fleet, and on which GPUs of the
node. Every policy receives the same :class:`PlacementProblem` and returns a
:class:`~controlplane.placement.result.Placement` scored by the shared evaluator
(:mod:`controlplane.placement.evaluate`), so policies are compared on one objective.

Invariant (checked on every plan when its :class:`~controlplane.placement.result.Placement` is built, and by
:meth:`Placement.check_memory`): on every GPU the sum of
``bytes_per_gpu`` of the replicas it holds is at most the GPU's memory times :attr:`PlacementProblem.memory_factor`,
which is 1 unless the problem was built with ``overcommit=True``; a replica of a model with ``tensor_parallel=k``
occupies exactly ``k`` distinct GPUs of one node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, ModelSpec, default_catalog
from controlplane.fleet import Fleet, edge_fleet, ingress_site_rtt
from controlplane.forecast import ingress_demand
from controlplane.perf import PerfModel, Roofline
from edgepop.errors import UserError, is_real
from edgepop.registry import Registry, defined_in
from topology import Topology


class PlacementError(UserError):
    """A placement cannot be computed from this input."""


class UnknownPolicyError(PlacementError):
    """No placement policy of that name is registered."""


class ModelTooLargeError(PlacementError):
    """A demanded model fits no node of the fleet (memory per GPU or GPUs per node)."""


class InfeasiblePlacementError(PlacementError):
    """Demand exists that no placement in this fleet can give a replica."""


class InvalidPlacementError(PlacementError):
    """A policy returned a plan that breaks the placement rules (a node, model or GPU index out of range, or GPU
    memory over its limit; see :mod:`controlplane.placement.validate`)."""


# Mean request shape per task when the caller gives none: prompt units (tokens, images, audio minutes) and
# generated tokens. Chat turns of ~512 prompt / 128 output tokens; short passages for encoders; one image; one
# 1-minute clip.
TASK_REQUEST_SHAPE: dict[str, tuple[float, float]] = {
    "text-generation": (512.0, 128.0),
    "text-embeddings": (256.0, 0.0),
    "text-classification": (128.0, 0.0),
    "text-reranking": (512.0, 0.0),
    "image-classification": (1.0, 0.0),
    "automatic-speech-recognition": (1.0, 0.0),
}


@dataclass
class PlacementProblem:
    """Everything a placement policy needs; validated on construction (bad input raises one ``UserError``).

    ``demand``: requests/s, rows = ingress PoP ids (a subset of ``topo.pops.id``, each once), columns = model ids
    (each once).
    ``rtt``: ms from every PoP of ``topo`` (rows, table order) to every site of ``fleet`` (columns); computed
    when omitted. ``prompt_tokens`` / ``output_tokens``: mean request shape per model (task defaults from
    :data:`TASK_REQUEST_SHAPE` fill the gaps), used for replica capacity via ``capacity_rps``. ``prompt_mix``:
    per model, ``(prompt units, share)`` pairs to cost instead of the mean prompt (``capacity_rps_mix``; a speech
    model's clips, whose cost per started window makes the mean clip cheaper than the clips' mean cost).
    ``candidates_k``: an ingress may be served by its ``k`` nearest sites that host the model.
    ``utilisation_cap``: plan each replica (and each GPU's time) to run at most this share of its capacity.
    ``overcommit``: allow ``overcommit_ratio`` x GPU memory to be committed per GPU (KV pools reserved but rarely
    full); off by default. ``one_llm_per_gpu``: a GPU computes for at most one generative replica (encoders may
    share it); what simulated deployments use, since the simulator does not slow co-located replicas down.
    """

    topo: Topology
    catalog: Catalog
    fleet: Fleet
    demand: pd.DataFrame
    rtt: np.ndarray | None = None
    perf: PerfModel | None = None
    prompt_tokens: dict[str, float] = field(default_factory=dict)
    output_tokens: dict[str, float] = field(default_factory=dict)
    prompt_mix: dict[str, tuple] = field(default_factory=dict)
    unserved_penalty_ms: float = 1000.0
    candidates_k: int = 16
    utilisation_cap: float = 0.7
    overcommit: bool = False
    overcommit_ratio: float = 1.25
    one_llm_per_gpu: bool = False

    def __post_init__(self) -> None:
        self._check_options()
        self.demand = self._checked_demand(self.demand)
        # (a mean prompt of 0 tokens is a trace's own: capacity_rps counts it as one)
        self.prompt_tokens = self._checked_shape("prompt_tokens", self.prompt_tokens, low=0.0, strict=False)
        self.output_tokens = self._checked_shape("output_tokens", self.output_tokens, low=0.0, strict=False)
        self.prompt_mix = self._checked_prompt_mix(self.prompt_mix)
        given = self.rtt is not None
        if not given:
            self.rtt = ingress_site_rtt(self.topo, self.fleet)
        try:
            self.rtt = np.asarray(self.rtt, dtype=float)
        except (TypeError, ValueError):
            raise UserError("rtt matrix must hold numbers (ms)") from None
        if self.rtt.shape != (len(self.topo.pops), len(self.fleet.sites)):
            raise UserError(f"rtt matrix has shape {self.rtt.shape}; expected (PoPs, fleet sites) = "
                            f"({len(self.topo.pops)}, {len(self.fleet.sites)})")
        if given:  # (the computed one is finite by construction: only a caller's matrix is checked)
            self._check_rtt()
        if self.perf is None:
            self.perf = Roofline.from_topology(self.topo)
        for model in self.models:
            spec = self.catalog[model]
            prompt, output = TASK_REQUEST_SHAPE[spec.task]
            self.prompt_tokens.setdefault(model, prompt)
            self.output_tokens.setdefault(model, output)
        # Per-fleet caches keyed by id(), each entry holding the fleet itself so the id cannot be recycled.
        self._rtt_cache: dict[int, tuple[Fleet, np.ndarray]] = {id(self.fleet): (self.fleet, self.rtt)}
        self._networks: dict[int, tuple[Fleet, object]] = {}
        check_fleet_fits(self, self.fleet)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def build(cls, topo: Topology, catalog: Catalog | None = None, fleet: Fleet | None = None,
              total_rps: float = 20_000.0, mix: dict[str, float] | None = None,
              when_utc: datetime | None = None, **options) -> PlacementProblem:
        """The common case: the edge fleet of ``topo``, demand from :func:`ingress_demand`. ``mix`` None: the
        built-in mix (:data:`controlplane.forecast.DEFAULT_MIX`); an empty one is an error."""
        if not is_real(total_rps):  # (its range: ingress_demand's check)
            raise UserError(f"PlacementProblem.build: total_rps must be a number of requests/s, got {total_rps!r}")
        if catalog is not None and not isinstance(catalog, Catalog):
            raise UserError(f"PlacementProblem.build: catalog must be a Catalog (Catalog.load(path) reads a file), "
                            f"got {catalog!r}")
        catalog = catalog or default_catalog()
        fleet = fleet or edge_fleet(topo)
        allowed = {f.name for f in fields(cls)} - {"topo", "catalog", "fleet", "demand"}  # (build sets those)
        unknown = sorted(set(options) - allowed)
        if unknown:  # (a raw TypeError from the constructor otherwise)
            raise UserError(f"PlacementProblem.build: unknown option {unknown[0]!r} "
                            f"(options: {', '.join(sorted(allowed))})")
        demand = ingress_demand(topo, catalog, total_rps, mix, when_utc)
        return cls(topo=topo, catalog=catalog, fleet=fleet, demand=demand, **options)

    def _check_options(self) -> None:
        def positive(name, value):
            if not is_real(value) or not np.isfinite(value) or value <= 0:
                raise UserError(f"placement option {name!r} must be a positive number, got {value!r}")

        positive("unserved_penalty_ms", self.unserved_penalty_ms)
        positive("candidates_k", self.candidates_k)
        positive("utilisation_cap", self.utilisation_cap)
        if self.utilisation_cap > 1:
            raise UserError(f"placement option 'utilisation_cap' must be at most 1, got {self.utilisation_cap}")
        if int(self.candidates_k) != self.candidates_k:
            raise UserError(f"placement option 'candidates_k' must be an integer, got {self.candidates_k!r}")
        for name in ("overcommit", "one_llm_per_gpu"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise UserError(f"placement option {name!r} must be true or false, got {getattr(self, name)!r}")
        ratio = self.overcommit_ratio
        if not is_real(ratio) or not (1 <= ratio < np.inf):  # (NaN fails the comparison)
            raise UserError(f"placement option 'overcommit_ratio' must be a finite number of at least 1, got "
                            f"{ratio!r}")

    def _known_model(self, field_: str, model) -> None:
        if model not in self.catalog:
            raise UserError(f"placement field {field_!r}: no model {model!r} in the catalog")

    def _checked_shape(self, field_: str, shape, low: float, strict: bool) -> dict[str, float]:
        """A ``prompt_tokens`` / ``output_tokens`` dict: catalog model ids to finite sizes above (or at) ``low``."""
        if not isinstance(shape, dict):
            raise UserError(f"placement field {field_!r} must be a dict of model id -> mean size, got {shape!r}")
        for model, value in shape.items():
            self._known_model(field_, model)
            if not is_real(value) or not np.isfinite(value) or value < low or (strict and value == low):
                need = "positive" if strict else "non-negative"
                raise UserError(f"placement field {field_!r}: size of {model!r} must be a finite {need} number, "
                                f"got {value!r}")
        return dict(shape)

    def _checked_prompt_mix(self, mixes) -> dict[str, tuple]:
        """``prompt_mix``: per catalog model, ``(prompt units, share)`` pairs, units finite and positive, shares
        finite and non-negative with a positive sum (an empty list: no mix, the mean prompt is costed)."""
        if not isinstance(mixes, dict):
            raise UserError(f"placement field 'prompt_mix' must be a dict of model id -> (units, share) pairs, "
                            f"got {mixes!r}")
        out = {}
        for model, pairs in mixes.items():
            self._known_model("prompt_mix", model)
            where = f"placement field 'prompt_mix' of {model!r}"
            try:
                pairs = [tuple(p) for p in pairs]
            except TypeError:
                raise UserError(f"{where} must list (prompt units, share) pairs, got {pairs!r}") from None
            for pair in pairs:
                if len(pair) != 2 or not all(is_real(x) and np.isfinite(x) for x in pair):
                    raise UserError(f"{where}: each entry must be a pair of finite numbers, got {pair!r}")
                if pair[0] <= 0 or pair[1] < 0:
                    raise UserError(f"{where}: prompt units must be positive and shares non-negative, got {pair!r}")
            if pairs and not sum(w for _, w in pairs) > 0:
                raise UserError(f"{where}: the shares sum to zero")
            out[model] = tuple((float(u), float(w)) for u, w in pairs)
        return out

    def _check_rtt(self) -> None:
        bad = ~(np.isfinite(self.rtt) & (self.rtt >= 0))
        if bad.any():
            i, j = (int(x[0]) for x in np.nonzero(bad))
            raise UserError(f"rtt matrix: entry (PoP {self.topo.pops.id.iloc[i]!r}, site "
                            f"{self.fleet.sites.site_id.iloc[j]!r}) is {float(self.rtt[i, j])}; RTTs must be finite "
                            "and non-negative (ms)")

    def _checked_demand(self, demand: pd.DataFrame) -> pd.DataFrame:
        if not isinstance(demand, pd.DataFrame) or demand.empty:
            raise UserError("demand must be a non-empty DataFrame (ingress PoP ids x model ids, requests/s)")
        for model in demand.columns:
            self.catalog[model]  # UnknownModelError names the id
        twice = demand.columns[demand.columns.duplicated()]
        if len(twice):  # (their rates would be summed or one of them dropped, silently)
            raise UserError(f"demand: model {twice[0]!r} has more than one column")
        twice = demand.index[demand.index.duplicated()]
        if len(twice):  # (likewise: a row per ingress PoP, whose rates a second row would silently add to)
            raise UserError(f"demand: ingress PoP {twice[0]!r} has more than one row")
        unknown = sorted(set(map(str, demand.index)) - set(self.topo.pops.id))
        if unknown:
            raise UserError(f"demand: unknown ingress PoP id(s): {', '.join(unknown[:5])}")
        try:
            values = demand.to_numpy(dtype=float)
        except (TypeError, ValueError):
            raise UserError("demand: every rate must be a number of requests/s") from None
        if not np.all(np.isfinite(values)) or (values < 0).any():
            raise UserError("demand: every rate must be a finite non-negative number of requests/s")
        full = demand.reindex(self.topo.pops.id, fill_value=0.0).astype(float)
        full.index.name = "ingress"
        full = full.loc[:, full.sum(axis=0) > 0]
        if full.empty:
            raise InfeasiblePlacementError("demand is zero for every model: nothing to place")
        return full

    # ------------------------------------------------------------------ derived quantities
    @property
    def models(self) -> list[str]:
        """Model ids with positive demand, in demand column order."""
        return list(self.demand.columns)

    @property
    def specs(self) -> list[ModelSpec]:
        return [self.catalog[m] for m in self.models]

    @property
    def total_rps(self) -> float:
        return float(self.demand.to_numpy().sum())

    @property
    def memory_factor(self) -> float:
        """Share of each GPU's memory that may be committed: 1, or ``overcommit_ratio`` when overcommitting."""
        return self.overcommit_ratio if self.overcommit else 1.0

    def rtt_for(self, fleet: Fleet) -> np.ndarray:
        """Ingress x site RTT for ``fleet`` (the problem's own matrix for its own fleet)."""
        key = id(fleet)
        if key not in self._rtt_cache:
            self._trim(self._rtt_cache)
            self._rtt_cache[key] = (fleet, ingress_site_rtt(self.topo, fleet))
        return self._rtt_cache[key][1]

    def network(self, fleet: Fleet | None = None):
        """The precomputed arrays (capacities, candidate sites) for ``fleet`` (default: the problem's)."""
        from controlplane.placement.network import Network

        fleet = fleet or self.fleet
        key = id(fleet)
        if key not in self._networks:
            check_fleet_fits(self, fleet)
            self._trim(self._networks)
            self._networks[key] = (fleet, Network(self, fleet))
        return self._networks[key][1]

    def _trim(self, cache: dict, keep: int = 4) -> None:
        """Bound a per-fleet cache (policies like ``central`` build a fresh fleet per call)."""
        for key in [k for k in cache if k != id(self.fleet)][:max(0, len(cache) - keep)]:
            del cache[key]


def check_fleet_fits(problem: PlacementProblem, fleet: Fleet) -> None:
    """Raise :class:`ModelTooLargeError` for a demanded model no node of ``fleet`` can hold, and
    :class:`InfeasiblePlacementError` when one replica of every demanded model exceeds the fleet's memory."""
    nodes = fleet.nodes
    if nodes.empty:
        raise InfeasiblePlacementError(f"fleet {fleet.name!r} has no GPU nodes")
    limit = nodes.gpu_memory_gb.to_numpy() * 1e9 * problem.memory_factor
    gpus = nodes.gpus.to_numpy()
    for spec in problem.specs:
        ok = (limit >= spec.bytes_per_gpu) & (gpus >= spec.tensor_parallel)
        if ok.any():
            continue
        need = f"model {spec.id} needs {spec.bytes_per_gpu / 1e9:.1f} GB per GPU on {spec.tensor_parallel} GPU(s)"
        if (limit < spec.bytes_per_gpu).all():
            raise ModelTooLargeError(f"{need}; the largest GPU in fleet {fleet.name!r} has "
                                     f"{limit.max() / 1e9:.0f} GB")
        if (gpus < spec.tensor_parallel).all():
            raise ModelTooLargeError(f"{need} of one node; the largest node in fleet {fleet.name!r} has "
                                     f"{gpus.max()} GPU(s)")
        raise ModelTooLargeError(f"{need} of one node; no node in fleet {fleet.name!r} has "
                                 f"{spec.tensor_parallel} GPUs that large")
    need = sum(s.replica_bytes for s in problem.specs)
    have = float((limit * gpus).sum())
    if need > have:
        raise InfeasiblePlacementError(
            f"one replica of each of the {len(problem.specs)} demanded models needs {need / 1e9:.1f} GB; fleet "
            f"{fleet.name!r} has {have / 1e9:.1f} GB of GPU memory")


# ---------------------------------------------------------------------- policies and their registry
class PlacementPolicy:
    """Interface: ``place(problem, rng)`` returns a :class:`Placement` of ``problem``'s demand.

    Subclasses are dataclasses whose fields are the policy's options; ``rng`` is for policies that randomise
    (the shipped ones are deterministic and break ties by index).
    """

    name: str = "?"
    # An explicit deployment (per-pop: exactly what it names) rather than a plan for a demand: deployments built
    # from it keep it as it is (no idle-GPU filling, memory alone decides what shares a GPU).
    explicit: bool = False
    # Memory alone decides what shares a GPU (everywhere-fits): deployments built from it leave one_llm_per_gpu
    # off, whatever their config says (the policy itself follows the problem it is given).
    memory_only: bool = False
    # Places on a fleet it builds itself (central's regions), not the problem's: its plan is no plan of the
    # problem's fleet (the ILP refuses it as a warm start when its options are read).
    own_fleet: bool = False
    # The same inputs always give the same plan, and computing it costs seconds: kept on disk by
    # controlplane.placement.cache (a plain class attribute, not an option).
    cacheable = False

    def place(self, problem: PlacementProblem, rng: np.random.Generator):  # -> Placement
        raise NotImplementedError


# The registry of placement policies; the built-in ones register when ``controlplane.placement`` is imported.
PLACEMENTS = Registry("placement policy")


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return PLACEMENTS.names()


def check_policy_name(name: str) -> None:
    """Raise :class:`UnknownPolicyError`, listing the known policies, unless ``name`` is a registered policy."""
    if name not in PLACEMENTS:
        raise UnknownPolicyError(f"unknown placement policy {name!r} (known: {', '.join(policy_names())})")


def run_policy(policy: PlacementPolicy, problem: PlacementProblem, rng: np.random.Generator):  # -> Placement
    """``policy.place(problem, rng)``. A policy from outside edgepop (its class defined outside
    ``controlplane.placement``) that fails with anything but a UserError fails with one UserError naming it and
    the error, chained to it (``EDGEPOP_TRACEBACK=1`` prints the whole chain at the command line)."""
    try:
        return policy.place(problem, rng)
    except UserError:
        raise
    except Exception as exc:
        cls = type(policy)
        if defined_in(policy, "controlplane.placement") or isinstance(exc, MemoryError):
            raise
        text = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"placement policy {getattr(policy, 'name', '?')!r} ({cls.__module__}.{cls.__qualname__}) "
                        f"failed: {type(exc).__name__}: {text} (EDGEPOP_TRACEBACK=1 shows where)") from exc


def get_policy(name: str, **options) -> PlacementPolicy:
    """An instance of the policy called ``name`` with ``options`` as its dataclass fields."""
    check_policy_name(name)
    return PLACEMENTS.create(name, options=options)
