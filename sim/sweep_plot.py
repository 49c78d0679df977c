"""``sweep.png``: a sweep's variants side by side, drawn from ``sweep_summary.parquet``.

Left: each variant's TTFT p50 and p95 per deployment (ms; on a log scale when they span more than 20x, as an
overloaded variant's seconds beside another's tens of milliseconds do). Right, when the variants ran the edge and central together: the edge's gains in
TTFT p50, TTFT p95 and TPOT p50 with their 95% intervals (within each run, as ``summary.json`` gives them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

GAIN_BARS = (("TTFT p50", "ttft_ms_p50_reduction_pct"), ("TTFT p95", "ttft_ms_p95_reduction_pct"),
             ("TPOT p50", "tpot_ms_p50_reduction_pct"))
COLOURS = {"edge": "tab:orange", "central": "tab:blue"}


def plot_sweep(summary: pd.DataFrame, labels: list[str], path: str | Path) -> Path:
    """Draw ``summary`` (one row per variant x deployment) with ``labels[i]`` naming variant ``i``."""
    # A Figure of its own, not pyplot's: a sweep run from a notebook leaves the notebook's backend and figures alone.
    from matplotlib.figure import Figure

    ids = sorted(summary.variant.unique())
    deployments = list(dict.fromkeys(summary.deployment))
    gains = "gain_ttft_ms_p50_reduction_pct" in summary and summary.gain_ttft_ms_p50_reduction_pct.notna().any()
    fig = Figure(figsize=(13 if gains else 7, 1.4 + 0.45 * len(ids)), layout="constrained")
    axes = fig.subplots(1, 2 if gains else 1, squeeze=False)
    y = np.arange(len(ids))
    ax = axes[0, 0]
    height = 0.8 / max(len(deployments), 1)
    for j, dep in enumerate(deployments):
        rows = summary[summary.deployment == dep].set_index("variant").reindex(ids)
        at = y + (j - (len(deployments) - 1) / 2) * height
        p95 = pd.to_numeric(rows.ttft_p95_ms, errors="coerce").to_numpy(dtype=float)
        p50 = pd.to_numeric(rows.ttft_p50_ms, errors="coerce").to_numpy(dtype=float)
        ax.barh(at, p95, height=height, color=COLOURS.get(dep, f"C{j}"), alpha=0.55, label=f"{dep} p95")
        ax.plot(p50, at, "|", color=COLOURS.get(dep, f"C{j}"), markersize=12, mew=2.5, label=f"{dep} p50")
    shown = pd.to_numeric(summary[["ttft_p50_ms", "ttft_p95_ms"]].stack(), errors="coerce").dropna()
    log = len(shown) and shown.min() > 0 and shown.max() / shown.min() > 20
    if log:
        ax.set_xscale("log")
    # (a value may be a list of hundreds of PoP ids: the figure names the start, sweep.json the whole)
    ax.set_yticks(y, [labels[i] if len(labels[i]) <= 70 else labels[i][:69] + "…" for i in ids], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"TTFT (ms{', log scale' if log else ''}; bars p95, ticks p50)")
    _legend_above(ax, "TTFT by variant", len(deployments) * 2)
    ax.grid(axis="x", alpha=0.3, which="both")
    if gains:
        ax = axes[0, 1]
        rows = summary.drop_duplicates("variant").set_index("variant").reindex(ids)
        height = 0.8 / len(GAIN_BARS)
        for j, (name, key) in enumerate(GAIN_BARS):
            value = pd.to_numeric(rows[f"gain_{key}"], errors="coerce").to_numpy(dtype=float)
            at = y + (j - (len(GAIN_BARS) - 1) / 2) * height
            err = None
            if f"gain_{key}_ci95_lo" in rows:  # (a figure without an interval draws no whisker)
                lo, hi = (pd.to_numeric(rows[f"gain_{key}_ci95_{end}"], errors="coerce").to_numpy(dtype=float)
                          for end in ("lo", "hi"))
                err = np.vstack([np.nan_to_num(value - lo), np.nan_to_num(hi - value)]).clip(min=0.0)
            ax.barh(at, value, height=height, xerr=err, capsize=2, label=name, color=f"C{j + 2}",
                    error_kw={"lw": 0.8})
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(y, [""] * len(ids))
        ax.invert_yaxis()
        ax.set_xlabel("edge gain over central (%, 95% interval)")
        _legend_above(ax, "the edge's gains (> 0: edge faster)", len(GAIN_BARS))
        ax.grid(axis="x", alpha=0.3)
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def _legend_above(ax, title: str, n: int) -> None:
    """The legend in one row between the title and the axes, clear of every bar."""
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=n, frameon=False)
    ax.set_title(title, pad=22)
