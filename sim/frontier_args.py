"""The checks of :func:`sim.frontier.run_frontier`'s arguments, all before any work: each wrong type or value is one
one-line :class:`edgepop.errors.UserError` naming the argument and the value (never a TypeError from deep inside)."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

from edgepop.errors import UserError
from edgepop.rng import MAX_INT
from sim.grid_keys import plain


def _whole(value, lo: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, Integral) and lo <= value <= MAX_INT


def checked_arguments(*, budgets, seeds, engine, workers, requests, baselines, tolerance, max_steps, out,
                      progress, absolute) -> dict:
    """(``slo`` is checked by :func:`sim.frontier.parse_slo`.) The arguments that need it in plain Python types (numpy numbers taken): budgets (a list of floats), seeds
    (a tuple of ints, or None for the scenario's), workers, requests, tolerance and max_steps."""
    from sim.sweep import ENGINES

    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if workers is not None and not _whole(workers, 1):
        raise UserError(f"workers must be a positive integer, got {workers!r}")
    if requests is not None and not _whole(requests, 1):
        raise UserError(f"requests must be a positive integer, got {requests!r}")
    seeds = plain(seeds) if isinstance(seeds, list | tuple) or type(seeds).__module__ == "numpy" else seeds
    if seeds is not None and (not isinstance(seeds, list) or len(set(seeds)) < len(seeds)
                              or not all(_whole(s, 0) for s in seeds)):
        raise UserError(f"seeds must be a list of distinct integers in [0, 2**63 - 1], got {seeds!r}")
    if baselines is not None and not (isinstance(baselines, str) or (
            isinstance(baselines, list | tuple) and all(isinstance(b, str) for b in baselines))):
        raise UserError(f"baselines must be a region set name, names separated by commas, or a list of names, "
                        f"got {baselines!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, Real) or not 0 <= tolerance < 1:
        raise UserError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    if not _whole(max_steps, 0):
        raise UserError(f"max-steps must be a non-negative integer, got {max_steps!r}")
    if not isinstance(out, str | os.PathLike):
        raise UserError(f"out must be a folder path, got {out!r}")
    if progress is not None and not isinstance(progress, bool):
        raise UserError(f"progress must be True, False or None (a bar when stderr is a terminal), got {progress!r}")
    if not isinstance(absolute, bool):
        raise UserError(f"absolute must be True or False, got {absolute!r}")
    return {"budgets": checked_budgets(budgets), "seeds": tuple(int(s) for s in seeds) if seeds else None,
            "workers": None if workers is None else int(workers),
            "requests": None if requests is None else int(requests),
            "tolerance": float(tolerance), "max_steps": int(max_steps)}


def checked_budgets(budgets) -> list[float]:
    """Budgets as floats: comma-separated text or a list of numbers, at least two different, all positive."""
    if isinstance(budgets, str):
        try:
            budgets = [float(b) for b in budgets.split(",") if b.strip()]
        except ValueError:
            raise UserError(f"bad --budgets {budgets!r}: expected comma-separated positive numbers") from None
    budgets = plain(budgets) if isinstance(budgets, list | tuple) or type(budgets).__module__ == "numpy" else budgets
    if (not isinstance(budgets, list) or len(set(budgets)) < 2
            or any(isinstance(b, bool) or not isinstance(b, Real) or not math.isfinite(b) or b <= 0
                   for b in budgets)):
        raise UserError(f"budgets must be at least two different positive numbers, got {budgets!r}")
    return [float(b) for b in budgets]
