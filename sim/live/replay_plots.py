"""The figure of ``edgepop replay``: the simulated and the live distributions, and where each side's time goes.

Top: the cumulative distributions of TTFT, TPOT and E2E over the requests that succeeded on both sides, simulated
and live (the comparison table's percentiles are read off these). Bottom: the mean of every E2E component per
side, stacked in request order (network in, gateway, queue, prefill, decode, stalls, streaming, ...), so that a gap
between the two bars shows which component it comes from; the means add up to the mean E2E.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.live.decompose import E2E_PARTS
from sim.live.fidelity import METRICS
from sim.plots import pyplot

LABELS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "e2e_ms": "E2E (ms)"}
SIDES = {"sim": "tab:blue", "live": "tab:orange"}


def plot_replay(sim: pd.DataFrame, live: pd.DataFrame, parts_sim: pd.DataFrame, parts_live: pd.DataFrame,
                path: str | Path) -> Path:
    """Draw the figure into ``path`` from the replay's frames (``sim.parquet``, ``live.parquet`` and the two sides
    of ``decomposition.csv``)."""
    plt = pyplot()
    ok_live = live[(live.status == 200) & (live.error.fillna("") == "")] if "status" in live else live
    ok_sim = sim[sim.outcome == "ok"] if "outcome" in sim else sim
    ids = np.intersect1d(ok_live.request_id.to_numpy(), ok_sim.request_id.to_numpy())
    frames = {"sim": ok_sim.set_index("request_id").loc[ids], "live": ok_live.set_index("request_id").loc[ids]}
    fig = plt.figure(figsize=(12, 7), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=(1.1, 1.0))
    for i, metric in enumerate(METRICS):
        ax = fig.add_subplot(grid[0, i])
        for side, colour in SIDES.items():
            x = np.sort(pd.to_numeric(frames[side][metric], errors="coerce").dropna().to_numpy(float))
            if len(x):
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=colour, label=side)
        ax.set(xlabel=LABELS[metric], ylabel="share of requests" if i == 0 else None, ylim=(0, 1))
        ax.grid(alpha=0.3)
        if i == 0 and ax.get_legend_handles_labels()[0]:
            ax.legend(title=f"{len(ids)} requests", fontsize=8)
    ax = fig.add_subplot(grid[1, :])
    _components(ax, parts_sim, parts_live)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _components(ax, parts_sim: pd.DataFrame, parts_live: pd.DataFrame) -> None:
    ids = np.intersect1d(parts_sim.request_id.to_numpy(), parts_live.request_id.to_numpy())
    means = {side: frame.set_index("request_id").loc[ids, list(E2E_PARTS)].mean() if len(ids) else
             pd.Series(0.0, index=list(E2E_PARTS)) for side, frame in (("sim", parts_sim), ("live", parts_live))}
    shown = [k for k in E2E_PARTS if max(means["sim"][k], means["live"][k]) > 0]
    colours = _colours(len(shown))
    for row, side in enumerate(("live", "sim")):
        left = 0.0
        for k, colour in zip(shown, colours, strict=True):
            width = float(means[side][k])
            ax.barh(row, width, left=left, color=colour, edgecolor="white", lw=0.5, label=k if row == 0 else None)
            left += width
        ax.text(left, row, f"  {left:.0f} ms", va="center", fontsize=8)
    ax.set_yticks([0, 1], ["live", "sim"])
    ax.set(xlabel="mean per request (ms): components of E2E, in request order",
           title="where the time goes (decomposition.csv)")
    if shown:
        ax.legend(fontsize=7, ncol=min(8, len(shown)), loc="upper center", bbox_to_anchor=(0.5, -0.25))


def _colours(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]
