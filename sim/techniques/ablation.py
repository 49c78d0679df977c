"""Technique ablation: a named grid of variants (every technique off, then each one on alone) run by the sweep.

``edgepop ablation`` runs the embedded grid ``sim/scenarios/grids/ablation.toml`` (or any grid with named
variants and a ``baseline``) through :func:`sim.sweep.run_sweep`, so it runs on the same engines (local pool or
Ray) and writes the sweep's outputs; it then prints one row per variant with the figures the techniques are
compared on and their change against the baseline, and writes ``ablation.csv`` and ``ablation.json`` beside them.
Every variant reuses the base scenario's seed and workload (a variant setting a ``workload.*`` key is refused), so
the arrivals, sessions, hash_ids, batch flags and adapters are identical; only the deployment's techniques differ.
It simulates one deployment, the one its rows show: the grid's ``deployments`` entry, or the edge where the grid
names none.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import UserError
from edgepop.outputs import output_folder, staged_output
from sim.grid import Grid, load_grid, only_deployments, with_size
from sim.plots import pyplot
from sim.sweep import SWEEP_OUTPUTS, run_sweep

ABLATION_OUTPUTS = frozenset({"ablation.csv", "ablation.png", "ablation.json"})  # what it writes beside the sweep's
FIGURES = ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms",
           "batch_completion_p50_s", "batch_completion_p95_s", "gpus_placed", "gpu_busy_hours")
DELTA_OF = ("ttft_p95_ms", "itl_p99_ms", "e2e_p95_ms", "tpot_p50_ms")
COLUMNS = (("TTFT p50", "ttft_p50_ms"), ("TTFT p95", "ttft_p95_ms"), ("TPOT p50", "tpot_p50_ms"),
           ("ITL p50", "itl_p50_ms"), ("ITL p99", "itl_p99_ms"), ("E2E p50", "e2e_p50_ms"),
           ("E2E p95", "e2e_p95_ms"), ("batch p95 s", "batch_completion_p95_s"), ("GPUs", "gpus_placed"),
           ("GPU-h busy", "gpu_busy_hours"), ("dTTFT p95 %", "d_ttft_p95_ms_pct"),
           ("dITL p99 %", "d_itl_p99_ms_pct"), ("dE2E p95 %", "d_e2e_p95_ms_pct"))


def ablation_table(summary: pd.DataFrame, baseline: str, deployment: str = "edge") -> pd.DataFrame:
    """One row per named variant from a sweep summary of one seed, with % changes against ``baseline``."""
    rows = summary[summary.deployment == deployment]
    if "variant_name" not in rows:
        raise UserError("an ablation needs a grid with named variants ([[variants]])")
    rows = rows.drop_duplicates("variant_name")
    df = pd.DataFrame({"technique": rows.variant_name.to_numpy(),
                       **{f: rows[f].to_numpy() if f in rows else math.nan for f in FIGURES},
                       "requests": rows.requests.to_numpy(), "note": [_note(r) for r in rows.to_dict("records")]})
    base = df[df.technique == baseline].iloc[0]
    for m in DELTA_OF:
        df[f"d_{m}_pct"] = [round(100.0 * (v - base[m]) / base[m], 2) if _finite(v) and _finite(base[m]) and base[m]
                            else math.nan for v in df[m]]
    return df


def _note(row: dict) -> str:
    """What the technique itself reports (hit ratio, adapter waits, KV transfers, night share)."""
    if _finite(row.get("prefix_token_hit_ratio")):
        return f"prefix token hit ratio {row['prefix_token_hit_ratio']}"
    if _finite(row.get("adapter_requests")):
        if not row["adapter_requests"]:  # its mean wait is then NaN
            return "no adapter requests"
        return f"adapter requests {int(row['adapter_requests'])}, mean adapter wait {row['adapter_load_ms']} ms"
    if _finite(row.get("kv_transfer_ms_mean")):
        return f"mean KV transfer {row['kv_transfer_ms_mean']} ms"
    if _finite(row.get("batch_served_at_night_share")):
        return f"batch served at night-side sites: {row['batch_served_at_night_share']}"
    return ""


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def run_ablation(grid="ablation", *, requests: int | None = None, engine: str = "local",
                 workers: int | None = None, out: str | Path = "edgepop-ablation", progress: bool | None = None):
    """Run the ablation grid; returns (table, sweep result). ``requests`` overrides the grid's size."""
    g = grid if isinstance(grid, Grid) else load_grid(grid)
    if not g.names or g.baseline is None:
        raise UserError(f"{g.source}: an ablation grid needs named variants ([[variants]]) and a baseline")
    if g.axes:  # the table has one row per technique: every point but the first would be dropped from it
        raise UserError(f"{g.source}: an ablation compares its named variants on one workload, so it takes no "
                        f"[axes] ({', '.join(g.axes)}): run the grid with `edgepop sweep` for every point")
    if len(g.seeds) > 1:  # the same: one row per technique, so every seed but the first would be dropped
        raise UserError(f"{g.source}: an ablation compares its named variants on one workload, so it takes one "
                        f"seed, got {list(g.seeds)}: run the grid with `edgepop sweep` for every seed")
    g = one_deployment(g)
    g = with_size(g, requests=requests)  # checked as the grid's own size is, before any variant runs
    same_arrivals(g)
    out = output_folder(out, "out", staged=True, writes=SWEEP_OUTPUTS | ABLATION_OUTPUTS,  # before the work
                        command="ablation")
    # The sweep's files and the table are staged together and moved once: an interrupted run leaves the
    # earlier run's outputs whole, never new sweep files beside an old table.
    with staged_output(out, SWEEP_OUTPUTS | ABLATION_OUTPUTS, prefix=".edgepop-ablation-", command="ablation") as tmp:
        result = run_sweep(g, engine=engine, workers=workers, progress=progress, staging=tmp)
        table = ablation_table(result.summary, g.baseline, g.deployments[0])
        write_ablation(table, tmp, {"grid": g.source, "base": g.base, "baseline": g.baseline,
                                    "deployment": g.deployments[0], "seeds": list(g.seeds),
                                    "wall_s": round(result.wall_s, 2)})
    return table, replace(result, path=out)


def same_arrivals(g: Grid) -> None:
    """Refuse a named variant that changes the workload or the seed: its row would compare other arrivals."""
    for name, over in g.overrides.items():
        for key in over:
            if key == "seed" or key.split(".")[0] == "workload":
                raise UserError(f"{g.source}: variant {name!r} sets {key!r}, but an ablation compares its variants "
                                f"on the same arrivals: set it in the base scenario (or the grid's `requests`), "
                                f"or run the grid with `edgepop sweep`")


def one_deployment(g: Grid) -> Grid:
    """The table has one row per technique, so an ablation simulates one deployment: a grid's one ``deployments``
    entry, or the edge where it names none (simulating central too would be work no row shows)."""
    if len(g.deployments) == 1:
        return g
    if g.deployments_given:
        raise UserError(f"{g.source}: an ablation compares its named variants on one deployment, got deployments = "
                        f"{list(g.deployments)}: keep one of them, or run the grid with `edgepop sweep` for both")
    try:
        return only_deployments(g, g.deployments[:1])
    except UserError as exc:
        raise UserError(f"{exc} (a grid without `deployments` ablates the {g.deployments[0]} only)") from None


def write_ablation(df: pd.DataFrame, directory: str | Path, meta: dict) -> Path:
    """``ablation.csv``, ``ablation.json`` and ``ablation.png`` (each variant's changes) into ``directory``."""
    directory = Path(directory)
    df.to_csv(directory / "ablation.csv", index=False)
    plot_ablation(df, meta.get("baseline"), directory / "ablation.png")
    rows = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]
    (directory / "ablation.json").write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
    return directory


def plot_ablation(df: pd.DataFrame, baseline: str | None, path: str | Path) -> Path:
    """Each variant's change against ``baseline`` in the figures techniques are compared on, as grouped bars."""
    plt = pyplot()

    rows = df[df.technique != baseline]
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.55 * max(len(rows), 1)), layout="constrained")
    y, height = np.arange(len(rows)), 0.8 / len(DELTA_OF)
    for i, m in enumerate(DELTA_OF):
        values = pd.to_numeric(rows[f"d_{m}_pct"], errors="coerce").fillna(0.0).to_numpy()
        label = next(lbl for lbl, col in COLUMNS if col == m)
        ax.barh(y + (i - (len(DELTA_OF) - 1) / 2) * height, values, height=height, label=label)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(y, rows.technique.tolist())
    ax.invert_yaxis()
    ax.set(xlabel=f"change against '{baseline}' (%; negative: lower, better)", title="technique ablation")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def print_table(df: pd.DataFrame, title: str) -> None:
    """Print the ablation's table (one row per technique) under ``title``."""
    from rich.table import Table

    from edgepop.console import table_console

    t = Table(title=title)
    t.add_column("technique", no_wrap=True)
    for label, _ in COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    t.add_column("note")
    for r in df.to_dict("records"):
        cells = [_cell(r.get(c), integer=c == "gpus_placed") for _, c in COLUMNS]
        t.add_row(r["technique"], *cells, str(r.get("note") or ""))
    console = table_console(240)
    console.print(t)


def _cell(v, integer: bool = False) -> str:
    if not _finite(v):
        return "-"
    if integer:
        return str(int(v))
    return f"{v:,.2f}" if isinstance(v, float) else str(v)
