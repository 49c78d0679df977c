"""Scenarios: TOML files describing one experiment (workload, edge and central deployments, SLOs, faults).

Embedded scenarios live in ``sim/scenarios/`` and are named without the extension (``default``, ``small``, ...);
any other value is a path. Every table is validated on load; a bad key or value is one error naming the file,
the table and the field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from edgepop.errors import UserError
from sim.techniques import Techniques, parse_techniques

SCENARIO_DIR = Path(__file__).parent / "scenarios"


@dataclass
class DeploymentConfig:
    """How one deployment is built and operated. ``baseline`` and ``gpu_scale`` only matter for central."""

    placement: str = "greedy-demand"
    placement_options: dict = field(default_factory=dict)
    router: str = "nearest-with-capacity"
    router_options: dict = field(default_factory=dict)
    autoscaler: str = "none"
    autoscaler_options: dict = field(default_factory=dict)
    queue_limit: int = 64
    queue_timeout_s: float = 30.0
    load_gbs: float = 2.0
    init_s: float = 5.0
    pops: list | None = None
    baseline: str = "big3"
    gpu_scale: float = 1.0


@dataclass
class SLO:
    """Per-request service objectives: TTFT and TPOT for generation, E2E for one-shot tasks."""

    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0
    e2e_ms: float = 500.0


@dataclass
class Scenario:
    name: str
    description: str = ""
    seed: int = 1
    workload: object = None  # sim.workload.WorkloadConfig
    edge: DeploymentConfig = field(default_factory=DeploymentConfig)
    central: DeploymentConfig | None = field(default_factory=lambda: DeploymentConfig(placement="central"))
    slo: SLO = field(default_factory=SLO)
    perf: str = "roofline"  # or the path of a profile table written by `edgepop profile`
    catalog: str | None = None
    last_mile_ms: float = 10.0
    faults: list = field(default_factory=list)
    fault_policy: str = "retry"
    sample_s: float = 60.0
    planning_rps: float | None = None  # demand the placement plans for (default: the workload's mean rate)
    techniques: Techniques = field(default_factory=Techniques)  # all off unless [techniques] says
    source: str = "<memory>"


def _typed(cls, raw: dict, where: str):
    """Build dataclass ``cls`` from ``raw``, checking names and basic types (one-line errors)."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table")
    known = {f.name: f for f in fields(cls)}
    out = {}
    for key, value in raw.items():
        if key not in known:
            raise UserError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        default = known[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise UserError(f"{where}: field {key!r} must be true or false, got {value!r}")
        elif isinstance(default, int | float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UserError(f"{where}: field {key!r} must be a number, got {value!r}")
            if value < 0:
                raise UserError(f"{where}: field {key!r} must not be negative, got {value!r}")
        if isinstance(default, str) and not isinstance(value, str):
            raise UserError(f"{where}: field {key!r} must be a string, got {value!r}")
        out[key] = value
    return cls(**out)


def parse_scenario(doc: dict, source: str, base_dir: Path | None = None) -> Scenario:
    from sim.workload import WorkloadConfig

    top = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    for key in tables:
        if key not in ("workload", "edge", "central", "slo", "techniques"):
            raise UserError(f"{source}: unknown table [{key}] (known: workload, edge, central, slo, techniques)")
    sc = _typed(Scenario, {"name": Path(source).stem, **top}, source)
    sc.source = source
    sc.workload = WorkloadConfig.from_dict(tables.get("workload", {}), where=f"{source} [workload]",
                                            base_dir=base_dir)
    sc.edge = _typed(DeploymentConfig, tables.get("edge", {}), f"{source} [edge]")
    if "central" in tables and tables["central"].get("enabled", True) is False:
        sc.central = None
    else:
        raw = {k: v for k, v in tables.get("central", {}).items() if k != "enabled"}
        sc.central = _typed(DeploymentConfig, {"placement": "central", **raw}, f"{source} [central]")
    sc.slo = _typed(SLO, tables.get("slo", {}), f"{source} [slo]")
    sc.techniques = parse_techniques(tables.get("techniques", {}), f"{source} [techniques]")
    if sc.fault_policy not in ("retry", "fail"):
        raise UserError(f"{source}: fault_policy must be 'retry' or 'fail', got {sc.fault_policy!r}")
    if sc.central is not None and sc.central.gpu_scale <= 0:
        raise UserError(f"{source} [central]: gpu_scale must be positive")
    from sim.faults import parse_fault

    sc.faults = [parse_fault(f) if isinstance(f, str) else f for f in sc.faults]
    return sc


def embedded_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def read_named_toml(name_or_path: str | Path, folder: Path, kind: str) -> tuple[dict, Path]:
    """Parse an embedded ``folder/<name>.toml`` or a TOML file by path; one-line errors for missing/invalid files."""
    path = Path(name_or_path)
    if not path.suffix and (folder / f"{name_or_path}.toml").exists():
        path = folder / f"{name_or_path}.toml"
    if not path.is_file():
        embedded = sorted(p.stem for p in folder.glob("*.toml"))
        raise UserError(f"{kind} {str(name_or_path)!r} not found: not a file and not one of the embedded "
                        f"{kind}s ({', '.join(embedded) or 'none'})")
    try:
        return tomllib.loads(path.read_text()), path
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path.name}: not valid TOML: {exc}") from None


def load_scenario(name_or_path: str | Path = "default") -> Scenario:
    """An embedded scenario by name, or a TOML file by path."""
    doc, path = read_named_toml(name_or_path, SCENARIO_DIR, "scenario")
    return parse_scenario(doc, path.name, base_dir=path.parent)


def with_overrides(sc: Scenario, **kw) -> Scenario:
    """A copy with top-level fields replaced (CLI flags); ``workload`` fields via ``workload={...}``."""
    wl = kw.pop("workload", None)
    out = replace(sc, **kw)
    if wl:
        out.workload = replace(sc.workload, **wl)
    return out
