"""frontier.png: the SLO's metric against GPUs and $/hour, and a second figure against GPUs, every line of a
:func:`sim.frontier.run_frontier` run, with the SLO and each line's least budget marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _label(column: str) -> str:
    if column == "slo_attainment":
        return "SLO attainment"
    if column == "goodput_rps":
        return "goodput (req/s)"
    name, pct = column.split("_")[:2]
    return f"{name.upper() if name != 'queue' else 'queue wait'} {pct} (ms)" + (
        ", unanswered counted late" if column.endswith("_all") else "")


def plot_frontier(frontier, path: Path) -> Path:
    """Draw the frontier figure of a run into ``path`` (frontier.png) and return ``path``."""
    from sim.plots import pyplot

    plt = pyplot()
    fig = frontier_figure(frontier, plt)
    fig.savefig(path)
    plt.close(fig)
    return path


def frontier_figure(frontier, plt):
    """The figure: the SLO's metric against GPUs, a second metric against GPUs, the SLO's metric against $/hour."""
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator, ScalarFormatter

    slo = frontier.slo
    second = "slo_attainment" if slo.column != "slo_attainment" else "ttft_p95_ms_all"
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=90)
    # The SLO's own metric (latencies counting requests never answered as late) against GPUs and $/hour.
    panels = ((axes[0], "gpus", slo.column), (axes[1], "gpus", second), (axes[2], "usd_per_hour", slo.column))
    unanswered, values, least = 0, {ax: [] for ax in axes}, []
    for line in frontier.lines:
        pts = sorted((p for p in frontier.points if p.line == line and p.rows), key=lambda p: p.scale)
        if not pts:
            continue
        for ax, xcol, ycol in panels:
            x = [getattr(p, xcol) for p in pts]
            y = [p.mean(ycol) if all(r.get(ycol) is not None and np.isfinite(r[ycol]) for r in p.rows)
                 else np.nan for p in pts]
            err = [p.ci95(ycol) for p in pts]
            values[ax] += [v for v in y if np.isfinite(v)]
            lo = [min(max(v - e[0], 0.0), 0.5 * v) if e and np.isfinite(v) else 0.0  # log axes: bars stay > 0
                  for v, e in zip(y, err, strict=True)]
            hi = [max(e[1] - v, 0.0) if e and np.isfinite(v) else 0.0 for v, e in zip(y, err, strict=True)]
            drawn = ax.errorbar(x, y, yerr=[lo, hi], marker="o", ms=4, capsize=2,
                                ls="-" if line.deployment == "edge" else "--", label=line.key)
            # A percentile that fell on requests never answered has no value: a triangle at the top edge.
            gone = [xi for xi, v in zip(x, y, strict=True) if not np.isfinite(v)]
            if gone:
                ax.plot(gone, [0.97] * len(gone), "^", ms=7, color=drawn.lines[0].get_color(),
                        transform=ax.get_xaxis_transform(), clip_on=False)
                unanswered += len(gone) if ax is axes[0] else 0
        best = frontier.result["deployments"][line.key]
        least.append((line.key, axes[0].lines[-1].get_color() if axes[0].lines else None, best))
    _least_budgets(panels, least)
    for ax, xcol, ycol in panels:
        ax.set_xscale("log")
        ticks = _ticks(sorted({getattr(p, xcol) for p in frontier.points if p.phase == "grid" and p.rows}))
        if ticks:  # plain numbers at the tested budgets: log major ticks alone label nothing within a decade
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
        if ycol not in ("slo_attainment", "goodput_rps") and values[ax] and min(values[ax]) > 0:  # (a 0 ms queue)
            ax.set_yscale("log")
            # plain numbers, the SLO's among them: log major ticks alone label nothing within a decade
            yt = _log_ticks(values[ax], [slo.threshold] * (ycol == slo.column and slo.threshold > 0))
            ax.yaxis.set_major_locator(FixedLocator(yt))
            ax.set_ylim(min(yt) / 1.03, max(yt) * 1.03)  # (a round tick at each end: both ends labelled)
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("GPUs" if xcol == "gpus" else "$ per hour")
        ax.set_ylabel(_label(ycol))
        ax.grid(alpha=0.3, which="both")
        if ycol == slo.column:
            ax.axhline(slo.threshold, color="k", lw=0.8, ls=":", label=f"SLO: {slo.text}")
            ax.annotate(f"SLO {slo.threshold:g}", (0.01, slo.threshold), xycoords=ax.get_yaxis_transform(),
                        xytext=(0, 2), textcoords="offset points", fontsize=8, va="bottom")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    note = f"; triangles at the top: {unanswered} point(s) whose percentile fell on unanswered requests" \
        if unanswered else ""
    fig.suptitle(f"edgepop frontier: {frontier.scenario}, SLO {slo.text} (dotted verticals: each line's least "
                 f"budget meeting it){note}", fontsize=10)
    fig.tight_layout()
    return fig


def _least_budgets(panels, least) -> None:
    """Each line's least budget, a dotted vertical in its colour. Lines whose least budgets coincide get
    interleaved dashes (each its own offset), so every colour shows instead of the last drawn hiding the rest."""
    for ax, xcol, _ in panels:
        key = "min_gpus_for_slo" if xcol == "gpus" else "min_usd_per_hour_for_slo"
        at: dict = {}
        for name, color, best in least:
            if best.get(key):
                at.setdefault(best[key], []).append((name, color))
        for x, names in at.items():
            n = len(names)
            for k, (name, color) in enumerate(names):
                label = f"{name} least budget ({x:,g})" if ax is panels[0][0] else None
                ax.axvline(x, color=color, lw=1.0, ls=":" if n == 1 else (3 * k, (3, 3 * (n - 1))), label=label)


def _log_ticks(values: list, marks: list) -> list:
    """Round-number ticks (1, 1.5, 2, 3, 4, 5, 6, 8 x 10^k) over ``values`` and ``marks`` (the SLO's limit),
    which are ticks themselves, round or not."""
    lo, hi = min(values + marks) / 1.2, max(values + marks) * 1.2
    grid = [m * 10.0 ** k for k in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
            for m in (1, 1.5, 2, 3, 4, 5, 6, 8)]
    grid = [g for g in grid if lo <= g <= hi and all(abs(g - m) > 0.1 * m for m in marks)]
    return _ticks(sorted(grid + marks))


def _ticks(values: list) -> list:
    """Tick positions at ``values``, dropping any within 10% of the one before (crowded labels)."""
    out = []
    for v in values:
        if v > 0 and (not out or v > 1.1 * out[-1]):
            out.append(v)
    return out
