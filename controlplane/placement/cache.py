"""Placements of deterministic policies cached on disk, keyed by a hash of everything they depend on.

Greedy placement is most of a large deployment's set-up (seconds at thousands of PoPs) and gives the same plan
for the same inputs every time: a sweep that re-runs one deployment with other seeds, routers or techniques
would otherwise recompute it per run. Only policies that declare ``cacheable = True`` are kept (a time-budgeted
solver such as the ILP is not: its answer depends on the machine's speed).

The key is a SHA-256 over: the source of every module of ``controlplane.placement`` and of
``controlplane.ordering`` (a code change can change a plan), the policy's class and options, the source of the
module of every class in the policy's MRO outside those (a policy subclassed in a user's module is keyed by that
module's code; a class whose source cannot be read, e.g. one defined interactively, is never cached), the state of the
placement's random generator, the problem's options, every array of its :class:`~controlplane.placement.network.
Network` (demand pairs, candidate sites and RTTs, capacities, GPU memory and fits, which carry the performance
model and the catalog) and the fleet's node table. Change any of them and the key changes, so a stale plan can
never be used. A hit restores the generator's state after the policy's run, so later draws are the same either
way. Entries are JSON under ``$EDGEPOP_CACHE_DIR/placement`` (or the user cache directory, next to the RTT
matrices of :mod:`topology.rtt_cache`), written atomically; an unreadable entry is recomputed.
``EDGEPOP_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.memory import collector_paused
from topology.cache_files import cache_folder, write_atomic

_CODE: list[str] = []
_SKIP = ("problem", "fleet")  # hashed through their parts below


def placement_dir() -> Path | None:
    """Where placements are kept (None when the disk cache is off)."""
    return cache_folder("placement")


def _code_files() -> list[Path]:
    here = Path(__file__).parent
    return [*sorted(here.glob("*.py")), here.parent / "ordering.py"]


def _code_digest() -> str:
    if not _CODE:
        h = hashlib.sha256()
        for path in _code_files():
            h.update(path.name.encode())
            h.update(path.read_bytes())
        _CODE.append(h.hexdigest())
    return _CODE[0]


def _policy_code(policy) -> list[tuple[str, bytes]] | None:
    """(name, source) of each module holding a class of the policy's MRO that :func:`_code_digest` does not hash
    (none for the shipped policies, so their keys are those of before); None when one cannot be read."""
    shipped = {path.resolve() for path in _code_files()}
    found: dict[Path, bytes] = {}
    for cls in type(policy).__mro__:
        if cls.__module__ == "builtins":
            continue
        try:
            path = Path(inspect.getsourcefile(cls) or "").resolve()  # None: no file on disk
            if path not in shipped and path not in found:
                found[path] = path.read_bytes()
        except (TypeError, OSError):  # e.g. a class of an interactive session: its code cannot be keyed
            return None
    return [(path.name, code) for path, code in found.items()]


def _update(h, value) -> None:
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype.str}{value.shape}".encode())
        if value.dtype == object:
            h.update(repr(value.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(value))  # the bytes, without a copy
    elif isinstance(value, pd.DataFrame):
        h.update(repr(list(value.columns)).encode())
        h.update(pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes())
    else:
        h.update(repr(value).encode())
    h.update(b"|")


def placement_key(policy, problem, rng: np.random.Generator) -> str | None:
    """The cache key of ``policy.place(problem, rng)`` (see the module docstring for what it covers); None when
    the source of one of the policy's classes cannot be read."""
    extra = _policy_code(policy)
    if extra is None:
        return None
    h = hashlib.sha256(_code_digest().encode())
    _update(h, f"{type(policy).__module__}.{type(policy).__qualname__}")
    for name, code in extra:
        _update(h, name)
        h.update(code)
    _update(h, repr(policy))
    _update(h, rng.bit_generator.state)
    for name, value in sorted(vars(problem).items()):
        if isinstance(value, bool | int | float | str | type(None)):
            _update(h, (name, value))
    net = problem.network()
    for name, value in sorted(vars(net).items()):
        if name not in _SKIP:
            _update(h, name)
            _update(h, value)
    _update(h, problem.fleet.nodes)
    return h.hexdigest()


def cached_place(policy, problem, rng: np.random.Generator):
    """``policy.place(problem, rng)`` (through :func:`~controlplane.placement.base.run_policy`: a user's policy
    that fails is one UserError naming it), or the same placement from the disk cache (``cacheable`` policies only).

    The returned placement's ``from_cache`` says which."""
    from controlplane.placement.base import PlacementError, run_policy
    from controlplane.placement.result import Placement

    folder = placement_dir()
    key = None if folder is None or not getattr(policy, "cacheable", False) else placement_key(policy, problem, rng)
    if key is None:
        with collector_paused():
            return run_policy(policy, problem, rng)
    path = folder / f"{key}.json"
    entry = _read(path)
    if entry is not None:
        try:
            placement = Placement(problem, problem.fleet, entry["policy"],
                                  [(n, m, tuple(g)) for n, m, g in entry["placed"]],
                                  [tuple(d) for d in entry["dropped"]], entry["solver"])
            rng.bit_generator.state = entry["rng_state"]
        except (KeyError, TypeError, ValueError, IndexError, PlacementError):
            entry = None  # a broken entry: computed again (and rewritten) below
        else:
            placement.from_cache = True
            return placement
    with collector_paused():
        placement = run_policy(policy, problem, rng)
    if placement.fleet is problem.fleet:  # a policy that built a fleet of its own is not keyed by it
        rows, model_index = placement.table, {}
        for i, m in enumerate(problem.models):  # (list.index's answer: the first, were a name listed twice)
            model_index.setdefault(m, i)
        _write(path, {"policy": placement.policy,
                      "placed": [[int(n), model_index[m], [int(g) for g in gpus]]
                                 for n, m, gpus in zip(rows.node, rows.model, rows.gpu_index, strict=True)],
                      "dropped": [list(d) for d in placement.dropped], "solver": placement.solver,
                      "rng_state": rng.bit_generator.state})
    return placement


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, entry: dict) -> None:
    try:
        data = json.dumps(entry).encode()
    except (TypeError, ValueError):
        return  # a policy's solver figures that JSON cannot hold: the plan is not kept
    write_atomic(path, lambda fh: fh.write(data))
