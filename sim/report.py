"""report.md and its PNG plots: per-country TTFT gain map, TTFT CDFs edge vs central, utilisation over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gain_map(requests, path: Path) -> Path | None:
    """World map: one dot per user country at its users' mean location, coloured by median TTFT gain (%)."""
    from sim.metrics import country_gain
    from topology.report import coastlines

    edge, central = requests[requests.deployment == "edge"], requests[requests.deployment == "central"]
    if edge.empty or central.empty:
        return None
    g = country_gain(edge, central)
    if g.empty:
        return None
    plt = _plt()
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


def plot_ttft_cdf(requests, path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), dpi=100)
    for dep, style in (("edge", "-"), ("central", "--")):
        f = requests[(requests.deployment == dep) & (requests.outcome == "ok")]
        for ax, gen in zip(axes, (True, False), strict=True):
            sel = f[(f.task == "text-generation") == gen]
            x = sel.ttft_ms.to_numpy()
            if x.size:
                q = np.linspace(0.0, 1.0, min(x.size, 2001))  # 2,001 quantiles draw the same curve as every point
                ax.plot(np.quantile(x, q), q, style, label=f"{dep} (p50 {np.median(x):.0f} ms)")
    for ax, title in zip(axes, ("text generation: TTFT", "one-shot tasks: time to result"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("ms at the client")
        ax.set_ylabel("CDF")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_utilisation(util, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4), dpi=100)
    for dep, g in util.groupby("deployment"):
        ax.plot(g.t_s / 60, 100 * g.slot_utilisation, label=f"{dep}: busy slots")
        ax.plot(g.t_s / 60, 100 * g.busy_replicas / g.replicas.clip(lower=1), ":", label=f"{dep}: busy replicas")
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("%")
    ax.set_title("Utilisation over time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def headline_rows(summary: dict) -> list[tuple]:
    """(metric, edge, central, gain) rows shared by report.md and the terminal table."""
    d = summary["deployments"]
    e, c = d.get("edge"), d.get("central")
    rows = []

    def val(block, *keys):
        if block is None:
            return None
        for k in keys:
            block = block.get(k) if isinstance(block, dict) else None
        return block

    for label, keys in (("TTFT p50 (ms)", ("ttft_ms", "p50")), ("TTFT p95 (ms)", ("ttft_ms", "p95")),
                        ("TTFT p99 (ms)", ("ttft_ms", "p99")), ("TPOT p50 (ms)", ("tpot_ms", "p50")),
                        ("E2E p50 (ms)", ("e2e_ms", "p50")), ("E2E p95 (ms)", ("e2e_ms", "p95")),
                        ("network RTT p50 (ms)", ("network_rtt_ms", "p50")),
                        ("SLO attainment", ("slo_attainment",)), ("goodput (req/s)", ("goodput_rps",)),
                        ("ok", ("outcomes", "ok")), ("rejected", ("outcomes", "rejected")),
                        ("failed", ("outcomes", "failed")), ("GPU utilisation", ("gpu_utilisation",)),
                        ("GPU-hours", ("gpu_hours",)), ("GPU cost ($)", ("gpu_usd",)), ("neurons", ("neurons",))):
        a, b = val(e, *keys), val(c, *keys)
        gain = None
        if isinstance(a, int | float) and isinstance(b, int | float) and b and "ms" in label:
            gain = f"{100 * (b - a) / b:+.1f}%"
        rows.append((label, a, b, gain))
    return rows


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def write_report(out, directory: Path) -> Path:
    """Write report.md with the headline table, per-continent gains and the three plots."""
    directory = Path(directory)
    s = out.summary
    figs = []
    if plot_gain_map(out.requests, directory / "ttft_gain_map.png"):
        figs.append(("TTFT gain per user country", "ttft_gain_map.png"))
    plot_ttft_cdf(out.requests, directory / "ttft_cdf.png")
    figs.append(("TTFT distribution, edge vs central", "ttft_cdf.png"))
    plot_utilisation(out.utilisation, directory / "utilisation.png")
    figs.append(("Utilisation over time", "utilisation.png"))
    lines = [f"# edgepop simulation: {s['scenario']}", "",
             f"{s['requests']:,} requests over {s['simulated_span_s']:,.0f} simulated seconds, seed {s['seed']}; "
             "the same arrivals went through each deployment.", "",
             "| metric | edge | central | edge gain |", "|---|---|---|---|"]
    lines += [f"| {m} | {_fmt(a)} | {_fmt(b)} | {g or ''} |" for m, a, b, g in headline_rows(s)]
    gains = s.get("gains", {}).get("per_continent", {})
    if gains:
        lines += ["", "## Per continent (median TTFT and network RTT reduction at the edge)", "",
                  "| continent | TTFT p50 reduction | network RTT p50 reduction |", "|---|---|---|"]
        lines += [f"| {k} | {_fmt(v['ttft_p50_reduction_pct'])}% | {_fmt(v['network_rtt_p50_reduction_pct'])}% |"
                  for k, v in gains.items()]
    perf = s.get("performance", {})
    lines += ["", f"Simulator: {perf.get('simulated_requests_per_wall_s', 0):,.0f} simulated requests per wall "
                  f"second; total wall time {perf.get('wall_s', 0)} s.", ""]
    for title, fname in figs:
        lines += [f"## {title}", "", f"![{title}]({fname})", ""]
    path = directory / "report.md"
    path.write_text("\n".join(lines))
    return path
