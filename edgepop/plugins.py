"""Outside modules that register policies (plugins): loaded for the ``edgepop`` command, imported by sweep workers.

A plugin is any Python module that registers entries in edgepop's registries when it is imported (a placement
policy with ``@PLACEMENTS.register("name")``, a router with ``@ROUTERS.register("name")``, ...; docs/extending.md).
``edgepop --plugin MODULE_OR_FILE.py`` (repeatable) and the ``EDGEPOP_PLUGINS`` environment variable
(comma-separated) name them; :func:`load_plugin` imports one, and a module that cannot be imported is one
:class:`~edgepop.errors.UserError` line naming it and the error.

A sweep's worker processes import, before a variant runs, the modules of every registered entry that edgepop does
not ship and every plugin loaded here (:func:`worker_modules`, :func:`import_worker_modules`), so a policy
registered in the parent is known in its workers too. A leaf module: it imports nothing heavy (a pool worker
imports it first).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from edgepop.errors import UserError

ENV = "EDGEPOP_PLUGINS"
SHOWS_WHERE = "(EDGEPOP_TRACEBACK=1 shows where)"
MAIN_ALIAS = "__edgepop_main__"  # the name a worker without the parent's main module imports its file under

# (module name, file or None) of each plugin loaded by load_plugin, in loading order
_loaded: list[tuple[str, str | None]] = []


def is_file_spec(spec: str) -> bool:
    """A plugin given as a file path (``my_policies.py``, ``dir/mod.py``) rather than a module name."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def load_plugin(spec: str, where: str = "--plugin"):
    """Import the plugin ``spec`` (a module name, or the path of a ``.py`` file, imported under its stem, its
    folder added at the end of ``sys.path`` so that it can import the modules beside it) and return the module;
    remembered for sweep workers. Any failure is one UserError naming ``where`` and ``spec``:
    a missing module or file, a SyntaxError (with file:line), an exception raised while importing it."""
    label = f"{where} {spec!r}"
    spec = spec.strip()
    if not spec:
        raise UserError(f"{label}: empty plugin name (give a module name or a .py file)")
    try:
        if is_file_spec(spec):
            module = _load_file(spec, label)
        else:
            module = importlib.import_module(spec)
    except UserError:
        raise
    except SyntaxError as exc:
        raise UserError(f"{label}: SyntaxError at {exc.filename}:{exc.lineno}: {exc.msg}") from exc
    except ImportError as exc:
        hint = (f" (a file here? give its path: {spec}.py)" if isinstance(exc, ModuleNotFoundError)
                and exc.name == spec and Path(f"{spec}.py").is_file() else "")
        raise UserError(f"{label}: cannot import it: {type(exc).__name__}: {_first_line(exc)}{hint}") from exc
    except Exception as exc:  # noqa: BLE001  (anything the module raises at import: one line, the cause chained)
        raise UserError(f"{label}: {type(exc).__name__} while importing it: {_first_line(exc)} "
                        f"{SHOWS_WHERE}") from exc
    entry = (module.__name__, getattr(module, "__file__", None))
    if entry not in _loaded:
        _loaded.append(entry)
    return module


def load_plugins(specs, env: str | None = None) -> list:
    """Load the ``--plugin`` values ``specs``, then those of ``env`` (the ``EDGEPOP_PLUGINS`` value,
    comma-separated; None: read it from the environment). Returns the modules."""
    env = os.environ.get(ENV, "") if env is None else env
    modules = [load_plugin(s) for s in specs or ()]
    modules += [load_plugin(s, ENV) for s in env.split(",") if s.strip()]
    return modules


def _load_file(spec: str, label: str):
    path = Path(spec).expanduser().resolve()
    if path.suffix != ".py":
        raise UserError(f"{label}: a plugin file must be a .py file")
    if not path.is_file():
        raise UserError(f"{label}: no such file")
    name = path.stem
    if not name.isidentifier():
        raise UserError(f"{label}: {name!r} is not a valid module name: rename the file")
    present = sys.modules.get(name)
    if present is not None:
        if getattr(present, "__file__", None) and Path(present.__file__).resolve() == path:
            return present  # loaded already
        other = getattr(present, "__file__", None) or "built in"
    else:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        other = None if found is None or (found.origin and Path(found.origin).resolve() == path) else (
            found.origin or "a package")
    if other is not None:  # (imported under that name, it would stand in for the other module everywhere)
        raise UserError(f"{label}: its name {name!r} is that of another module ({other}): rename the file")
    if str(path.parent) not in sys.path:  # the modules beside it import, as beside a script (last: no shadowing)
        sys.path.append(str(path.parent))
    return _exec_file(name, path)


def _exec_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (before it runs: a dataclass looks its module up there)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


# ---------------------------------------------------------------------- sweep workers
def unshippable(module: str | None) -> bool:
    """True when a worker process cannot import ``module``: ``__main__`` without a file (a notebook, ``python
    -c``, standard input) or a module that is gone from ``sys.modules``."""
    if module == "__main__":  # (standard input's __file__ is '<stdin>', no file a worker can run again)
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        return not path or path.startswith("<") or not os.path.isfile(path)
    return module is None or module not in sys.modules


def worker_modules() -> list[tuple[str, str | None]]:
    """(module name, file) of every plugin loaded by :func:`load_plugin` and of every registered entry that
    edgepop does not ship, in that order, for worker processes to import; entries a worker cannot import
    (:func:`unshippable`) are left out (the sweep refuses a grid that uses one)."""
    from edgepop.registry import Registry, is_shipped

    out = list(_loaded)
    for registry in Registry.instances:
        for entry in registry.entries():
            module = getattr(entry.target, "__module__", None)
            if is_shipped(module) or unshippable(module):
                continue
            item = (module, getattr(sys.modules[module], "__file__", None))
            if item not in out:
                out.append(item)
    return out


def import_worker_modules(modules) -> list[str]:
    """In a worker process: import each (module name, file) of :func:`worker_modules` not imported yet, by name
    or, where that name is not on this process's path, from its file. The parent's ``__main__`` (a script) is
    imported from its file unless this process already ran it (a spawned pool worker re-runs its parent's main
    module). Returns one line per module that failed (the sweep reports them where a policy it uses is then
    missing)."""
    problems = []
    for name, file in modules:
        try:
            if name == "__main__":
                ran = getattr(sys.modules.get("__main__"), "__file__", None)
                if not (ran and file and Path(ran).resolve() == Path(file).resolve()) and MAIN_ALIAS not in sys.modules:
                    _exec_file(MAIN_ALIAS, Path(file))
            elif name not in sys.modules:
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    if not (file and exc.name == name and "." not in name):
                        raise
                    _exec_file(name, Path(file))
        except Exception as exc:  # noqa: BLE001  (one line for the sweep's error)
            problems.append(f"a worker could not import {name!r} ({file or 'no file'}): {type(exc).__name__}: "
                            f"{_first_line(exc)}")
    return problems
