"""Registries: pick an implementation by name, with typed options checked before anything runs.

Every pluggable part of edgepop registers its implementations in one :class:`Registry`: routing policies,
placement policies, autoscalers, service-time (perf) models, serving techniques, fault and batch policies, trace
formats. A registry knows each entry's options from its signature, so a scenario file is checked when it is
parsed, long before a workload is generated::

    ROUTERS = Registry("routing policy", skip=2)      # (state, rng) are not options

    @ROUTERS.register("p2c")
    class PowerOfTwoChoices(Router):
        def __init__(self, state, rng=None, k: int = 4): ...

    ROUTERS.check("p2c", {"k": "4"}, where="s.toml [edge] router_options")
    # UserError: s.toml [edge] router_options: routing policy 'p2c': option 'k' must be an integer, got '4'
    ROUTERS.create("p2c", state, rng, options={"k": 4})

Options are the parameters with defaults after the first ``skip`` positional ones; the type of an option is the
type of its default (``bool``, ``int``, ``float`` (ints accepted), ``str``, ``dict``, ``list``) or, for a
``None`` default, the non-None part of its annotation when that is one of those. An entry whose callable takes
``**options`` can ``forward`` them: ``forward=("fallback", "nearest-with-capacity")`` checks unknown keys as
options of the entry named by its ``fallback`` option (default ``nearest-with-capacity``) in the same registry,
together with those given as a table under its ``fallback_options`` option (an option the wrapper and the wrapped
policy both have goes to the wrapper unless given there).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from edgepop.errors import UserError

_SIMPLE = {"bool": bool, "int": int, "float": float, "str": str, "dict": dict, "list": list, "tuple": list}


@dataclass
class Option:
    """One option of an entry: its name, its default and the type its values must have (None: anything)."""

    name: str
    default: Any
    kind: type | None


@dataclass
class Entry:
    """A registered implementation: a class or factory function and its options."""

    name: str
    target: Any
    options: dict[str, Option]
    doc: str = ""
    forward: tuple[str, str] | None = None
    takes_any: bool = False  # the callable has **kwargs and no forward: extra keys are not checked here
    extra: dict = field(default_factory=dict)


def merge_forwarded(loose: dict, nested: dict | None, key: str) -> dict:
    """The options a wrapper forwards to the policy named by its ``key`` option: those it does not know itself
    (``loose``) and those given under ``<key>_options`` (``nested``), the only way to set one whose name the
    wrapper also uses (``k``). ValueError for a name given both ways."""
    both = sorted(set(loose) & set(nested or {}))
    if both:
        raise ValueError(f"option(s) {', '.join(map(repr, both))} given both directly and in {key}_options")
    return {**loose, **(nested or {})}


# The top-level packages edgepop ships: an entry whose target is defined outside them is a user's (a plugin).
SHIPPED_PACKAGES = frozenset({"edgepop", "topology", "controlplane", "dataplane", "sim"})


def is_shipped(module: str | None) -> bool:
    """True for a module of edgepop's own packages (``controlplane.routing.p2c``), False for a user's."""
    return bool(module) and module.split(".", 1)[0] in SHIPPED_PACKAGES


def defined_in(obj, package: str) -> bool:
    """Whether ``obj``'s class is defined in ``package`` or one of its modules (``controlplane.routing``: a
    shipped router; a subclass defined elsewhere is not)."""
    module = type(obj).__module__ or ""
    return module == package or module.startswith(package + ".")


def check_name(kind: str, name) -> None:
    """ValueError unless ``name`` can name an entry: a non-empty str without whitespace, commas or control
    characters (names are listed comma-separated in errors, given on command lines and in TOML files)."""
    if not isinstance(name, str) or not name or any(c.isspace() or c == "," or not c.isprintable() for c in name):
        raise ValueError(f"{kind} name must be a non-empty string without whitespace, commas or control "
                         f"characters, got {name!r}")


def _identity(target) -> tuple[str | None, str | None]:
    return getattr(target, "__module__", None), getattr(target, "__qualname__", None)


class Registry:
    """Named implementations of one kind (``kind`` names it in errors, e.g. "routing policy").

    Every registry made is listed in :attr:`instances` (the sweep looks there for entries its worker processes
    must import)."""

    instances: list[Registry] = []

    def __init__(self, kind: str, skip: int = 0):
        self.kind, self.skip = kind, skip
        self._entries: dict[str, Entry] = {}
        Registry.instances.append(self)

    # ------------------------------------------------------------------ registration
    def register(self, name: str, *, forward: tuple[str, str] | None = None, **extra):
        """Decorator adding a class or function under ``name``; ``extra`` is kept on the entry for callers.

        ``name`` must be a non-empty str without whitespace, commas or control characters (ValueError). A name
        already taken is refused (ValueError) unless the new target has the same ``__module__`` and
        ``__qualname__`` as the registered one: the same definition run again (a notebook cell re-run,
        ``importlib.reload``), which replaces the entry. A shipped entry is never replaced by a user's target."""
        check_name(self.kind, name)

        def add(target):
            old = self._entries.get(name)
            if old is not None and (_identity(old.target) != _identity(target) or None in _identity(target)):
                whose = "shipped with edgepop" if is_shipped(_identity(old.target)[0]) else "taken"
                raise ValueError(f"{self.kind} {name!r} registered twice: the name is {whose} "
                                 f"({'.'.join(map(str, _identity(old.target)))}); pick another name")
            options, takes_any = _options(target, self.skip)
            doc = (inspect.getdoc(target) or "").split("\n\n")[0].replace("\n", " ")
            self._entries[name] = Entry(name, target, options, doc, forward, takes_any and forward is None, extra)
            if isinstance(target, type):
                target.name = name
            return target
        return add

    # ------------------------------------------------------------------ lookup
    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        """Every entry, in name order."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self.names())

    def options_in_effect(self, name: str, given: dict | None = None) -> dict:
        """The options entry ``name`` runs with: its defaults (those a JSON file can hold), then ``given``."""
        defaults = {o.name: o.default for o in self.entry(name).options.values()
                    if o.default is None or isinstance(o.default, bool | int | float | str)}
        return {**defaults, **(given or {})}

    def entry(self, name: str, where: str = "") -> Entry:
        """The entry called ``name``; an unknown name is one UserError listing the valid ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            prefix = f"{where}: " if where else ""
            raise UserError(f"{prefix}unknown {self.kind} {name!r} (known: {', '.join(self.names())})") from None

    def get(self, name: str, where: str = ""):
        return self.entry(name, where).target

    # ------------------------------------------------------------------ options
    def check(self, name: str, options: dict | None = None, where: str = "") -> dict:
        """Validate ``name`` and its ``options`` (names and types); returns the options. One-line UserError."""
        e = self.entry(name, where)
        options = {} if options is None else options
        prefix = f"{where}: " if where else ""
        if not isinstance(options, dict):
            raise UserError(f"{prefix}{self.kind} {name!r}: options must be a table, got {options!r}")
        extra = {}
        for key, value in options.items():
            opt = e.options.get(key)
            if opt is None:
                if e.forward is not None or e.takes_any:
                    extra[key] = value
                    continue
                known = ", ".join(sorted(e.options)) or "none"
                raise UserError(f"{prefix}{self.kind} {name!r} has no option {key!r} (options: {known})")
            _check_type(opt, value, f"{prefix}{self.kind} {name!r}")
        hook = getattr(e.target, "check_options", None)  # value checks beyond the type (ranges), if it has them
        if callable(hook):
            try:
                hook(**{k: v for k, v in options.items() if k in e.options})
            except ValueError as exc:
                raise UserError(f"{prefix}{self.kind} {name!r}: {exc}") from None
        if e.forward is not None:  # the wrapped policy: its name always, the options forwarded to it
            key, default = e.forward
            inner = options.get(key, default)
            try:
                forwarded = merge_forwarded(extra, options.get(f"{key}_options"), key)
            except ValueError as exc:
                raise UserError(f"{prefix}{self.kind} {name!r}: {exc}") from None
            if isinstance(inner, str):
                self.check(inner, forwarded, f"{where} ({name} -> {key} {inner!r})".strip())
        return options

    def create(self, name: str, *args, options: dict | None = None, where: str = ""):
        """Check the options, then call the entry with ``args`` and the options as keywords."""
        options = self.check(name, options, where)
        target = self._entries[name].target
        try:
            return target(*args, **options)
        except (TypeError, ValueError) as exc:
            prefix = f"{where}: " if where else ""
            raise UserError(f"{prefix}{self.kind} {name!r}: {exc}") from None

    def describe(self) -> list[tuple[str, str, str]]:
        """(name, options with defaults, first docstring paragraph) per entry, for ``--list`` style output."""
        rows = []
        for name in self.names():
            e = self._entries[name]
            opts = ", ".join(f"{o.name}={o.default!r}" for o in e.options.values())
            rows.append((name, opts, e.doc))
        return rows


def _options(target, skip: int) -> tuple[dict[str, Option], bool]:
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return {}, True
    try:
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # noqa: BLE001  (annotations that do not resolve: fall back to the defaults' types)
        hints = {}
    params = list(sig.parameters.values())
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    skipped = {p.name for p in positional[:skip]}
    out = {}
    for p in params:
        if p.name in skipped or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.default is p.empty:
            continue
        default = p.default
        if dataclasses.is_dataclass(target) and type(default).__name__ == "_HAS_DEFAULT_FACTORY_CLASS":
            default = target.__dataclass_fields__[p.name].default_factory()
        out[p.name] = Option(p.name, default, _kind(default, hints.get(p.name)))
    return out, takes_any


def _kind(default, hint) -> type | None:
    """The type an option's values must have: from its annotation when it has one, else from its default."""
    if hint is not None:
        return _hint_kind(hint)
    for t in (bool, int, float, str, dict, list, tuple):
        if type(default) is t:
            return list if t is tuple else t
    return None


def _hint_kind(hint) -> type | None:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = {_hint_kind(a) for a in args}
        if kinds == {int, float}:
            return float
        return kinds.pop() if len(kinds) == 1 else None
    origin = typing.get_origin(hint) or hint
    return _SIMPLE.get(getattr(origin, "__name__", ""), None)


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table",
          list: "a list"}


def _check_type(opt: Option, value, where: str) -> None:
    t = opt.kind
    if t is None or (value is None and opt.default is None):
        return
    if t is bool:
        ok = isinstance(value, bool)
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif t is list:
        ok = isinstance(value, list | tuple)
    else:
        ok = isinstance(value, t)
    if not ok:
        raise UserError(f"{where}: option {opt.name!r} must be {_NAMES[t]}, got {value!r}")
    if t in (int, float) and value != value:  # NaN: no range check downstream can catch it (every comparison fails)
        raise UserError(f"{where}: option {opt.name!r} must be a number, got {value!r}")
