"""Scenarios: TOML files describing one experiment (workload, edge and central deployments, SLOs, faults).

Embedded scenarios live in ``sim/scenarios/`` and are named without the extension (``default``, ``small``, ...);
any other value is a path. Every table is validated on load; a bad key or value is one error naming the file,
the table and the field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from controlplane.deployment import DeploymentConfig
from controlplane.perf_models import check_perf
from edgepop.errors import UserError
from edgepop.rng import MAX_INT
from sim.faults import FAULT_POLICIES, Fault, parse_fault
from sim.techniques.config import Techniques, parse_techniques
from sim.validate import typed
from sim.workload_config import WorkloadConfig
from topology.demand import DEMAND_WEIGHTS
from topology.last_mile import MODES as LAST_MILE_MODES

SCENARIO_DIR = Path(__file__).parent / "scenarios"
CENTRAL_ONLY = ("baseline", "gpu_scale", "budget", "node", "rack")  # DeploymentConfig fields of the central deployment


@dataclass
class SLO:
    """Per-request service objectives: TTFT and TPOT for generation, E2E for one-shot tasks."""

    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0
    e2e_ms: float = 500.0


@dataclass
class Scenario:
    """A scenario file's contents (docs/simulate.md, "Scenario files"): the workload, the edge and central
    deployments (:class:`controlplane.deployment.DeploymentConfig`), the SLO, the serving techniques and the
    network and fault settings. Edit one with ``dataclasses.replace``; :func:`run_scenario` checks it again as a
    file is checked. ``source`` is the file it was read from (set by edgepop, not a field a file may set)."""

    name: str
    description: str = ""
    seed: int = 1
    workload: WorkloadConfig | None = None
    edge: DeploymentConfig = field(default_factory=DeploymentConfig)
    central: DeploymentConfig | None = field(default_factory=lambda: DeploymentConfig(placement="central"))
    slo: SLO = field(default_factory=SLO)
    perf: str = "roofline"  # or the path of a profile table written by `edgepop profile`
    # x every prefill and decode step time of the perf model (controlplane.perf_scaled): a calibration stress test
    prefill_time_scale: float = 1.0
    decode_time_scale: float = 1.0
    catalog: str | None = None
    last_mile_ms: float = 10.0
    last_mile: str = "fixed"  # or "country" / "continent": M-Lab access RTT medians (topology.last_mile)
    jitter: bool = False  # per-request RTT variability around each path's mean (topology.jitter)
    anycast_misroute: float = 0.0  # share of user locations entering at their second-best PoP (Topology.with_anycast)
    demand_weight: str = "population"  # or "internet_users": the people online in each city (topology.demand)
    faults: list = field(default_factory=list)
    fault_policy: str = "retry"
    sample_s: float = 60.0
    planning_rps: float | None = None  # demand the placement plans for (default: the workload's mean rate)
    gpu_inventory_scale: float = 1.0  # x the edge GPU inventory of the tier ladder (central moves the same GPUs)
    techniques: Techniques = field(default_factory=Techniques)  # all off unless [techniques] says
    source: str = "<memory>"


def parse_scenario(doc: dict, source: str, base_dir: Path | None = None) -> Scenario:
    """Validate a scenario document (what ``tomllib`` returns); ``source`` names it in errors."""
    top = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    for key in tables:
        if key not in ("workload", "edge", "central", "slo", "techniques"):
            grid = " (it reads like a sweep grid: run it with `edgepop sweep --grid`)" if "base" in doc else ""
            raise UserError(f"{source}: unknown table [{key}] (known: workload, edge, central, slo, techniques)"
                            f"{grid}")
    sc = typed(Scenario, {"name": Path(source).stem, **top}, source)
    sc.source = source
    if "last_mile_ms" in top and sc.last_mile != "fixed":  # (the country/continent figures replace it)
        raise UserError(f"{source}: field 'last_mile_ms' applies with last_mile = \"fixed\" only, not with "
                        f"{sc.last_mile!r}")
    _resolve_paths(sc, source, base_dir)
    sc.workload = WorkloadConfig.from_dict(tables.get("workload", {}), where=f"{source} [workload]",
                                            base_dir=base_dir)
    # Fields of the other deployment would be accepted by the shared config type and ignored (or worse): the
    # central budget settings mean nothing at the edge, and central's PoPs follow the edge's.
    for table, names, why in (("edge", CENTRAL_ONLY, "sets the central deployment's regions or budget: move it "
                               "to [central]"),
                              ("central", ("pops",), "is the edge's: central's budget follows [edge] pops")):
        misplaced = sorted(set(tables.get(table, {})) & set(names))
        if misplaced:
            raise UserError(f"{source} [{table}]: field {misplaced[0]!r} {why}")
    sc.edge = typed(DeploymentConfig, tables.get("edge", {}), f"{source} [edge]")
    enabled = tables.get("central", {}).get("enabled", True)
    if not isinstance(enabled, bool):
        raise UserError(f"{source} [central]: field 'enabled' must be true or false, got {enabled!r}")
    if not enabled:
        sc.central = None
    else:
        raw = {k: v for k, v in tables.get("central", {}).items() if k != "enabled"}
        sc.central = typed(DeploymentConfig, {"placement": "central", **raw}, f"{source} [central]")
        # central's own fields, which build_deployment passes to its placement: a second value would disagree
        for key, own in (("baseline", "baseline"), ("budget", "budget"), ("node", "node"), ("rack", "rack"),
                         ("scale", "gpu_scale")):
            if key in sc.central.placement_options:
                raise UserError(f"{source} [central]: placement_options {key!r} is the deployment's own field: set "
                                f"{own} = {sc.central.placement_options[key]!r} there (the two would disagree)")
    sc.slo = typed(SLO, tables.get("slo", {}), f"{source} [slo]")
    sc.techniques = parse_techniques(tables.get("techniques", {}), f"{source} [techniques]", sc.workload)
    check_values(sc, source)
    return sc


def _resolve_paths(sc: Scenario, source: str, base_dir: Path | None) -> None:
    """Relative ``catalog`` and ``perf`` (a profile table) paths are read from the scenario's folder, as the
    workload's ``trace`` is (a file there wins over one in the working directory, which older runs relied on)."""
    from controlplane.perf_models import PERF_MODELS

    for name in ("catalog", "perf"):
        value = getattr(sc, name)
        if not isinstance(value, str) or not value or (name == "perf" and value in PERF_MODELS) or value == "profile":
            continue
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None and (Path(base_dir) / path).exists():
            path = Path(base_dir) / path
        if not path.exists():  # (a folder goes on to the readers' own one-line errors)
            # each place once, as an absolute path (a scenario in the working directory has base_dir ".")
            places = [path] + ([Path(base_dir) / path] if base_dir is not None and not path.is_absolute() else [])
            where = " and ".join(dict.fromkeys(str(p.absolute()) for p in places))
            if name == "catalog":
                raise UserError(f"{source}: field 'catalog': no catalog file {value!r} (looked for {where})")
            raise UserError(f"{source}: field 'perf': {value!r} is neither a service-time model "
                            f"({', '.join(PERF_MODELS.names())}) nor an existing profile table (looked for "
                            f"{where})")
        if path.is_dir():
            raise UserError(f"{source}: field {name!r}: {value!r} is a folder; name a "
                            f"{'TOML catalog' if name == 'catalog' else 'profile table (CSV)'} file")
        setattr(sc, name, str(path))


def check_values(sc: Scenario, source: str) -> None:
    """The checks of a scenario's values across its tables (names, bounds, policies, faults); fault specs given
    as strings are parsed in place. ``source`` names the scenario in errors."""
    if not isinstance(sc.faults, list):
        raise UserError(f"{source}: field 'faults' must be a list, got {sc.faults!r}")
    FAULT_POLICIES.check(sc.fault_policy, where=f"{source}: field 'fault_policy'")
    if sc.last_mile not in LAST_MILE_MODES:
        raise UserError(f"{source}: field 'last_mile' must be one of {', '.join(LAST_MILE_MODES)}, "
                        f"got {sc.last_mile!r}")
    if sc.demand_weight not in DEMAND_WEIGHTS:
        raise UserError(f"{source}: field 'demand_weight' must be one of {', '.join(DEMAND_WEIGHTS)}, "
                        f"got {sc.demand_weight!r}")
    if sc.last_mile_ms > 86_400_000:  # (a day, as the gateway's config takes)
        raise UserError(f"{source}: field 'last_mile_ms' must be at most 86400000, got {sc.last_mile_ms!r}")
    for name in ("prefill_time_scale", "decode_time_scale"):
        if getattr(sc, name) > 100:  # (a replica 100x slower than the model is no longer a calibration question)
            raise UserError(f"{source}: field {name!r} must be at most 100, got {getattr(sc, name)!r}")
    if sc.gpu_inventory_scale > 100:  # over 200,000 GPUs at the edge
        raise UserError(f"{source}: field 'gpu_inventory_scale' must be at most 100, got {sc.gpu_inventory_scale!r}")
    if 0 < sc.sample_s < 0.01:  # a sample of the whole fleet every sample_s simulated seconds
        raise UserError(f"{source}: field 'sample_s' must be at least 0.01, got {sc.sample_s!r}")
    if sc.planning_rps is not None and sc.planning_rps > 1e9:  # (the placement's demand model takes up to 1e9)
        raise UserError(f"{source}: field 'planning_rps' must be at most 1e9 requests/s, got {sc.planning_rps!r}")
    if not 0.0 <= sc.anycast_misroute <= 1.0:
        raise UserError(f"{source}: field 'anycast_misroute' must be in [0, 1], got {sc.anycast_misroute!r}")
    for name, value in (("gpu_inventory_scale", sc.gpu_inventory_scale), ("sample_s", sc.sample_s),
                        ("prefill_time_scale", sc.prefill_time_scale), ("decode_time_scale", sc.decode_time_scale),
                        ("planning_rps", sc.planning_rps), ("[slo] ttft_ms", sc.slo.ttft_ms),
                        ("[slo] tpot_ms", sc.slo.tpot_ms), ("[slo] e2e_ms", sc.slo.e2e_ms)):
        if value is not None and not value > 0:  # (finite: checked with the types)
            raise UserError(f"{source}: field {name!r} must be positive, got {value!r}")
    check_perf(sc.perf, source)
    if sc.edge.placement == "central":  # it places on cloud regions: the "edge" would be a second central
        raise UserError(f"{source} [edge]: placement 'central' places on cloud regions, not PoPs; it is the "
                        "[central] deployment's policy")
    # policy names and options are checked here, before any workload is generated
    sc.edge.check(f"{source} [edge]")
    if sc.central is not None:
        if sc.central.placement != "central":  # the only policy that builds the baseline's own fleet
            raise UserError(f"{source} [central]: field 'placement' must be 'central' (the baseline regions' own "
                            f"policy), got {sc.central.placement!r}")
        sc.central.check(f"{source} [central]")
    for f in sc.faults:
        if not isinstance(f, str | Fault):
            raise UserError(f"{source}: field 'faults' must list KIND:TARGET@START+DURATION strings, got {f!r}")
    try:
        sc.faults = [f if isinstance(f, Fault) else parse_fault(f) for f in sc.faults]
    except UserError as exc:
        raise UserError(f"{source}: field 'faults': {exc}") from None


def check_scenario(sc: Scenario) -> Scenario:
    """Re-run a scenario file's checks on a Scenario object, one built or edited in Python (``dataclasses.replace``
    skips them): its fields' types, each table, and the values across them; one-line errors naming the field.
    Returns a copy with fault specs given as strings parsed (``sc`` is left as it was)."""
    if not isinstance(sc, Scenario):
        raise UserError(f"expected a Scenario (or a scenario name or path), got {type(sc).__name__}")
    where = f"scenario {sc.name!r}"
    tables = ("workload", "edge", "central", "slo", "techniques", "faults", "source")
    top = typed(Scenario, {f.name: getattr(sc, f.name) for f in fields(Scenario) if f.name not in tables}, where)
    for name, cls, value in (("workload", WorkloadConfig, sc.workload), ("edge", DeploymentConfig, sc.edge),
                             ("slo", SLO, sc.slo), ("techniques", Techniques, sc.techniques)):
        if not isinstance(value, cls):
            raise UserError(f"{where}: {name} must be a {cls.__name__}, got {type(value).__name__}")
    if sc.central is not None and not isinstance(sc.central, DeploymentConfig):
        raise UserError(f"{where}: central must be a DeploymentConfig or None, got {type(sc.central).__name__}")
    # the workload as a file would give it, read back by the file's own checks (a start time in another zone comes
    # back in UTC, as a file's does; a string, a table or a list given where an object belongs is checked as text)
    workload = WorkloadConfig.from_dict(sc.workload.to_dict(), where=f"{where} [workload]")
    # (the checked copies: a numpy number given in Python is stored as a plain int or float)
    edge, central = (None if dep is None else typed(DeploymentConfig, {f.name: getattr(dep, f.name) for f in
                                                                      fields(dep)}, f"{where} [{name}]")
                     for name, dep in (("edge", sc.edge), ("central", sc.central)))
    slo = typed(SLO, {f.name: getattr(sc.slo, f.name) for f in fields(SLO)}, f"{where} [slo]")
    parse_techniques({f.name: getattr(sc.techniques, f.name) for f in fields(Techniques)},
                     f"{where} [techniques]", sc.workload)
    out = replace(sc, **{f.name: getattr(top, f.name) for f in fields(Scenario) if f.name not in tables},
                  workload=workload, edge=edge, central=central, slo=slo,
                  faults=list(sc.faults) if isinstance(sc.faults, list) else sc.faults)
    check_values(out, where)
    return out


def no_central(name: str) -> str:
    """The one wording of every refusal that needs a central deployment the scenario does not have."""
    return f"scenario {name!r} has no central deployment ([central] enabled = false)"


def embedded_scenarios() -> list[str]:
    """The names of the scenarios shipped in ``sim/scenarios/``."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def read_named_toml(name_or_path: str | Path, folder: Path, kind: str) -> tuple[dict, Path]:
    """Parse an embedded ``folder/<name>.toml`` or a TOML file by path; one-line errors for missing/invalid files."""
    path = Path(name_or_path)
    if not path.suffix and (folder / f"{name_or_path}.toml").exists():
        path = folder / f"{name_or_path}.toml"
    if path.is_dir():
        raise UserError(f"{kind} {str(name_or_path)!r}: is a folder; name a TOML file")
    if not path.is_file():
        embedded = sorted(p.stem for p in folder.glob("*.toml"))
        raise UserError(f"{kind} {str(name_or_path)!r} not found: not a file and not one of the embedded "
                        f"{kind}s ({', '.join(embedded) or 'none'})")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # (not UTF-8: not TOML either)
        raise UserError(f"{path.name}: not valid TOML: {exc}") from None
    if not doc:  # (an empty file, or comments only: it would run on defaults no embedded one has)
        example = folder / "small.toml" if (folder / "small.toml").is_file() else next(iter(sorted(
            folder.glob("*.toml"))), None)
        raise UserError(f"{path}: an empty {kind} file (no fields)"
                        + (f"; start from a copy of an embedded one, e.g. {example}" if example else ""))
    return doc, path


def load_scenario(name_or_path: str | Path = "default") -> Scenario:
    """An embedded scenario by name, or a TOML file by path."""
    if not isinstance(name_or_path, str | Path):
        raise UserError(f"a scenario is an embedded name or a path, got {name_or_path!r}")
    doc, path = read_named_toml(name_or_path, SCENARIO_DIR, "scenario")
    return parse_scenario(doc, path.name, base_dir=path.parent)


def network_summary(sc: Scenario, last_mile=None) -> dict:
    """The network assumptions ``sc``'s runs make, as ``summary.json``'s ``network`` block says them: the last mile
    (``last_mile``: the topology's :class:`~topology.last_mile.LastMile`, else the scenario's own), RTT jitter and
    the share of user cities anycast lands on their second-nearest PoP (0: ideal)."""
    from topology.jitter import fit
    from topology.last_mile import LastMile

    last_mile = last_mile or LastMile(sc.last_mile, sc.last_mile_ms)
    return {"last_mile": last_mile.describe(), "jitter": f"on: {fit().source}" if sc.jitter else "off",
            "anycast_misroute": sc.anycast_misroute}


def demand_summary(sc: Scenario) -> dict:
    """``summary.json``'s and ``frontier.json``'s ``demand_weight`` entry, how the demand cities were weighted and
    from what: ``{}`` by population (the default, whose outputs stay as they were)."""
    from topology.demand import INTERNET_SOURCE

    if sc.demand_weight == "population":
        return {}
    return {"demand_weight": {"mode": sc.demand_weight, "source": INTERNET_SOURCE}}  # (the one other weighting)


def with_overrides(sc: Scenario, **kw) -> Scenario:
    """A copy with top-level fields replaced (CLI flags); ``workload`` fields via ``workload={...}``. Unknown
    field names and a seed that is not an integer in [0, 2**63 - 1] are one-line errors (the values are not
    otherwise re-validated: a scenario file's checks run when it is read)."""
    wl = kw.pop("workload", None)
    for cls, names in ((Scenario, kw), (WorkloadConfig, wl or {})):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(names) - known)
        if unknown:
            raise UserError(f"with_overrides: no {cls.__name__} field {unknown[0]!r} "
                            f"(known: {', '.join(sorted(known))})")
    seed = kw.get("seed", sc.seed)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= MAX_INT:
        raise UserError(f"with_overrides: seed must be an integer in [0, 2**63 - 1], got {seed!r}")
    if "seed" in kw:
        kw["seed"] = int(seed)  # (a numpy integer is a whole number; the checks take Python's)
    out = replace(sc, **kw)
    if wl:
        out.workload = replace(sc.workload, **wl)
    return out
