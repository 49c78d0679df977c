"""Validated loading of the CSV tables that describe the world (PoPs, GPUs, regions, ...).

A table is parsed completely into a new DataFrame before anything uses it, so a bad file is never half-loaded.
Every problem is reported as one :class:`~edgepop.errors.DataFileError` naming the file, row and field.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from edgepop.errors import DataFileError

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Field:
    """One column: its name, a parser from text, and an optional check returning a problem or None."""

    name: str
    parse: Callable[[str], object] = str
    check: Callable[[object], str | None] | None = None
    required: bool = True
    default: object = None


def number(text: str) -> float:
    """A cell parsed as a finite number (ValueError otherwise)."""
    value = float(text)
    if math.isnan(value) or math.isinf(value):
        raise ValueError("not a finite number")
    return value


def integer(text: str) -> int:
    """A cell parsed as a whole number (``3`` or ``3.0``; ValueError otherwise)."""
    value = float(text)
    if not value.is_integer():
        raise ValueError("not an integer")
    return int(value)


def in_range(lo: float, hi: float) -> Callable[[object], str | None]:
    """A check that a value lies in [lo, hi]: None, or what is wrong with it."""
    return lambda v: None if lo <= v <= hi else f"{v} is outside [{lo}, {hi}]"  # type: ignore[operator]


def non_empty(v: object) -> str | None:
    """A check that a value is not blank: None, or what is wrong with it."""
    return None if str(v).strip() else "is empty"


def read_table(path: str | Path, fields: list[Field], unique: str | None = None,
               lines_out: list | None = None) -> pd.DataFrame:
    """Read a CSV file into a DataFrame with typed, checked columns (extra columns are kept as text).
    ``lines_out`` receives each row's line in the file (for errors found after reading)."""
    path = Path(path)
    if path.is_dir() or not path.exists():  # (a pipe is read: --pops <(grep ... pops.csv))
        raise DataFileError(path, None, None, "is a folder, not a file" if path.is_dir() else "no such file")
    try:  # (utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark)
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            rows, lines = [], []
            for row in reader:  # each row's line in the file (blank lines are skipped, not rows)
                rows.append(row)
                lines.append(reader.line_num)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataFileError(path, None, None, f"not a readable CSV file ({exc})") from None
    if not header:  # (no header line: an empty file, or blank lines only)
        raise DataFileError(path, None, None, "is empty (expected a header line naming the columns, then rows)")
    twice = sorted({h for h in header if h and header.count(h) > 1})  # (empty trailing columns: a spreadsheet's)
    if twice:  # (a reader keeps the last column of a name: the other would be dropped without a word)
        raise DataFileError(path, 1, twice[0], "column appears more than once in the header")
    for f in fields:
        if f.required and f.name not in header:
            raise DataFileError(path, 1, f.name, "missing column in the header")
    if not rows:
        raise DataFileError(path, None, None, "no data rows")
    out: list[dict] = []
    seen: set = set()
    for i, raw in zip(lines, rows, strict=True):  # (line 1 is the header)
        rec = dict(raw)
        if None in rec:
            raise DataFileError(path, i, None, f"{len(header) + len(rec[None])} values for {len(header)} columns")
        for f in fields:
            text = (raw.get(f.name) or "").strip()
            if text == "":
                if f.required and f.default is None:
                    raise DataFileError(path, i, f.name, "is empty")
                rec[f.name] = f.default
                continue
            try:
                value = f.parse(text)
            except (TypeError, ValueError) as exc:
                raise DataFileError(path, i, f.name, f"bad value {text!r} ({exc})") from None
            problem = f.check(value) if f.check else None
            if problem:
                raise DataFileError(path, i, f.name, problem)
            rec[f.name] = value
        if unique:
            key = rec[unique]
            if key in seen:
                raise DataFileError(path, i, unique, f"duplicate value {key!r}")
            seen.add(key)
        out.append(rec)
    if lines_out is not None:
        lines_out.extend(lines)
    return pd.DataFrame(out)
