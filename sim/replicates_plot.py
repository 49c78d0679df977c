"""``seeds.png``: the headline's gains over seeds (``edgepop simulate --seeds``), at a glance.

One row per gain of the ``replicates`` block: each seed's value as a dot, the mean over seeds as a bar with its
Student-t 95% interval, and the first seed's within-run bootstrap interval as a thin line beside it, so the spread
between seeds can be read against what one run's interval claims. SLO attainment, a difference of shares rather
than a relative gain, gets a panel of its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_replicates(rep: dict, path: str | Path) -> Path:
    """Draw the ``replicates`` block of summary.json (its ``rows``) into ``path``."""
    # A Figure of its own, not pyplot's: a run from a notebook leaves the notebook's backend and figures alone.
    from matplotlib.figure import Figure

    groups = [[r for r in rep["rows"] if not r["difference"]], [r for r in rep["rows"] if r["difference"]]]
    groups = [g for g in groups if g]
    fig = Figure(figsize=(12, 1.4 + 0.42 * max(len(g) for g in groups)), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False, width_ratios=[3, 1][:len(groups)])[0]
    for ax, rows in zip(axes, groups, strict=True):
        y = np.arange(len(rows))
        for i, r in enumerate(rows):
            mean = r["mean"]
            if mean is None:
                continue
            colour = "tab:green" if mean > 0 else "tab:red"
            ax.barh(i, mean, color=colour, alpha=0.35, height=0.6)
            if r["ci95"]:
                ax.plot(r["ci95"], [i, i], color=colour, lw=2.5, solid_capstyle="butt")
            if r.get("within_run_ci95_first_seed"):
                ax.plot(r["within_run_ci95_first_seed"], [i + 0.25] * 2, color="black", lw=1)
            values = [v for v in r["per_seed"] if v is not None]
            ax.plot(values, [i] * len(values), "o", color="black", markersize=3.5)
        ax.axvline(0.0, color="grey", lw=0.6)
        ax.set_yticks(y, [r["metric"] for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.3, -0.7)  # (top to bottom in the block's order; one row is not stretched)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("edge - central (share)" if rows[0]["difference"] else "edge gain over central (%)")
    seeds = ", ".join(map(str, rep["seeds"]))
    fig.suptitle(f"The edge's gains over seeds {seeds}: dots each seed, bar the mean with its Student-t 95% "
                 f"interval (thick), the first seed's within-run interval (thin)", fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
