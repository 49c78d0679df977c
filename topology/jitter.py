"""Per-path RTT variability: how far one request's round trip strays from the path's typical RTT.

The latency model gives a path's typical (mean) RTT ``r``. Here a path's RTT is a shifted log-normal: a floor
``(1 - excess) * r`` (the path on its best day) plus a log-normal excess whose mean is ``excess * r``, so the
mean stays ``r``; ``sigma`` sets the tail. Both constants are read off min / mean / max triples of measured
paths: for a path measured over ``n`` periods, ``(mean - min) / mean`` estimates ``excess`` and the maximum is
taken as the excess's ``n / (n + 1)`` quantile, which fixes ``sigma``. :func:`fit` takes the medians over the
paths of ``topology.rtt_sets.load_history`` (IBM Cloud's 30-day averages of 78 region pairs over three years).

What this does and does not describe: the variation of a path's 30-day average RTT over months (route changes,
cable cuts, congestion seasons), a lower bound on what single requests see; per-packet queueing jitter on a
data-centre path is smaller than a millisecond and is not modelled. The simulator draws one factor per request
(``RttJitter.factors``) only when a scenario sets ``jitter = true``; off by default, results stay as they were.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# ndtri, the standard normal's quantile, is scipy.stats' norm.ppf bit for bit without importing scipy.stats (about
# a second, paid by every command and every sweep worker that imports the simulator).
from scipy.special import ndtri

from topology.rtt_sets import load_history


@dataclass(frozen=True)
class RttJitter:
    """Shifted log-normal RTT around a path's mean: floor ``1 - excess``, excess log-normal with ``sigma``."""

    excess: float
    sigma: float
    source: str = ""

    def factors(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` multipliers of a path's mean RTT (mean 1, never below ``1 - excess``)."""
        z = rng.standard_normal(n)
        return (1.0 - self.excess) + self.excess * np.exp(self.sigma * z - self.sigma ** 2 / 2)

    def quantile(self, q) -> np.ndarray:
        """The multiplier at quantile ``q`` (0-1)."""
        return (1.0 - self.excess) + self.excess * np.exp(self.sigma * ndtri(q) - self.sigma ** 2 / 2)

    def to_dict(self) -> dict:
        return asdict(self)


def path_sigma(excess: np.ndarray, spread: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sigma`` of each path from its relative excess (mean - min) and spread (max - min) over ``n`` periods.

    With E = excess log-normal of mean m: quantile(q) / m = exp(sigma z - sigma^2 / 2), z = Phi^-1(n / (n+1));
    the smaller root of sigma^2 / 2 - z sigma + ln(spread / excess) = 0 (0 when the maximum is not above the
    mean: no tail seen).
    """
    z = ndtri(n / (n + 1.0))
    ratio = np.log(np.maximum(spread, 1e-9) / np.maximum(excess, 1e-9))
    disc = np.maximum(z ** 2 - 2 * ratio, 0.0)
    return np.where(ratio > 0, z - np.sqrt(disc), 0.0)


def fit(hist=None) -> RttJitter:
    """Median relative excess and tail over the measured paths (:func:`topology.rtt_sets.load_history`)."""
    hist = load_history() if hist is None else hist
    excess = ((hist.mean_ms - hist.min_ms) / hist.mean_ms).to_numpy()
    spread = ((hist.max_ms - hist.min_ms) / hist.mean_ms).to_numpy()
    sig = path_sigma(excess, spread, hist.windows.to_numpy(dtype=float))
    return RttJitter(round(float(np.median(excess)), 4), round(float(np.median(sig)), 4),
                     f"IBM Cloud inter-region 30-day means, {len(hist)} paths (ibm_rtt_history.csv)")


def jitter_report(model=None) -> dict:
    """The fitted constants and how they reproduce each path's measured min and max (relative to its mean).

    Leave-one-path-out would change nothing visible (medians over 78 paths), so the table is in-sample; it
    reports the median absolute error of the predicted floor and of the predicted maximum over ``n`` periods.
    """
    hist = load_history()
    j = fit(hist) if model is None else model
    n = hist.windows.to_numpy(dtype=float)
    mean = hist.mean_ms.to_numpy()
    floor_err = np.abs((1 - j.excess) * mean - hist.min_ms.to_numpy()) / hist.min_ms.to_numpy()
    top = j.quantile(n / (n + 1.0)) * mean
    max_err = np.abs(top - hist.max_ms.to_numpy()) / hist.max_ms.to_numpy()
    return {"model": j.to_dict(), "paths": int(len(hist)),
            "median_abs_error_of_min": round(float(np.median(floor_err)), 4),
            "median_abs_error_of_max": round(float(np.median(max_err)), 4),
            "p90_over_mean": round(float(j.quantile(0.9)), 4), "p99_over_mean": round(float(j.quantile(0.99)), 4)}
