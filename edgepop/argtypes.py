"""Argparse types and the final JSON line shared by the scripts in ``benchmarks/``.

A bad value becomes argparse's one-line usage error (exit 2) before any work starts, instead of a traceback
minutes later; the last JSON line carries ``null`` where a figure is NaN or infinite (strict JSON has neither).
"""

from __future__ import annotations

import argparse
import json
import math
import numbers


def _number(text: str, cast, ok, want: str):
    """``cast(text)`` when it parses and ``ok`` holds for it, else argparse's error saying what was wanted."""
    try:
        value = cast(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _number(text, int, lambda v: v >= 1, "a whole number >= 1")


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers >= 0 (seeds), at least one."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= 0, got {text!r}")
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= 0, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= 0, got {text!r}")
    return values


def name_list(known, what: str):
    """An argparse type: comma-separated names, each one of ``known`` (a collection of strings)."""
    known = list(known)

    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if x not in known]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad)) or repr(text)} "
                                             f"(known: {', '.join(known)})")
        return names

    return parse


def finite_or_none(obj):
    """``obj`` with every NaN or infinite float (numpy's too) replaced by None, in dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(v) for v in obj]
    if isinstance(obj, numbers.Real) and not isinstance(obj, numbers.Integral) and not math.isfinite(obj):
        return None  # (numpy's floats are numbers.Real too)
    return obj


def json_line(obj, **kwargs) -> str:
    """One strict JSON line: non-finite figures become null (``allow_nan=False`` catches any left)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
