"""The simulate command's PNG plots: per-country TTFT gain map, TTFT CDFs edge vs central, utilisation over time;
and :func:`pyplot`, through which every figure of the simulator layer is drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed), imported on first use: every figure
    the simulator layer draws goes through here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _interactive(requests) -> np.ndarray:
    """Rows that are not async batch rows (queueRequest): the plots show what the tables report."""
    return ~requests.batch.to_numpy(dtype=bool) if "batch" in requests else np.ones(len(requests), bool)


def plot_gain_map(requests, path: Path) -> Path | None:
    """World map: one dot per user country at its users' mean location, coloured by median TTFT gain (%)."""
    from sim.metrics import country_gain
    from topology.report import coastlines

    # The rows (ok interactive text generation) and the columns the map reads, each deployment's taken once:
    # filtering whole frames would copy every column (GBs at a million requests), and each string column taken is
    # an Arrow take of its own, so country_gain is told the rows are chosen and gets none it would only filter on.
    keep = ((requests.outcome == "ok") & (requests.task == "text-generation")).to_numpy(dtype=bool) & _interactive(
        requests)
    cols = ["user_country", "ttft_ms", "user_lat", "user_lon"]
    edge, central = (requests.loc[keep & (requests.deployment == dep).to_numpy(dtype=bool), cols]
                     for dep in ("edge", "central"))
    if edge.empty or central.empty:
        return None
    g = country_gain(edge, central, filtered=True)
    if g.empty:
        return None
    plt = pyplot()
    from matplotlib.collections import LineCollection

    fig, ax = plt.subplots(figsize=(14, 7), dpi=100)
    segments = []
    for xy in coastlines():
        jumps = np.where(np.abs(np.diff(xy[:, 0])) > 180)[0] + 1
        segments += np.split(xy, jumps)
    # one artist for the thousands of coastline pieces (one line each would cost seconds to draw)
    ax.add_collection(LineCollection(segments, colors="0.6", linewidths=0.4))
    lim = max(10.0, float(np.nanpercentile(np.abs(g.gain_pct), 95)))
    sc = ax.scatter(g.lon, g.lat, c=g.gain_pct, s=12 + 4 * np.sqrt(g.n), cmap="RdYlGn", vmin=-lim, vmax=lim,
                    edgecolors="k", linewidths=0.3, zorder=3)
    fig.colorbar(sc, ax=ax, shrink=0.7, label="median TTFT reduction at the edge vs central (%)")
    ax.set_xlim(-180, 180)
    ax.set_ylim(-60, 80)
    ax.set_aspect("equal")
    ax.set_title("Text generation: TTFT gain of the edge over central regions, per user country (dot size ~ requests)")
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def ttft_cdf_figure(requests):
    """The two CDF panels (text generation, one-shot tasks); a panel with no requests says so."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), dpi=100)
    # Masks and one float column, not filtered frames: a filter of a string column is a take of its own.
    ok = (requests.outcome == "ok").to_numpy(dtype=bool) & _interactive(requests)
    text = (requests.task == "text-generation").to_numpy(dtype=bool)
    ttft = requests.ttft_ms.to_numpy(dtype=np.float64)
    for dep, style in (("edge", "-"), ("central", "--")):
        mine = ok & (requests.deployment == dep).to_numpy(dtype=bool)
        for ax, gen in zip(axes, (True, False), strict=True):
            x = ttft[mine & (text == gen)]
            if x.size:
                q = np.linspace(0.0, 1.0, min(x.size, 2001))  # 2,001 quantiles draw the same curve as every point
                ax.plot(np.quantile(x, q), q, style, label=f"{dep} (p50 {np.median(x):.0f} ms)")
    for ax, title in zip(axes, ("text generation: TTFT", "one-shot tasks: time to result"), strict=True):
        ax.set_title(title)
        if not ax.lines:  # (an empty default axis would read as a plot of nothing measured)
            ax.set_axis_off()
            ax.text(0.5, 0.5, "no ok interactive requests of this kind in this run", ha="center", va="center",
                    transform=ax.transAxes)
            continue
        ax.set_xscale("log")
        ax.set_xlabel("ms at the client")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    return fig


def plot_ttft_cdf(requests, path: Path) -> Path:
    """Draw the edge-vs-central TTFT CDFs into ``path`` and return ``path``."""
    fig = ttft_cdf_figure(requests)
    fig.savefig(path)
    pyplot().close(fig)
    return path


def utilisation_figure(util):
    """Busy slots (requests running / decode slots of ready replicas) and busy replicas (replicas with work in
    flight / all replicas), in % per deployment. GPU busy in report.md counts GPUs instead (a GPU is busy when any
    replica on it is), sampled over the arrivals only."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4), dpi=100)
    for dep, g in util.groupby("deployment"):
        ax.plot(g.t_s / 60, 100 * g.slot_utilisation, label=f"{dep}: busy slots (% of ready slots)")
        ax.plot(g.t_s / 60, 100 * g.busy_replicas / g.replicas.clip(lower=1), ":",
                label=f"{dep}: busy replicas (% of replicas)")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("% in use (slots: requests running;\nreplicas: with work in flight)")
    ax.set_title("Utilisation over time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_utilisation(util, path: Path) -> Path:
    """Draw utilisation over time into ``path`` and return ``path``."""
    fig = utilisation_figure(util)
    fig.savefig(path)
    pyplot().close(fig)
    return path


# (label, path in a deployment's block, path in summary.json gains or None, key in gains.ci95 or None)
