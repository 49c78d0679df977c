"""The figure of ``edgepop validate``: each model's predictions against the measurements, where the tables' errors
come from.

Left, the service-time model: every end-to-end reference row (prefill = time to first token, decode = time per
output token) predicted by constants refitted without its group, once per grouping (held-out model, GPU type,
tensor-parallel degree), as predicted / measured against the measured time; the band is the 10% goal. Right, the WAN model: predicted /
measured RTT of every measured pair against its great-circle distance, predicted by constants fitted without the
pair's data set, with the 0.85-1.15 band the per-distance goal names and the running median. In-sample
predictions stand in for held-out ones when the cross-validation is skipped (the titles say which).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.plots import pyplot

GROUPING_MARKERS = {"model": "o", "gpu": "s", "tp": "^"}
PHASE_COLOURS = {"prefill": "tab:blue", "decode": "tab:orange"}


def draw_fidelity(frames: dict, path: str | Path) -> Path:
    """Draw the two panels from :func:`controlplane.validation.fidelity_report`'s ``frames`` into ``path``."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    _service_time(left, frames["service_time"])
    _wan(right, frames["wan"])
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _service_time(ax, table: pd.DataFrame) -> None:
    rows = table[table.phase.isin(list(PHASE_COLOURS))]
    held_out = [g for g in GROUPING_MARKERS if f"cv_{g}_ms" in rows]
    columns = [(f"cv_{g}_ms", GROUPING_MARKERS[g], f"held-out {g}") for g in held_out] or [("fit_ms", "o", "in sample")]
    seen = []
    for col, marker, label in columns:
        for phase, colour in PHASE_COLOURS.items():
            sel = rows[(rows.phase == phase) & rows[col].notna()]
            seen.append((sel[col] / sel.measured_ms).to_numpy(float))
            ax.scatter(sel.measured_ms, seen[-1], s=18, marker=marker, facecolors="none",
                       edgecolors=colour, linewidths=0.8, alpha=0.8, label=f"{phase}, {label}")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.axhspan(0.9, 1.1, color="grey", alpha=0.2, lw=0, label="within 10%")
    ax.set(xscale="log", ylim=_limits(np.concatenate(seen), 0.4, 1.8), xlabel="measured (ms)",
           ylabel="predicted / measured",
           title="Service time: " + ("leave one group out" if held_out else "in sample")
           + f" ({len(rows)} engine rows)")
    ax.legend(fontsize=7, ncol=2, loc="upper right")


def _wan(ax, pairs: pd.DataFrame) -> None:
    col = "cv_set_ms" if "cv_set_ms" in pairs else "predicted_ms"
    km = np.maximum(pairs.km.to_numpy(float), 10.0)  # co-located pairs at the left edge of the log axis
    ratio = pairs[col].to_numpy(float) / pairs.rtt_ms.to_numpy(float)
    ax.scatter(km, ratio, s=6, alpha=0.25, color="tab:green", lw=0, label=f"{len(pairs)} measured pairs")
    edges = np.geomspace(10.0, max(float(km.max()), 20.0) * 1.01, 16)
    which = np.digitize(km, edges)
    mids, medians = [], []
    for i in range(1, len(edges)):
        sel = which == i
        if sel.sum() >= 5:
            mids.append(float(np.sqrt(edges[i - 1] * edges[i])))
            medians.append(float(np.median(ratio[sel])))
    ax.plot(mids, medians, color="black", lw=1.2, marker=".", label="median by distance")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.axhspan(0.85, 1.15, color="grey", alpha=0.2, lw=0, label="0.85-1.15")
    ax.set(xscale="log", ylim=_limits(ratio, 0.0, 2.5), xlabel="great-circle distance (km)",
           ylabel="predicted / measured RTT",
           title="WAN RTT: " + ("leave one data set out" if col == "cv_set_ms" else "in sample"))
    ax.legend(fontsize=7, loc="upper right")


def _limits(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """At least ``lo``-``hi``, widened to every finite value (none is drawn outside the axes)."""
    v = values[np.isfinite(values)]
    return (min(lo, float(v.min()) * 0.95), max(hi, float(v.max()) * 1.05)) if len(v) else (lo, hi)
