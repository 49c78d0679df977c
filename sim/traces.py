"""Request traces: readers for the Azure LLM inference trace (CSV) and Mooncake-style JSONL, a JSONL writer, and
the token-level prefix reuse ratio of a trace.

Both readers return the same frame, one row per request in file order: ``arrival_s`` (seconds after the earliest
request, full sub-second precision), ``prompt_tokens``, ``output_tokens``, ``hash_ids`` (a tuple of ints; empty
where the format carries none). Every malformed row raises one :class:`TraceFileError` naming file, line and field.

Shipped traces (``sim/data``, see ``ATTRIBUTION.md``):

* ``AZURE_CONV_TRACE``: the Azure LLM inference conversation trace of 2023, whole (19,366 requests, one hour);
* ``MOONCAKE_EXAMPLE``: a *synthetic* Mooncake-format example made by edgepop's own generator (not Mooncake data).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError
from edgepop.registry import Registry

DATA_DIR = Path(__file__).resolve().parent / "data"
AZURE_CONV_TRACE = DATA_DIR / "azure_llm_conv_2023.csv"
MOONCAKE_EXAMPLE = DATA_DIR / "mooncake_style_synthetic.jsonl"
MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "hash_ids")


class TraceFileError(DataFileError):
    """A malformed trace file; the one-line message names the file, the line (1-based) and the field."""

    def __init__(self, path: object, line: int | None, field: str | None, problem: str):
        super().__init__(path, line, field, problem)
        where = str(path) + (f", line {line}" if line is not None else "") + \
            (f", field '{field}'" if field is not None else "")
        self.args = (f"{where}: {problem}",)


# Longest trace a run replays, in simulated seconds: the control plane's clock ticks at least once a simulated
# second, so a trace spanning more than a year (a stray timestamp, most likely) would run for days.
MAX_SPAN_S = 366 * 86_400.0
MAX_TOKENS = 10_000_000  # prompt or output tokens of one request: ten times the longest context windows


def _check_span(span_s: float, path, field: str) -> None:
    if span_s > MAX_SPAN_S:
        raise TraceFileError(path, None, field, f"the requests span {span_s:.3g} s, more than a year "
                             f"({MAX_SPAN_S:.0f} s): check the timestamps' unit and outliers")


# A trace of more than MIN_WARN_REQUESTS requests whose mean rate is past MAX_MEAN_RPS over its whole span (or
# that spans under a second) most likely has timestamps in another unit than its format's (seconds read as
# milliseconds): warned, not refused. (A few requests at one instant are a plausible burst.)
MAX_MEAN_RPS = 2_000.0
MIN_WARN_REQUESTS = 100
# Files warned about: once, not per variant; the environment carries them to a sweep's workers, started later.
_WARNED_ENV = "EDGEPOP_WARNED_TRACES"


def _check_rate(arrival_s: np.ndarray, path, unit: str) -> None:
    n, span = len(arrival_s), float(np.max(arrival_s)) if len(arrival_s) else 0.0
    if n <= MIN_WARN_REQUESTS or not (n / max(span, 1e-9) > MAX_MEAN_RPS or span < 1.0):
        return
    key = f"{path}|{span!r}"
    warned = os.environ.get(_WARNED_ENV, "").split("\n")
    if key not in warned:
        os.environ[_WARNED_ENV] = "\n".join([*filter(None, warned), key])
        print(f"warning: {path}: {n:,} requests in {span:.3g} s ({n / max(span, 1e-9):,.0f} requests/s): the "
              f"format reads its timestamps as {unit}; check their unit", file=sys.stderr)


def _frame(arrival_s: np.ndarray, prompt, output, hash_ids, path=None, field: str = "timestamp") -> pd.DataFrame:
    if len(arrival_s):
        _check_span(float(np.max(arrival_s)), path, field)
        _check_rate(arrival_s, path, "milliseconds" if field == "timestamp" else "ISO times (date and time of day)")
    return pd.DataFrame({"arrival_s": arrival_s, "prompt_tokens": np.asarray(prompt, np.int64),
                         "output_tokens": np.asarray(output, np.int64), "hash_ids": hash_ids})


def read_azure_trace(path: str | Path) -> pd.DataFrame:
    """Read an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``, extra columns ignored).

    TIMESTAMP is an ISO time such as ``2023-11-16 18:15:46.6805900`` (up to nanoseconds, optional UTC offset);
    ``arrival_s`` is measured from the earliest row (the first one in a time-ordered file) in integer
    nanoseconds before the conversion to float seconds, so sub-second digits are kept.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, None, None, "is a folder, not a file" if path.is_dir() else "no such file")
    if _first_char(path) == "{":  # (its commas would be read as fields, and the error would be about them)
        raise TraceFileError(path, 1, None, 'is JSON lines (a Mooncake trace?), not an Azure CSV: read it as kind = '
                             '"mooncake" (with --trace, a .jsonl name)')
    try:
        with warnings.catch_warnings():
            # a row longer than the header: pandas would shift it onto an index (index_col=False: warn instead)
            warnings.simplefilter("error", pd.errors.ParserWarning)
            # blank lines kept as rows (then dropped) so that a row's index still gives its line number
            raw = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig", index_col=False,
                              skip_blank_lines=False)
    except pd.errors.ParserWarning:
        raise TraceFileError(path, _first_long_row(path), None, "more fields than the header has") from None
    except pd.errors.ParserError as exc:
        line = _first_long_row(path)  # (pandas counts rows, not lines, in its own message)
        if line is not None:
            raise TraceFileError(path, line, None, "more fields than the header has") from None
        raise TraceFileError(path, None, None, f"not a readable CSV file ({' '.join(str(exc).split())})") from None
    except (UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise TraceFileError(path, None, None, f"not a readable CSV file ({' '.join(str(exc).split())})") from None
    header = [str(c) for c in raw.columns]
    raw.columns = [c.strip() for c in header]  # (values are stripped, so are the names: 'TIMESTAMP, ContextTokens')
    for col in AZURE_COLUMNS:
        if col not in raw.columns:
            raise TraceFileError(path, 1, col, f"missing column in the header (need {','.join(AZURE_COLUMNS)}; "
                                 f"the header reads {','.join(header)!r})")
    _check_header_once(path)
    raw = raw[~raw.fillna("").apply(lambda col: col.str.strip() == "").all(axis=1)]
    if raw.empty:
        raise TraceFileError(path, None, None, "no data rows")
    text = raw.TIMESTAMP.fillna("").str.strip()
    ts = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    # (pandas also reads 'now' and 'today', the clock's time: a replay would differ from run to run)
    # ([0-9], not \d: \d also matches other scripts' digits, which no trace writer emits)
    not_time = ts.isna().to_numpy() | ~text.str.match(r"[0-9]{4}-?[0-9]{2}-?[0-9]{2}").to_numpy(dtype=bool)
    _first_bad(path, raw.TIMESTAMP, not_time, "TIMESTAMP", "is not a time like '2023-11-16 18:15:46.68'")
    # a row without a UTC offset among rows with one would be read as UTC: hours off, silently
    aware = text.str.contains(r"[T ][0-9:.,]*[0-9]\s*(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)$").to_numpy(dtype=bool)
    if aware.any() and not aware.all():
        first = _row_line(path, int(raw.index[0]))
        _first_bad(path, raw.TIMESTAMP, aware != aware[0], "TIMESTAMP",
                   f"{'has no' if aware[0] else 'has a'} UTC offset, unlike line {first}: give every row an "
                   "offset, or none (UTC)")
    # (nanosecond timestamps hold the years 1678-2261 only)
    far = ((ts < pd.Timestamp("1678-01-01", tz="UTC")) | (ts > pd.Timestamp("2261-12-31", tz="UTC"))).to_numpy()
    _first_bad(path, raw.TIMESTAMP, far, "TIMESTAMP", "is outside the years 1678-2261")
    ns = ts.dt.as_unit("ns").astype("int64").to_numpy()
    _check_span((float(ns.max()) - float(ns.min())) / 1e9, path, "TIMESTAMP")  # (before an int64 difference overflows)
    tokens = []
    for col in AZURE_COLUMNS[1:]:
        text = raw[col].str.strip()
        ok = text.str.fullmatch(r"[0-9]{1,18}").to_numpy(dtype=bool)
        _first_bad(path, raw[col], ~ok, col, "is not a non-negative integer")
        counts = text.astype(np.int64).to_numpy()
        _first_bad(path, raw[col], counts > MAX_TOKENS, col, f"is more than {MAX_TOKENS:,} tokens")
        tokens.append(counts)
    empty = np.empty(len(raw), object)
    empty.fill(())
    frame = _frame((ns - ns.min()) / 1e9, tokens[0], tokens[1], empty, path, "TIMESTAMP")
    frame.attrs["first_utc"] = pd.Timestamp(int(ns.min()), unit="ns", tz="UTC")  # (the absolute start of its times)
    return frame


def _check_header_once(path: Path) -> None:
    """A needed column named twice: pandas would rename the second (``TIMESTAMP.1``) and ignore it."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), [])
    for col in AZURE_COLUMNS:
        at = [i for i, name in enumerate(header, start=1) if name.strip() == col]
        if len(at) > 1:
            raise TraceFileError(path, 1, col, f"{col!r} names columns {at[0]} and {at[1]} of the header: which "
                                 "one to read is unclear, keep one")


def _first_long_row(path: Path) -> int | None:
    """The line number (where it starts) of the first row with more fields than the header."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = csv.reader(fh)
            width = len(next(rows, []))
            start = rows.line_num + 1
            for row in rows:
                if len(row) > width:
                    return start
                start = rows.line_num + 1
    except (csv.Error, UnicodeDecodeError):
        return None
    return None


def _row_line(path: Path, index: int) -> int:
    """The line where data row ``index`` (0-based, blank lines counted as rows, as pandas reads them) starts: a
    quoted field may hold line breaks, so rows and lines part ways after one."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = csv.reader(fh)
        next(rows, None)
        start = rows.line_num + 1
        for i, _ in enumerate(rows):
            if i == index:
                return start
            start = rows.line_num + 1
    return index + 2


def _first_bad(path: Path, values: pd.Series, bad: np.ndarray, field: str, problem: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        line = _row_line(path, int(values.index[i]))  # (blank lines are rows dropped with their index)
        raise TraceFileError(path, line, field, f"{values.iloc[i]!r} {problem}")


def _missing_key(path, line, rec: dict, name: str) -> None:
    """A JSON line without the key ``name``: say so, and list the keys the line has."""
    if name not in rec:
        keys = ", ".join(repr(k) for k in rec) or "none"
        raise TraceFileError(path, line, name, f"missing key {name!r} (the line has keys: {keys})")


def _int_field(path, line, rec, name, required=True):
    if required:
        _missing_key(path, line, rec, name)
    v = rec.get(name)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TraceFileError(path, line, name, f"{v!r} is not a non-negative integer")
    if v > MAX_TOKENS:
        raise TraceFileError(path, line, name, f"{v!r} is more than {MAX_TOKENS:,} tokens")
    return v


def _first_char(path: Path) -> str:
    """The file's first character that is not white space or a byte-order mark ("" if none in its first KB)."""
    with open(path, "rb") as fh:
        head = fh.read(1024).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    return head[:1]


def read_mooncake_trace(path: str | Path) -> pd.DataFrame:
    """Read a Mooncake-style JSONL trace: one object per line with ``timestamp`` (ms, number), ``input_length``,
    ``output_length`` and ``hash_ids`` (list of block ids; optional). Other keys are ignored, as are blank lines.

    This is the format of the traces published with Mooncake (github.com/kvcache-ai/Mooncake), whose hash ids
    label 512-token prefix blocks.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(path, None, None, "is a folder, not a file" if path.is_dir() else "no such file")
    times, prompts, outputs, hashes = [], [], [], []
    try:
        # JSON Lines end at "\n" only: str.splitlines would also cut inside strings at U+2028, U+0085, ...
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError:
        raise TraceFileError(path, None, None, "not a UTF-8 text file") from None
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as exc:
            if not times and "," in text and not text.lstrip().startswith(("{", "[")):
                raise TraceFileError(path, line, None, 'is not JSON lines but looks like a CSV (an Azure trace?): '
                                     'read it as kind = "azure" (with --trace, a .csv name)') from None
            raise TraceFileError(path, line, None, f"not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise TraceFileError(path, line, None, "expected a JSON object")
        _missing_key(path, line, rec, "timestamp")
        ts = rec.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
            raise TraceFileError(path, line, "timestamp", f"{ts!r} is not a non-negative number of milliseconds")
        hid = rec.get("hash_ids", [])
        if not isinstance(hid, list) or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < 2**63
                                            for h in hid):
            raise TraceFileError(path, line, "hash_ids", f"{hid!r} is not a list of integers in [0, 2**63)")
        prompt = _int_field(path, line, rec, "input_length")
        blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        # one id per 512-token block of the prompt ([] or none: not tracked); more would credit the prefix cache
        # with tokens the prompt does not have, fewer would leave its tail uncounted
        if hid and len(hid) != blocks:
            raise TraceFileError(path, line, "hash_ids", f"{len(hid)} ids for input_length {prompt}: expected "
                                 f"{blocks} (one per {MOONCAKE_BLOCK_TOKENS}-token block, the last one partial)")
        times.append(ts)
        prompts.append(prompt)
        outputs.append(_int_field(path, line, rec, "output_length"))
        hashes.append(tuple(hid))
    if not times:
        raise TraceFileError(path, None, None, "no requests")
    t = np.asarray(times, dtype=np.float64)
    ids = np.empty(len(hashes), object)
    ids[:] = hashes
    return _frame((t - t.min()) / 1e3, prompts, outputs, ids, path)


def write_mooncake_trace(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write requests (``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``hash_ids``) as Mooncake JSONL;
    times are rounded to whole milliseconds as in Mooncake's files."""
    path = Path(path)
    ms = np.rint(frame.arrival_s.to_numpy() * 1e3).astype(np.int64).tolist()
    with open(path, "w", encoding="utf-8") as fh:
        for t, p, o, h in zip(ms, frame.prompt_tokens.tolist(), frame.output_tokens.tolist(),
                              frame.hash_ids.tolist(), strict=True):
            fh.write(json.dumps({"timestamp": t, "input_length": p, "output_length": o,
                                 "hash_ids": list(h)}) + "\n")
    return path


# Trace formats by name: reader, the shipped example, and the file suffixes that identify the format.
TRACE_FORMATS = Registry("trace format")
TRACE_FORMATS.register("azure", shipped=AZURE_CONV_TRACE, suffixes=(".csv",))(read_azure_trace)
TRACE_FORMATS.register("mooncake", shipped=MOONCAKE_EXAMPLE, suffixes=(".jsonl", ".json"))(read_mooncake_trace)


def trace_kind(path: str | Path) -> str:
    """The format of a trace file, from its suffix (``.csv``: azure; ``.jsonl``/``.json``: mooncake)."""
    if Path(path).is_dir():
        raise TraceFileError(path, None, None, "is a folder, expected a trace file (.csv or .jsonl)")
    suffix = Path(path).suffix.lower()
    for name in TRACE_FORMATS:
        if suffix in TRACE_FORMATS.entry(name).extra["suffixes"]:
            return name
    raise TraceFileError(path, None, None, "unknown trace format: expected .csv (Azure) or .jsonl (Mooncake)")


def read_trace(path: str | Path | None = None, kind: str | None = None) -> tuple[pd.DataFrame, str]:
    """A trace as the common frame, and its file name: ``path`` in ``kind``'s format (sniffed from the suffix
    when None), or the trace shipped for ``kind`` when ``path`` is None."""
    if path is None and kind is None:
        raise ValueError("read_trace needs a path or a kind")
    kind = kind or trace_kind(path)
    entry = TRACE_FORMATS.entry(kind)
    p = Path(path) if path else entry.extra["shipped"]
    return entry.target(p), p.name


def prefix_reuse_ratio(hash_ids: Iterable[Sequence[int]], block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                       input_lengths: Sequence[int] | None = None) -> float:
    """Share of all input tokens that an unbounded prefix cache would find cached, replaying requests in order.

    A request's blocks hit from its first block up to (not including) the first block id never seen in an earlier
    request -- a prefix cache cannot reuse a block after a miss; with chained ids such as Mooncake's every seen
    block lies in that prefix anyway. Every block counts ``block_tokens`` tokens, except that with
    ``input_lengths`` the last block holds the remainder and tokens beyond the listed blocks count as misses.
    """
    seen: set[int] = set()
    hit = total = 0
    for i, ids in enumerate(hash_ids):
        n = len(ids)
        length = n * block_tokens if input_lengths is None else int(input_lengths[i])
        k = 0
        while k < n and ids[k] in seen:
            k += 1
        hit += max(0, min(k * block_tokens, length))
        total += length
        seen.update(ids)
    return hit / total if total else 0.0
