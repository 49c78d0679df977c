"""Registered policies that edgepop does not ship, in a sweep's worker processes (docs/sweep.md, "Your own policies").

A spawned pool worker or a Ray worker starts with edgepop's own registries only. Before anything runs, the sweep
finds the entries of users' modules its variants use (:func:`used_entries`) and refuses one that no worker can
import (defined in a notebook or ``python -c``: module ``__main__`` without a file); each worker then imports the
modules of every such entry and every ``--plugin`` (:func:`edgepop.plugins.worker_modules`) and checks that the
entries a variant uses are there (:func:`prepare_worker`) before it runs it.
"""

from __future__ import annotations

import dataclasses

from edgepop.errors import UserError
from edgepop.registry import Registry, is_shipped

_prepared: dict = {}  # per worker process: (modules, expected) -> error message or "" (ready)


def _strings(obj, out: set, depth: int = 0) -> set:
    """Every str held by a scenario (dataclass fields, dict values, list items), where a policy is named."""
    if depth > 8:
        return out
    if isinstance(obj, str):
        out.add(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _strings(getattr(obj, f.name), out, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            _strings(value, out, depth + 1)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _strings(value, out, depth + 1)
    return out


def used_entries(scenario) -> list[tuple[Registry, object]]:
    """(registry, entry) of each registered entry from outside edgepop that ``scenario`` uses: its name is the
    value of one of the scenario's fields or options (a serving technique: its switch is on)."""
    names = _strings(scenario, set())
    used = []
    for registry in Registry.instances:
        for entry in registry.entries():
            if is_shipped(getattr(entry.target, "__module__", None)):
                continue
            on = entry.extra.get("on")
            if entry.name in names or (callable(on) and _switched_on(on, scenario)):
                used.append((registry, entry))
    return used


def _switched_on(on, scenario) -> bool:
    try:
        return bool(on(scenario.techniques))
    except Exception:  # noqa: BLE001  (not a technique's switch)
        return False


def check_grid_entries(grid, leaves_process: bool) -> list[tuple[tuple[str, str], ...]]:
    """Per variant of ``grid``, the (registry kind, name) of every user entry it uses, for the workers to check.
    When the variants run in other processes (``leaves_process``), an entry no worker can import (defined in
    ``__main__`` without a file) is one UserError naming the variant, the entry, why and what to do."""
    from edgepop.plugins import unshippable

    per_variant = []
    for v in grid.variants:
        used = used_entries(v.scenario)
        for registry, entry in used:
            module = getattr(entry.target, "__module__", None)
            if leaves_process and unshippable(module):
                raise UserError(
                    f"{grid.source}: variant {v.id} ({v.label}): {registry.kind} {entry.name!r} is defined in "
                    f"{module} without a file (a notebook or `python -c`), which sweep worker processes cannot "
                    "import: put it in a .py module and import that, or run the sweep with workers=1 "
                    "(in this process)")
        per_variant.append(tuple((registry.kind, entry.name) for registry, entry in used))
    return per_variant


def prepare_worker(modules, expected, problems=()) -> str:
    """In a worker, once: import ``modules`` (:func:`edgepop.plugins.import_worker_modules`) and check that every
    (kind, name) in ``expected`` is registered here. "" when ready, else the one-line reason (with ``problems``,
    the imports that failed before)."""
    key = (tuple(map(tuple, modules)), tuple(map(tuple, expected)), tuple(problems))
    if key not in _prepared:
        _prepared[key] = _prepare(modules, expected, list(problems))
    return _prepared[key]


def _prepare(modules, expected, problems: list[str]) -> str:
    from edgepop.plugins import import_worker_modules

    problems += import_worker_modules(modules)
    import sim.run  # noqa: F401  (edgepop's registries, as a variant sees them)

    kinds = {r.kind: r for r in Registry.instances}
    missing = [f"{kind} {name!r}" for kind, name in expected if kind not in kinds or name not in kinds[kind]]
    if not missing:
        return ""
    if problems:
        return f"{', '.join(missing)} not registered in the sweep's worker processes: {'; '.join(problems)}"
    return (f"{', '.join(missing)} registered in the sweep's process but not in its worker processes: register "
            "it at the top level of a .py module (not inside an `if __name__ == '__main__':` block) and import "
            "that module, or run the sweep with workers=1 (in this process)")


def run_prepared(task, modules=(), expected=(), run=None, problems=()) -> dict:
    """``run(task)`` (default :func:`sim.sweep_variant.run_variant`) after :func:`prepare_worker` (the Ray
    engine's task; the local pool's is :func:`sim.pool_worker.run_task`)."""
    problem = prepare_worker(modules, expected, problems)
    if problem:
        return {"id": task.variant.id, "error": problem, "user_error": True}
    if run is None:
        from sim.sweep_variant import run_variant as run

    return run(task)
