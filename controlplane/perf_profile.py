"""A :class:`~controlplane.perf.PerfModel` that interpolates service times measured by ``edgepop profile``.

The profile table (CSV or Parquet) has the columns ``model, phase, batch_size, tokens, context, ms, provider,
host`` (see ``dataplane/profiler.py``). A catalog entry is served by its ``stand_in`` data-plane model, so its
times are the stand-in's measured times on the profiled machine, whatever GPU type the caller names.

Phases by task: text generation uses ``prefill`` (batch x prompt tokens) and ``decode`` (batch x context);
encoders use ``encode`` (batch x tokens); image classifiers ``image`` (batch of images); speech ``audio`` (feature
frames of 10 ms, so one audio minute is 6000 frames).

Medians of short timings are noisy (a larger cell can come out faster), so each grid is made non-decreasing along
every axis (a running maximum) before interpolating: more work is never predicted to be faster. Inside the grid
the interpolation is piecewise linear; beyond the largest measured value it continues the last segment's slope;
below the smallest it stays at the smallest measured time (fixed costs dominate there). A figure beyond the
table's largest measured batch, token count or context is an extrapolation: an :class:`ExtrapolationWarning` (once
per model, phase and axis) names the axis and the measured range; a prompt past the catalog entry's context window
is refused.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.catalog import ModelSpec
from edgepop.errors import DataFileError, UserError

COLUMNS = ["model", "phase", "batch_size", "tokens", "context", "ms", "provider", "host"]
FRAMES_PER_AUDIO_MINUTE = 6000
PHASE_BY_TASK = {"text-embeddings": "encode", "text-classification": "encode", "text-reranking": "encode",
                 "image-classification": "image", "automatic-speech-recognition": "audio"}


class ExtrapolationWarning(UserWarning):
    """A service time read beyond what a measured profile covers (the figure is the table's slope continued)."""


def _interp1(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Piecewise-linear in ``xs`` (sorted, ``ys`` non-decreasing); flat below, last slope above."""
    if len(xs) == 1:
        return float(ys[0] * max(x / xs[0], 1.0)) if xs[0] > 0 else float(ys[0])
    if x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(ys[-1] + max(slope, 0.0) * (x - xs[-1]))


def _monotone_grid(rows: pd.DataFrame, x: str, y: str) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """For each ``x`` value, the (y values, ms) curve; ms made non-decreasing along y and then along x."""
    table = rows.groupby([x, y]).ms.median().unstack(y).sort_index()
    table = table.sort_index(axis=1)
    values = table.to_numpy(dtype=float)
    # Running maximum along y (ignoring cells the profiler skipped), then along x.
    filled = np.where(np.isnan(values), -np.inf, values)
    filled = np.maximum.accumulate(filled, axis=1)
    filled = np.maximum.accumulate(filled, axis=0)
    grid = {}
    for i, xv in enumerate(table.index):
        keep = ~np.isnan(values[i])
        grid[float(xv)] = (table.columns.to_numpy(dtype=float)[keep], filled[i][keep])
    return grid


def _interp2(grid: dict[float, tuple[np.ndarray, np.ndarray]], x: float, y: float) -> float:
    xs = np.array(sorted(grid))
    at_y = np.maximum.accumulate(np.array([_interp1(*grid[v], y) for v in xs]))
    return _interp1(xs, at_y, x)


# Numeric columns: (the least value allowed, whether it must be exceeded, must it be whole, what the rule says).
# A batch holds at least one request; an image row's tokens and a prefill's context are 0.
NUMBERS = {"batch_size": (1, False, True, "a whole number of at least 1"),
           "tokens": (0, False, False, "a non-negative number"),
           "context": (0, False, False, "a non-negative number"),
           "ms": (0, True, False, "a positive number")}


def _checked_numbers(table: pd.DataFrame, source: str) -> pd.DataFrame:
    """``table`` with its numeric columns as numbers; a DataFileError naming the first bad cell (its file row: the
    header is row 1), so a bad cell fails at load, not at its first use."""
    out = {}
    for name, (low, strict, whole, rule) in NUMBERS.items():
        raw = table[name]
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(values) & ((values > low) if strict else (values >= low))
        if whole:
            ok &= np.floor(values) == values
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            cell = raw.iloc[i]
            got = "nothing" if pd.isna(cell) else repr(cell) if isinstance(cell, str) else str(cell)
            raise DataFileError(source, i + 2, name, f"must be {rule}, got {got}")
        out[name] = pd.to_numeric(raw)
    return table.assign(**out)


KEY = ["host", "provider", "model", "phase", "batch_size", "tokens", "context"]  # one measurement per machine


def _refuse_duplicates(table: pd.DataFrame, source: str) -> None:
    """A DataFileError naming the file rows of the first measurement given twice (one machine, model, phase,
    batch size, tokens and context): which of the two times is meant is unknown, and the grid would keep one."""
    keys = table[KEY].reset_index(drop=True)
    twice = keys.duplicated(keep=False).to_numpy()
    if twice.any():
        first = keys.iloc[int(np.flatnonzero(twice)[0])]
        same = np.flatnonzero((keys == first).all(axis=1).to_numpy())
        what = ", ".join(f"{k} {first[k]}" for k in KEY[2:])
        raise DataFileError(source, None, None, f"rows {', '.join(str(i + 2) for i in same)} measure the same "
                                                f"point twice ({what})")


def _positive_sizes(sizes) -> bool:
    """Every size finite and positive (NaN fails the comparison; a string is no size)."""
    try:
        return bool(sizes) and all(0 < x < np.inf for x in sizes)
    except TypeError:
        return False


class MeasuredProfile:
    """Service times interpolated from a measured profile table; satisfies :class:`controlplane.perf.PerfModel`.

    ``host``/``provider`` pick one machine when the table holds several (required then).
    """

    def __init__(self, table: pd.DataFrame, source: str = "<memory>", host: str | None = None,
                 provider: str | None = None):
        if list(table.columns) != COLUMNS:
            raise DataFileError(source, None, None, f"not a profile table: columns {list(table.columns)}, "
                                                    f"expected {COLUMNS}")
        table = _checked_numbers(table, source)
        _refuse_duplicates(table, source)
        for name, value in (("host", host), ("provider", provider)):
            if value is not None:
                if value not in set(table[name]):
                    raise UserError(f"{source}: no rows with {name} {value!r} (has: {sorted(set(table[name]))})")
                table = table[table[name] == value]
        machines = table[["host", "provider"]].drop_duplicates()
        if len(machines) > 1:
            raise UserError(f"{source}: rows from {len(machines)} host/provider pairs; pick one with host= and "
                            "provider=")
        self.table = table.reset_index(drop=True)
        self.source = source
        self._grids: dict[tuple[str, str], dict] = {}
        self._warned: set = set()

    @classmethod
    def load(cls, path: str | Path, host: str | None = None, provider: str | None = None) -> MeasuredProfile:
        """Read a profile written by ``edgepop profile --out`` (``.csv``, or ``.parquet``)."""
        path = Path(path)
        try:
            table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        except FileNotFoundError:
            raise UserError(f"profile file {str(path)!r} not found") from None
        except (ValueError, OSError) as exc:
            raise DataFileError(path, None, None, f"cannot read profile table: {exc}") from None
        return cls(table, source=str(path), host=host, provider=provider)

    @property
    def models(self) -> list[str]:
        return sorted(set(self.table.model))

    def rows(self, stand_in: str, phase: str, of: str = "") -> pd.DataFrame:
        """The table's rows of ``stand_in`` (the model measured; ``of``: the catalog model it stands in for, for
        the message) in ``phase``; a one-line error naming what is missing when there are none."""
        rows = self.table[self.table.model == stand_in]
        if rows.empty:
            raise UserError(f"{self.source}: no rows for model {stand_in!r}{f' (the stand-in of {of})' if of else ''}"
                            f"; profiled models: {', '.join(self.models) or 'none'}")
        found = rows[rows.phase == phase]
        if found.empty:
            raise UserError(f"{self.source}: model {stand_in!r} has no {phase!r} rows "
                            f"(it has: {', '.join(sorted(set(rows.phase)))})")
        return found

    def _grid(self, spec: ModelSpec, phase: str, x: str, y: str) -> dict:
        key = (spec.stand_in, phase)
        if key not in self._grids:
            self._grids[key] = _monotone_grid(self.rows(spec.stand_in, phase, of=spec.id), x, y)
        return self._grids[key]

    def _covered(self, spec: ModelSpec, phase: str, grid: dict, x_axis: str, x: float, y_axis: str,
                  y: float) -> None:
        """Warn (once per model, phase and axis) when ``x`` or ``y`` lies past the grid's largest measured value."""
        ys = np.concatenate([v[0] for v in grid.values()])
        for axis, value, top in ((x_axis, x, max(grid)), (y_axis, y, float(ys.max()))):
            key = (spec.stand_in, phase, axis)
            if value > top and key not in self._warned:
                self._warned.add(key)
                warnings.warn(f"{self.source}: {phase} {axis} {value:g} of {spec.stand_in!r} lies past the measured "
                              f"{min(grid) if axis == x_axis else float(ys.min()):g}-{top:g} ({value / top:.3g}x); "
                              "extrapolated", ExtrapolationWarning, stacklevel=3)

    def _interp(self, spec: ModelSpec, phase: str, x_axis: str, y_axis: str, x: float, y: float) -> float:
        grid = self._grid(spec, phase, x_axis, y_axis)
        self._covered(spec, phase, grid, x_axis, x, y_axis, y)
        return _interp2(grid, x, y)

    @staticmethod
    def _single_device(tp: int | None) -> None:
        if tp not in (None, 1):
            raise UserError(f"a measured profile describes one device; tensor parallelism {tp} is not available")

    def prefill_ms(self, spec: ModelSpec, gpu: str, tokens: int, tp: int | None = None, **_ignored) -> float:
        """One request: ``tokens`` prompt tokens (images for image models, audio minutes for speech)."""
        self._single_device(tp)
        return self.prefill_batch_ms(spec, gpu, [tokens])

    def prefill_batch_ms(self, spec: ModelSpec, gpu: str, tokens_list: list[int], tp: int | None = None,
                         **_ignored) -> float:
        """Several requests in one pass; the data plane pads them to the longest, so that length counts."""
        self._single_device(tp)
        if not _positive_sizes(tokens_list):
            raise UserError(f"{self.source}: token counts must be finite positive numbers, got {list(tokens_list)}")
        batch, longest = float(len(tokens_list)), float(max(tokens_list))
        if spec.unit == "token" and spec.context_window and longest > spec.context_window:
            raise UserError(f"a prompt of {longest:g} tokens exceeds the context window of {spec.id} "
                            f"({spec.context_window} tokens)")
        if spec.generative:
            return self._interp(spec, "prefill", "batch_size", "tokens", batch, longest)
        phase = PHASE_BY_TASK[spec.task]
        if phase == "image":
            # Units are images: the batch axis is the number of images.
            return self._interp(spec, "image", "tokens", "batch_size", 0.0, float(sum(tokens_list)))
        if phase == "audio":
            return self._interp(spec, "audio", "batch_size", "tokens", batch, longest * FRAMES_PER_AUDIO_MINUTE)
        return self._interp(spec, "encode", "batch_size", "tokens", batch, longest)

    def decode_step_ms(self, spec: ModelSpec, gpu: str, batch: int, context: float, tp: int | None = None,
                       **_ignored) -> float:
        """One decode step of ``batch`` sequences with ``context`` tokens of history each."""
        self._single_device(tp)
        if not spec.generative:
            raise UserError(f"{spec.id} is not a text-generation model: it has no decode step")
        try:
            ok = 1 <= batch < np.inf and 0 <= context < np.inf  # (NaN fails)
        except TypeError:
            ok = False
        if not ok:
            raise UserError(f"{self.source}: decode needs a finite batch >= 1 and context >= 0, got batch {batch!r}, "
                            f"context {context!r}")
        return self._interp(spec, "decode", "batch_size", "context", float(batch), float(context))
