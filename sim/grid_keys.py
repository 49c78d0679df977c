"""Checks of a sweep grid's keys and values against each other (used by :func:`sim.grid.parse_grid`): keys that
overlap, values that repeat, and keys into a table whose absence from the base scenario means something."""

from __future__ import annotations

import math

from edgepop.errors import UserError

# Table fields whose absence does not mean "empty": a key into them on a base without the table would build a table
# of that key alone. (Options tables merge with the policy's defaults, tokens with the default distributions, and
# spec_acceptance has one key, so a key into those is the same as the defaults with that key changed.)
ABSENT_MEANS = {("workload", "mix"): "a mix.<model> key would make that model the whole mix; give workload.mix "
                                     "whole (model = share for every model)"}


def parts(key: str) -> tuple[str, ...]:
    """A key's path (``table``, ``field``, ``key``) as the grid reads it: a model id in ``mix`` keeps its dots."""
    return tuple(key.split(".", 2))


def overlap(a: str, b: str) -> bool:
    """Whether two keys write the same place: equal, or one is a table the other is a key of."""
    pa, pb = parts(a), parts(b)
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def plain(value):
    """``value`` with numpy scalars (``np.int64(32)``, ``np.float64(20.0)``, ``np.bool_``) and arrays turned into
    Python ones, in lists and tables too: a grid built in Python from ``np.arange`` holds what a TOML file would,
    checked, labelled and stored the same way."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # a numpy scalar or array (.item() of a scalar, nested lists of one)
    if callable(tolist) and type(value).__module__ == "numpy":
        return plain(tolist())
    return value


def canonical(value):
    """A hashable form under which equal values compare equal: 20 and 20.0 are one value; true is not 1 (a bool is
    not a number here); tables compare whatever their key order."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("nan",) if isinstance(value, float) and math.isnan(value) else ("number", value)
    if isinstance(value, list | tuple):
        return ("list", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("table", frozenset((k, canonical(v)) for k, v in value.items()))
    try:
        return (type(value).__name__, value, hash(value))  # a string, a TOML date or time
    except TypeError:  # (something no TOML file holds, from Python: compared by its text)
        return (type(value).__name__, repr(value))


def check_overlaps(source: str, axes: dict, named: dict) -> None:
    """A table and one of its keys set together: the last written wins, whole or in part, so the variants'
    labels would name values they did not run."""
    keys = list(axes)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if overlap(a, b):
                table, key = sorted((a, b), key=lambda k: len(parts(k)))
                raise UserError(f"{source}: axis {key!r} sets a key of {table!r}, which [axes] also varies as a "
                                "whole (one would overwrite the other): drop one of them")
    for name, over in named.items():
        own = list(over)
        for i, a in enumerate(own):
            for b in own[i + 1:]:
                if overlap(a, b):
                    raise UserError(f"{source}: variant {name!r} sets both {a!r} and {b!r} (one would overwrite the "
                                    "other): drop one of them")
        both = [(k, a) for k in own for a in keys if overlap(k, a)]
        if both:
            k, a = both[0]
            also = "" if k == a else f" as {a!r}"
            raise UserError(f"{source}: variant {name!r} sets {k!r}, which [axes] also varies{also} (the axis would "
                            "overwrite it): drop one of them")


def check_repeats(source: str, named: dict) -> None:
    """Two named variants with the same overrides would run the same simulation twice under two names."""
    seen: dict = {}
    for name, over in named.items():
        first = seen.setdefault(canonical(over), name)
        if first != name:
            raise UserError(f"{source} [[variants]]: variants {first!r} and {name!r} set the same values: drop one "
                            "of them")


def check_absent_tables(source: str, base: str, base_doc: dict, axes: dict, named: dict) -> None:
    """Keys into a table field the base scenario does not have, where its absence means more than "defaults"."""
    sets = [(f"axis {k!r}", k) for k in axes] + [(f"variant {n!r} key {k!r}", k) for n, o in named.items() for k in o]
    for what, key in sets:
        path = parts(key)
        why = ABSENT_MEANS.get(path[:2]) if len(path) == 3 else None
        table = base_doc.get(path[0]) if why else None
        if why and not (isinstance(table, dict) and path[1] in table):
            raise UserError(f"{source}: {what}: base scenario {base!r} has no [{path[0]}] {path[1]} table: {why}")
