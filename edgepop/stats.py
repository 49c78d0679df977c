"""edgepop's percentiles: over the finite values; an empty set gives ``None`` (``null`` in JSON, never ``NaN``,
which is not valid JSON).

Three definitions, each where it fits: point estimates interpolate linearly (numpy's default), and so do the
gains' bootstrap resamples (``sim.gains.Bootstrap``: each request counted by its weight), so an interval is of its
point's statistic; other weighted percentiles (population-weighted RTTs, per-technique tables) take the first value
whose cumulative weight reaches the share (inverted CDF; it differs from the linear one by less than one
neighbouring value); percentiles that count failed requests as never answered take the higher neighbour
(``method="higher"``), so a percentile that falls between an answer and a failure counts as failed."""

from __future__ import annotations

import numpy as np

PCTS = (50, 90, 95, 99)


def finite(x) -> np.ndarray:
    """The finite values of ``x`` as a float64 array (NaN and infinities dropped)."""
    x = np.asarray(x, dtype=np.float64)
    return x[np.isfinite(x)]


def t_half_width95(v: np.ndarray) -> float:
    """Half the width of the Student-t 95% interval of the mean of ``v`` (at least two finite values): the
    interval over seeds that the frontier and ``simulate --seeds`` report."""
    from scipy.stats import t

    return float(t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))


def percentile(x, q: float, digits: int | None = 3) -> float | None:
    """The ``q``-th percentile of the finite values of ``x`` (rounded to ``digits``), or None when there are none."""
    x = finite(x)
    if x.size == 0:
        return None
    v = float(np.percentile(x, q))
    return round(v, digits) if digits is not None else v


def percentiles(x, pcts=PCTS, digits: int = 3) -> dict:
    """``{"p50": ..., "p90": ..., "mean": ..., "n": ...}`` over the finite values of ``x`` (None when empty)."""
    x = finite(x)
    if x.size == 0:
        return {f"p{p}": None for p in pcts} | {"mean": None, "n": 0}
    vals = np.percentile(x, pcts)
    return {f"p{p}": round(float(v), digits) for p, v in zip(pcts, vals, strict=True)} | {
        "mean": round(float(x.mean()), digits), "n": int(x.size)}


def weighted_percentiles(values, weights, pcts) -> list[float | None]:
    """Percentiles of ``values`` each counted ``weights`` times (inverted CDF); None when empty."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return [None] * len(pcts)
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order])
    return [float(v[min(np.searchsorted(cw, p / 100.0 * cw[-1], side="left"), v.size - 1)]) for p in pcts]
