"""``sensitivity.png``: the headline's gains under each assumption of ``--sensitivity``, at a glance.

One row per variant (the headline first), three panels: the edge's gain in TTFT p50, TTFT p95 and TPOT p50 over
central, each with its 95% interval (the paired bootstrap's within one run, or the Student-t interval over seeds
with ``--seeds``), and the headline's value as a dashed line, so a row that moves a verdict (a gain crossing zero)
stands out. A variant that could not run is named with "not run" and drawn empty.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PANELS = (("TTFT p50", "ttft_p50_reduction_pct", "ttft_p50_ci95"),
          ("TTFT p95", "ttft_p95_reduction_pct", "ttft_p95_ci95"),
          ("TPOT p50", "tpot_p50_reduction_pct", "tpot_p50_ci95"))


def plot_sensitivity(sens: dict, path: str | Path) -> Path:
    """Draw the ``sensitivity`` block of summary.json (its ``rows``) into ``path``."""
    # A Figure of its own, not pyplot's: a run from a notebook leaves the notebook's backend and figures alone.
    from matplotlib.figure import Figure

    rows = sens["rows"]
    labels = [r["variant"] + (" (not run)" if "infeasible" in r else "") for r in rows]
    y = np.arange(len(rows))
    fig = Figure(figsize=(13, 1.6 + 0.38 * len(rows)), layout="constrained")
    axes = fig.subplots(1, len(PANELS), sharey=True)
    seeds = sens.get("seeds") or []
    over = f"means over seeds {', '.join(map(str, seeds))}, Student-t" if len(seeds) > 1 else "one run, bootstrap"
    for ax, (title, key, ci_key) in zip(axes, PANELS, strict=True):
        value = np.array([_num(r.get(key)) for r in rows])
        lo, hi = (np.array([_num((r.get(ci_key) or (None, None))[i]) for r in rows]) for i in (0, 1))
        err = np.vstack([np.nan_to_num(value - lo), np.nan_to_num(hi - value)]).clip(min=0.0)
        colours = ["tab:green" if v > 0 else "tab:red" for v in np.nan_to_num(value)]
        ax.barh(y, value, xerr=err, color=colours, alpha=0.7, capsize=2, error_kw={"lw": 0.8})
        if np.isfinite(value[0]):
            ax.axvline(value[0], color="black", lw=0.8, ls="--")  # the headline's gain
        ax.axvline(0.0, color="grey", lw=0.6)
        ax.set_title(f"{title} gain (%)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"The edge's gains over central under each assumption (> 0: edge faster; 95% intervals, {over}; "
                 "dashed: as run)", fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def _num(v) -> float:
    return float(v) if v is not None else np.nan
