"""Checks for values read from scenario files: each raises one one-line UserError naming where, field and value."""

from __future__ import annotations

import math
from dataclasses import fields
from numbers import Integral, Real

from edgepop.errors import UserError
from edgepop.rng import MAX_INT


def number(where: str, name: str, value, lo: float, lo_open: bool = False, hi: float | None = None) -> float:
    """A finite number >= ``lo`` (> ``lo`` if ``lo_open``) and <= ``hi`` when given, as float."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise UserError(f"{where}: {name} must be a number, got {value!r}")
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        bound = (f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]" if hi is not None
                 else f"> {lo:g}" if lo_open else f">= {lo:g}")
        raise UserError(f"{where}: {name} must be {bound}, got {value!r}")
    return float(value)


def opt_number(where: str, name: str, value, lo: float, lo_open: bool = False) -> float | None:
    """``number`` or None."""
    return None if value is None else number(where, name, value, lo, lo_open)


def fraction(where: str, name: str, value) -> float:
    """A share in [0, 1]."""
    return number(where, name, value, 0.0, hi=1.0)


def opt_integer(where: str, name: str, value, lo: int) -> int | None:
    """None, or an integer (not a bool, not a float; a numpy integer is taken, as int) >= ``lo``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lo:
        raise UserError(f"{where}: {name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def boolean(where: str, name: str, value) -> bool:
    """True or false, nothing else (no 0/1, no strings)."""
    if not isinstance(value, bool):
        raise UserError(f"{where}: {name} must be true or false, got {value!r}")
    return value


def typed(cls, raw: dict, where: str):
    """Build dataclass ``cls`` from ``raw``, checking names and basic types (one-line errors): a field takes its
    default's type, or the type its annotation names when the default is None or built by a factory (numbers
    finite and not negative, integers whole). Numpy numbers are taken and stored as Python ints and floats."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table")
    known = {f.name: f for f in fields(cls) if f.name != "source"}  # (where a config came from: set by edgepop)
    out = {}
    for key, value in raw.items():
        if key not in known:
            raise UserError(f"{where}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        kind = _kind(known[key])
        if value is None and known[key].default is None:
            pass
        elif kind == "bool" and not isinstance(value, bool):
            raise UserError(f"{where}: field {key!r} must be true or false, got {value!r}")
        elif kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, Integral if kind == "int" else Real) \
                    or not math.isfinite(value):
                what = "a whole number" if kind == "int" else "a finite number"
                raise UserError(f"{where}: field {key!r} must be {what}, got {value!r}")
            if value < 0:
                raise UserError(f"{where}: field {key!r} must not be negative, got {value!r}")
            if kind == "int" and value > MAX_INT:  # beyond a 64-bit integer: no table column could hold it
                raise UserError(f"{where}: field {key!r} must be at most 2**63 - 1, got {value!r}")
            value = int(value) if isinstance(value, Integral) else float(value)
        elif kind == "str" and not isinstance(value, str):
            raise UserError(f"{where}: field {key!r} must be a string, got {value!r}")
        elif kind == "list" and not isinstance(value, list):
            raise UserError(f"{where}: field {key!r} must be a list, got {value!r}")
        elif kind in ("dict", "table") and not isinstance(value, dict):
            raise UserError(f"{where}: field {key!r} must be a table, got {value!r}")
        out[key] = value
    return cls(**out)


def _kind(f) -> str:
    """``bool``, ``int``, ``float``, ``str``, ``list``, ``dict``, or ``table`` (a nested config) of field ``f``."""
    default = f.default
    for name, types in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if type(default) is types:
            return name
    if f.default_factory in (list, dict):
        return f.default_factory.__name__
    declared = str(f.type).replace(" ", "").split("|")
    for name in ("bool", "int", "float", "str", "list", "dict"):
        if name in declared or any(t.startswith(f"{name}[") for t in declared):
            return name
    return "table"
