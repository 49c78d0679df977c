"""Sweep grids: a base scenario plus axes whose values override scenario fields by dotted path.

A grid file (TOML)::

    base = "small"            # an embedded scenario name, or a scenario file (relative to the grid file)
    requests = 2000           # optional: every variant runs this many requests (or duration_s = seconds)
    seeds = [1, 2]            # optional: replicate every point over these seeds (default: the base's seed)
    deployments = ["edge", "central"]   # optional: simulate only some deployments
    [axes]
    "edge.placement" = ["greedy-demand", "everywhere-fits"]
    "workload.rps" = [20.0, 40.0]

An axis key is ``table.field`` (tables ``workload``, ``edge``, ``central``, ``slo``), a top-level scenario field
(``planning_rps``, ``last_mile_ms``, ``faults``, ...), or ``table.field.key`` for a table-valued field
(``edge.placement_options.time_limit_s``; refused into a base without a ``mix``, which means the default mix).
An axis with one value fixes that field for every variant. A table and one of its keys, repeated values and
named variants with the same overrides are refused (:mod:`sim.grid_keys`).

Every axis value is applied to the base scenario's TOML document and re-read by the scenario parser, so values
are checked by the same rules as scenario files; policy, router and autoscaler names are checked against the
registries. Any problem is one :class:`~edgepop.errors.UserError` naming the grid file, the axis and the value.

Named variants: a ``[[variants]]`` list gives runs that change several fields at once (an ablation, a set of
configurations), each a table with a ``name`` and dotted ``"table.field" = value`` overrides::

    [[variants]]
    name = "prefix_cache"
    "techniques.prefix_cache" = true
    "edge.router" = "prefix-aware"

A quoted key whose value is a table (``"edge.router_options" = { window_ms = 5.0 }``) sets that field as a whole,
as an axis value does. A grid that simulates one deployment refuses keys of the other (``central.*`` beside
``deployments = ["edge"]``): they would change nothing; ``edge.pops`` stays, central's budget follows it.

With both, every named variant is crossed with the axes (named variants outermost). The outputs then carry a
``variant_name`` column; ``baseline = "<name>"`` marks the variant the others are compared to.

Variants are the cartesian product of the named variants and the axes in file order (the last axis varies
fastest), each replicated over ``seeds`` (innermost); variant ids count from 0 in that order.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from numbers import Integral
from pathlib import Path

from controlplane.deployment import DeploymentConfig
from edgepop.errors import UserError
from edgepop.rng import MAX_INT
from sim.grid_keys import canonical, check_absent_tables, check_overlaps, check_repeats, plain
from sim.scenario import SCENARIO_DIR, SLO, Scenario, embedded_scenarios, parse_scenario, read_named_toml
from sim.techniques.config import Techniques
from sim.trace_files import check_variant_traces
from sim.workload_config import MAX_REQUESTS, WorkloadConfig

MAX_VARIANTS = 10_000  # simulations a sweep runs, at most

GRID_DIR = SCENARIO_DIR / "grids"
GRID_KEYS = ("base", "description", "requests", "duration_s", "seeds", "deployments", "axes", "variants",
             "baseline")
DEPLOYMENTS = ("edge", "central")
SIZE_KEYS = ("workload.requests", "workload.duration_s", "workload.trace_limit")  # a run's size
# Keys of one deployment that the other one reads: central's budget follows the edge's PoPs (sim.run.central_config).
INHERITED = frozenset({"edge.pops"})
# Keys outside a deployment's table that act on one deployment only: the batch policy moves the edge's batch rows
# (sim.techniques.batch_policy), so a central-only grid varying it runs identical variants.
ONE_SIDED = {"techniques.batch_policy": "edge"}
# Scenario fields an axis may not set: identity, the seed (use `seeds`), and the tables as a whole.
NOT_AXES = frozenset({"name", "description", "source", "seed", "workload", "edge", "central", "slo", "techniques"})
# Fields holding a table whose keys an axis may address one level deeper.
TABLE_FIELDS = frozenset({"placement_options", "router_options", "autoscaler_options", "mix", "tokens",
                          "spec_acceptance"})
# Columns of the sweep outputs that an axis name must not shadow.
RESERVED_COLUMNS = frozenset({"variant", "variant_name", "seed", "deployment"})


def _table_fields() -> dict[str, set[str]]:
    deployment = {f.name for f in fields(DeploymentConfig)}
    return {"workload": {f.name for f in fields(WorkloadConfig)}, "edge": deployment,
            "central": deployment | {"enabled"}, "slo": {f.name for f in fields(SLO)},
            "techniques": {f.name for f in fields(Techniques)}}


@dataclass(frozen=True)
class Variant:
    """One run of a sweep: the axis values it sets (axis key -> value) and its seed."""

    id: int
    values: dict
    seed: int
    scenario: Scenario
    name: str = ""  # the named variant it belongs to ("" without [[variants]])
    deployments: tuple[str, ...] = ()  # simulate only these (empty: the grid's); set by programs, not files

    @property
    def label(self) -> str:
        """``edge.placement='ilp', workload.rps=20.0, seed=1``: how errors and progress name the variant."""
        parts = ([f"{self.name}"] if self.name else []) + [f"{k}={plain(v)!r}" for k, v in self.values.items()]
        return ", ".join(parts + [f"seed={self.seed}"])


@dataclass(frozen=True)
class Grid:
    """A parsed, validated grid. ``axes`` keeps file order; ``variants`` is the expanded, ordered run list."""

    source: str
    base: str
    axes: dict
    seeds: tuple[int, ...]
    requests: int | None
    duration_s: float | None
    deployments: tuple[str, ...]
    variants: tuple[Variant, ...]
    description: str = ""
    names: tuple[str, ...] = ()  # the named variants, in file order (empty without [[variants]])
    baseline: str | None = None
    overrides: dict = field(default_factory=dict)  # named variant -> {dotted key: value}
    deployments_given: bool = True  # False: the file has no `deployments` key (``deployments`` is then all)

    def axis_column(self, key: str) -> list:
        """The axis values as stored in the output tables: numbers and strings as they are, lists and tables as
        JSON text, ints widened to float when the axis mixes ints and floats (one type per column)."""
        return [column_value(v, self.axes[key]) for v in self.axes[key]]


def column_value(value, axis_values: list):
    """An axis value as a sweep table column holds it: scalars as they are (ints as floats when the axis
    mixes them), dates and times as ISO text, anything else as sorted JSON."""
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        mixed = any(isinstance(v, float) for v in axis_values)
        return float(value) if mixed else value
    if isinstance(value, datetime.date | datetime.time):  # a TOML date or time: ISO text, as sweep.json has it
        return json_value(value)
    return json.dumps(value, sort_keys=True, default=json_value)


def json_value(value):
    """A grid value JSON has no type for: a TOML date or time as ISO 8601 text, anything else as text."""
    iso = getattr(value, "isoformat", None)
    return iso() if callable(iso) else str(value)


def embedded_grids() -> list[str]:
    """The names of the grids shipped in ``sim/scenarios/grids/``."""
    return sorted(p.stem for p in GRID_DIR.glob("*.toml"))


def load_grid(name_or_path: str | Path) -> Grid:
    """An embedded grid by name (``policies``) or a grid TOML file by path."""
    if not isinstance(name_or_path, str | Path):  # (a parsed document goes to parse_grid)
        raise UserError(f"a grid is an embedded name, a path or a parsed Grid, got {type(name_or_path).__name__} "
                        "(parse a grid document with sim.grid.parse_grid)")
    doc, path = read_named_toml(name_or_path, GRID_DIR, "grid")
    return parse_grid(doc, source=path.name, base_dir=path.parent)


def parse_grid(doc: dict, source: str = "<grid>", base_dir: str | Path | None = None) -> Grid:
    """Validate a grid document (what ``tomllib`` returns) and expand it into variants."""
    if not isinstance(doc, dict):
        raise UserError(f"{source}: a grid is a table of keys ({', '.join(GRID_KEYS)}), got {type(doc).__name__}")
    base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
    for key in doc:
        if key not in GRID_KEYS:
            raise UserError(f"{source}: unknown key {key!r} (known: {', '.join(GRID_KEYS)})")
    if "base" not in doc:
        raise UserError(f"{source}: 'base' is required (an embedded scenario name or a scenario file)")
    base_path = _base_path(doc["base"], source, base_dir)
    try:
        base_doc = tomllib.loads(base_path.read_text(encoding="utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: base {base_path.name}: not valid TOML: {exc}") from None
    requests, duration = doc.get("requests"), doc.get("duration_s")
    deployments = _deployments(doc.get("deployments", list(DEPLOYMENTS)), source)
    axes = _axes(doc.get("axes", {}), source)
    named = _named(doc.get("variants"), source)
    check_overlaps(source, axes, named)
    check_repeats(source, named)
    check_absent_tables(source, str(doc["base"]), base_doc, axes, named)
    _check_size(source, requests, duration, [*axes, *(k for over in named.values() for k in over)])
    _check_deployments(source, deployments, axes, named)
    baseline = doc.get("baseline")
    if baseline is not None and not isinstance(baseline, str):  # (a list or table is not even hashable)
        raise UserError(f"{source}: baseline must be a variant name, got {baseline!r}")
    if baseline is not None and baseline not in named:
        raise UserError(f"{source}: baseline {baseline!r} is not one of the named variants "
                        f"({', '.join(named) or 'none: add [[variants]]'})")

    def scenario(over: dict, what: str) -> Scenario:
        d = copy.deepcopy(base_doc)
        for key, value in over.items():
            _set(d, key, value)
        try:
            sc = parse_scenario(d, base_path.name, base_dir=base_path.parent)  # registries checked there
        except UserError as exc:
            raise UserError(f"{source}: {what}: {exc}") from None
        return sc

    base_sc = scenario({}, f"base {base_path.name}")
    # Each value alone first, so that an error can name the axis value at fault; a value that is only valid
    # together with another axis (router options of a router another axis sets) is judged in its variants.
    alone: dict[tuple, UserError] = {}
    for key, values in axes.items():
        for value in values:
            try:
                scenario({key: value}, f"axis {key!r} value {value!r}")
            except UserError as exc:
                alone[(key, json.dumps(value, sort_keys=True, default=str))] = exc
    for name, over in named.items():
        scenario(over, f"variant {name!r}")
    seeds = _seeds(doc.get("seeds"), source, base_sc.seed)
    count = max(len(named), 1) * math.prod(len(v) for v in axes.values()) * len(seeds)
    if count > MAX_VARIANTS:  # each is a whole simulation: checking them alone would take minutes and gigabytes
        raise UserError(f"{source}: {count:,} variants (named variants x axis values x seeds), more than "
                        f"{MAX_VARIANTS:,}: split the sweep or vary fewer values at once")
    variants = []
    for name, over in (named or {"": {}}).items():
        for point in itertools.product(*axes.values()):
            values = dict(zip(axes, point, strict=True))
            what = ", ".join(([name] if name else []) + [f"{k}={v!r}" for k, v in values.items()])
            try:
                sc = scenario({**over, **values}, f"variant {what}") if values or over else base_sc
            except UserError as exc:
                blamed = [alone[(k, json.dumps(v, sort_keys=True, default=str))] for k, v in values.items()
                          if (k, json.dumps(v, sort_keys=True, default=str)) in alone]
                raise (blamed[0] if blamed else exc) from None
            for seed in seeds:
                variants.append(Variant(len(variants), values, seed, sc, name))
    check_variant_traces(source, variants)  # every distinct trace file read once, before any variant runs
    return Grid(source=source, base=str(doc["base"]), axes=axes, seeds=seeds, requests=requests,
                duration_s=None if duration is None else float(duration), deployments=deployments,
                variants=tuple(variants), description=str(doc.get("description", "")), names=tuple(named),
                baseline=baseline, overrides=named, deployments_given="deployments" in doc)


def with_size(grid: Grid, requests: int | None = None, duration_s: float | None = None) -> Grid:
    """``grid`` with the command line's size (``--requests`` / ``--duration``) for every variant instead of its
    own, refused as the grid's own size is: out of range, or beside an axis or named variant that sets a size."""
    _check_size(grid.source, requests, duration_s,
                [*grid.axes, *(k for over in grid.overrides.values() for k in over)], flags=True)
    if requests is None and duration_s is None:
        return grid
    return replace(grid, requests=requests, duration_s=None if duration_s is None else float(duration_s))


def _check_size(source: str, requests, duration, keys: list[str], flags: bool = False) -> None:
    """The size every variant runs (checked before any worker starts); ``keys``: what the variants set."""
    names = ("--requests", "--duration") if flags else ("requests", "duration_s")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, Integral) or requests <= 0):
        raise UserError(f"{source}: {names[0]} must be a positive integer, got {requests!r}")
    if requests is not None and requests > MAX_REQUESTS:
        raise UserError(f"{source}: {names[0]} must be at most {MAX_REQUESTS:,} a variant, got {requests:,}")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int | float)
                                 or not 0 < duration < float("inf")):
        raise UserError(f"{source}: {names[1]} must be a positive number, got {duration!r}")
    if requests is not None and duration is not None:
        raise UserError(f"{source}: give {names[0]} or {names[1]}, not both")
    if requests is None and duration is None:
        return
    # the size is applied to every variant last: a variant's own would be overwritten silently
    sized = f"{names[0]} = {requests}" if requests is not None else f"{names[1]} = {duration}"
    by = sized.replace(" = ", " ") if flags else f"the grid's {sized}"
    for key in keys:
        if key in SIZE_KEYS:
            raise UserError(f"{source}: {key!r} varies the size, which {by} sets for every variant: "
                            "drop one of them")


def only_deployments(grid: Grid, deployments: tuple[str, ...]) -> Grid:
    """``grid`` simulating ``deployments`` only, refused as a file's ``deployments`` would be."""
    _check_deployments(grid.source, deployments, grid.axes, grid.overrides)
    return replace(grid, deployments=deployments)


def _check_deployments(source: str, deployments: tuple[str, ...], axes: dict, named: dict) -> None:
    """A key of a deployment the grid does not simulate would label variants that run identically."""
    for what, keys in [("axis", list(axes)), *((f"variant {n!r}: key", list(o)) for n, o in named.items())]:
        for key in keys:
            table = ONE_SIDED.get(key, key.split(".", 1)[0])
            if table in DEPLOYMENTS and table not in deployments and key not in INHERITED:
                acts = "sets" if key.startswith(f"{table}.") else "acts on"
                raise UserError(f"{source}: {what} {key!r} {acts} the {table} deployment, which deployments = "
                                f"{list(deployments)} does not simulate: drop the key or add {table!r} "
                                "to deployments")


def _base_path(base, source: str, base_dir: Path) -> Path:
    if not isinstance(base, str) or not base.strip():
        raise UserError(f"{source}: base must be a scenario name or file, got {base!r}")
    if not Path(base).suffix and (SCENARIO_DIR / f"{base}.toml").exists():
        return SCENARIO_DIR / f"{base}.toml"
    path = Path(base).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise UserError(f"{source}: base {base!r} not found: not a file and not one of the embedded scenarios "
                        f"({', '.join(embedded_scenarios())})")
    return path


def _deployments(raw, source: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or any(d not in DEPLOYMENTS for d in raw) or len(set(raw)) < len(raw):
        raise UserError(f"{source}: deployments must be a non-empty list of distinct names from "
                        f"{', '.join(DEPLOYMENTS)}, got {raw!r}")
    return tuple(d for d in DEPLOYMENTS if d in raw)  # always edge first: output order does not depend on the file


def _seeds(raw, source: str, default: int) -> tuple[int, ...]:
    if raw is None:
        return (default,)
    if (not isinstance(raw, list) or not raw or len(set(raw)) < len(raw)
            or any(isinstance(s, bool) or not isinstance(s, Integral) or not 0 <= s <= MAX_INT for s in raw)):
        raise UserError(f"{source}: seeds must be a non-empty list of distinct integers in [0, 2**63 - 1], "
                        f"got {raw!r}")
    return tuple(int(s) for s in raw)  # (numpy integers as Python ints)


def _axes(raw, source: str, table: str = " [axes]") -> dict:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: [axes] must be a table of \"dotted.field\" = [values], got {raw!r}")
    tables = _table_fields()
    top = {f.name for f in fields(Scenario)} - NOT_AXES
    out = {}
    for key, values in raw.items():
        if isinstance(values, dict) and "." not in key:  # an unquoted dotted key (edge.placement = [...]) arrives
            # as a nested table; a quoted one holds its dots (its table value is then refused as not a list)
            raise UserError(f"{source}{table}: axis {key!r} must be a list of values; quote dotted keys, "
                            f"e.g. \"{_leaf(key, values)}\" = [...]")
        parts = key.split(".", 2)  # (the key inside a table field may hold dots: a model id in mix)
        if parts[0] in tables:
            known = tables[parts[0]]
            if len(parts) < 2 or parts[1] not in known:
                field = parts[1] if len(parts) > 1 else ""
                raise UserError(f"{source}{table}: unknown axis {key!r}: [{parts[0]}] has no field {field!r} "
                                f"(fields: {', '.join(sorted(known))})")
            if len(parts) == 3 and parts[1] not in TABLE_FIELDS:
                raise UserError(f"{source}{table}: unknown axis {key!r}: only table fields "
                                f"({', '.join(sorted(TABLE_FIELDS))}) take a key after the field name")
        elif len(parts) != 1 or parts[0] not in top:
            raise UserError(f"{source}{table}: unknown axis {key!r} (a top-level scenario field: "
                            f"{', '.join(sorted(top))}; or table.field with table one of "
                            f"{', '.join(tables)}; the seed is swept with seeds = [...])")
        if key in RESERVED_COLUMNS:
            raise UserError(f"{source}{table}: axis {key!r} would shadow an output column")
        values = plain(values) if isinstance(values, list | tuple) or type(values).__module__ == "numpy" else values
        if not isinstance(values, list) or not values:
            raise UserError(f"{source}{table}: axis {key!r} must be a non-empty list of values, got {values!r}")
        seen = [canonical(v) for v in values]  # (20 and 20.0 run the same variant)
        if len(set(seen)) < len(seen):
            raise UserError(f"{source}{table}: axis {key!r} repeats a value: {values!r}")
        out[key] = list(values)
    return out


def _named(raw, source: str) -> dict[str, dict]:
    """``[[variants]]``: name -> {dotted key: value}, keys checked like axes."""
    if raw is None:
        return {}
    if not isinstance(raw, list) or not raw or not all(isinstance(v, dict) for v in raw):
        raise UserError(f"{source}: variants must be a list of tables ([[variants]] with a name), got {raw!r}")
    out = {}
    for i, v in enumerate(raw):
        name = v.get("name")
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"{source} [[variants]][{i}]: a non-empty 'name' is required")
        if name in out:
            raise UserError(f"{source} [[variants]]: variant name {name!r} repeats")
        over = {k: plain(x) for k, x in v.items() if k != "name"}
        for k, x in over.items():
            # An unquoted dotted key (edge.placement = "...") arrives as a nested table under a key with no dot; a
            # quoted one keeps its dots, and its table value sets that field as a whole, as an axis value does.
            if isinstance(x, dict) and "." not in k:
                raise UserError(f"{source} [[variants]] {name!r}: key {k!r} must be a value; quote dotted keys, "
                                f"e.g. \"{_leaf(k, x)}\" = ...")
        _axes({k: [x] for k, x in over.items()}, f"{source} [[variants]] {name!r}", table="")
        out[name] = over
    return out


def _leaf(key: str, table: dict) -> str:
    """The dotted path down a nested table's first keys (``edge.router_options.window_ms``): what to quote."""
    while isinstance(table, dict) and table:
        key, table = f"{key}.{next(iter(table))}", next(iter(table.values()))
    return key


def _set(doc: dict, key: str, value) -> None:
    """Write ``value`` at dotted ``key`` of a scenario document, creating tables on the way."""
    *path, last = key.split(".", 2)  # (as _axes reads it)
    node = doc
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"field {part!r} is not a table")
    node[last] = copy.deepcopy(value)
