"""Technique ablation: the same arrivals with every technique off, then with each one switched on alone.

A scenario whose ``[techniques]`` table lists ``ablation = [...]`` rows runs as an ablation under
``edgepop simulate``: ``edgepop simulate --scenario ablation`` (the embedded ``sim/scenarios/ablation.toml``).
Every row reuses the scenario's seed, so the workload (arrivals, sessions, hash_ids, batch flags) is identical;
only the edge deployment is simulated. Rows whose machinery is not in this build (a router or catalog feature
another module adds) are skipped with a note rather than silently run as the baseline.

Output: one rich table on stdout and ``ablation.csv`` / ``ablation.json`` in the output directory.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import UserError

# row name -> (technique fields, edge deployment fields)
ROWS = {
    "baseline": ({}, {}),
    "prefix_cache": ({"prefix_cache": True}, {"router": "prefix-aware"}),
    "speculative": ({"speculative": True}, {}),
    "disaggregation": ({"disaggregation": True}, {}),
    "precision=fp8": ({"precision": "fp8"}, {}),
    "lora": ({"lora": True}, {}),
    "batch_policy=night": ({"batch_policy": "night"}, {}),
}
ADAPTER_FRACTION = 0.2  # share of requests naming a LoRA adapter, once the workload can draw them
DELTA_OF = ("ttft_p95_ms", "itl_p99_ms", "e2e_p95_ms", "tpot_p50_ms")


def unsupported(row: str) -> str | None:
    """Why ``row`` cannot run in this build (None when it can)."""
    if row == "prefix_cache":
        from controlplane.routing import ROUTERS

        if "prefix-aware" not in ROUTERS:
            return "router 'prefix-aware' is not registered in this build (prefix caching not merged)"
    if row == "lora":
        from sim.workload_config import WorkloadConfig

        if importlib.util.find_spec("controlplane.lora") is None or not _has_field(WorkloadConfig,
                                                                                    "adapter_fraction"):
            return "no LoRA adapters in this build (controlplane.lora / workload adapter_fraction missing)"
    return None


def _has_field(cls, name: str) -> bool:
    return name in getattr(cls, "__dataclass_fields__", {})


def with_adapters(sc):
    """Give a share of the requests an adapter when this build can draw them and the scenario did not say.

    The draw comes last in the workload generator, so every other draw (arrivals, sizes, sessions) is unchanged;
    every row (baseline included) sees the same adapter requests, served as the base model unless ``lora`` is on.
    """
    wl = sc.workload
    if _has_field(type(wl), "adapter_fraction") and not wl.adapter_fraction and unsupported("lora") is None:
        return replace(sc, workload=replace(wl, adapter_fraction=ADAPTER_FRACTION))
    return sc


def variant(sc, row: str):
    """The scenario of one ablation row: every technique off except the row's."""
    from sim.techniques import Techniques

    tech_kw, edge_kw = ROWS[row]
    base = sc.techniques
    # keep the scenario's technique parameters (spec_k, kv_link_gbps, ...), switch everything off, then one on
    off = replace(base, prefix_cache=False, speculative=False, disaggregation=False, precision="", lora=False,
                  batch_policy="none", ablation=[])
    fields = set(Techniques.__dataclass_fields__)
    tech = replace(off, **{k: v for k, v in tech_kw.items() if k in fields})
    return replace(sc, techniques=tech, edge=replace(sc.edge, **edge_kw), central=None)


def run_ablation(sc, rows=None, requests: int | None = None, seed: int | None = None) -> pd.DataFrame:
    """Run ``rows`` (default: the scenario's ``ablation`` list) and return one row of figures per technique."""
    from sim.run import run_scenario
    from sim.techmetrics import technique_figures

    rows = list(rows or sc.techniques.ablation or ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise UserError(f"{sc.source} [techniques]: unknown ablation row(s) {unknown} (known: {', '.join(ROWS)})")
    if "baseline" not in rows:
        rows.insert(0, "baseline")
    sc = with_adapters(sc)
    records = []
    for row in rows:
        why = unsupported(row)
        if why:
            records.append({"technique": row, "note": f"skipped: {why}"})
            continue
        out = run_scenario(variant(sc, row), requests=requests, seed=seed, deployments=("edge",))
        wl = out.workload.requests
        req = out.requests
        batch = wl.batch.to_numpy(dtype=bool) if "batch" in wl else np.zeros(len(wl), bool)
        shift = req.arrival_s.to_numpy(dtype=float) - wl.arrival_s.to_numpy(dtype=float)
        completion = req.e2e_ms.to_numpy(dtype=float) / 1e3 + shift
        fig = technique_figures(req, ~batch, completion)
        block = out.summary["deployments"]["edge"]
        table = out.placements["edge"].table
        gpus = _placed_gpus(table)
        busy_h = block["gpu_utilisation"] * block["gpus"] * max(out.summary["simulated_span_s"], 1e-9) / 3600
        note = ", ".join(f"{k}={v}" for k, v in (block.get("techniques", {}).get("disaggregation") or {}).items())
        if isinstance(block.get("prefix_cache"), dict):  # filled by sim.cache_techniques when merged
            note = f"prefix token hit ratio {block['prefix_cache'].get('token_hit_ratio')}"
        if isinstance(block.get("lora"), dict):
            lora = block["lora"]
            note = f"adapter requests {lora.get('adapter_requests')}, mean adapter wait {lora.get('adapter_load_ms')} ms"
        if row == "batch_policy=night":
            share = block.get("techniques", {}).get("batch_served_at_night_share")
            note = f"batch served at night-side sites: {share}"
        records.append({"technique": row, **fig, "gpus_placed": gpus, "gpu_busy_hours": round(busy_h, 3),
                        "requests": int(len(req)), "note": note})
    df = pd.DataFrame(records)
    base = df.iloc[0]
    for m in DELTA_OF:
        if m in df:
            df[f"d_{m}_pct"] = [round(100.0 * (v - base[m]) / base[m], 2)
                                if _finite(v) and _finite(base[m]) and base[m] else float("nan") for v in df[m]]
    return df


def _placed_gpus(table) -> int:
    """GPUs holding a replica (each replica's tensor-parallel GPU indices)."""
    return int(sum(len(g) for g in table.gpu_index))


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


COLUMNS = (("TTFT p50", "ttft_p50_ms"), ("TTFT p95", "ttft_p95_ms"), ("TPOT p50", "tpot_p50_ms"),
           ("ITL p50", "itl_p50_ms"), ("ITL p99", "itl_p99_ms"), ("E2E p50", "e2e_p50_ms"),
           ("E2E p95", "e2e_p95_ms"), ("batch p95 s", "batch_completion_p95_s"), ("GPUs", "gpus_placed"),
           ("GPU-h busy", "gpu_busy_hours"), ("dTTFT p95 %", "d_ttft_p95_ms_pct"),
           ("dITL p99 %", "d_itl_p99_ms_pct"), ("dE2E p95 %", "d_e2e_p95_ms_pct"))


def print_table(df: pd.DataFrame, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    t.add_column("technique", no_wrap=True)
    for label, _ in COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    t.add_column("note")
    for r in df.to_dict("records"):
        cells = [_cell(r.get(c), integer=c == "gpus_placed") for _, c in COLUMNS]
        t.add_row(r["technique"], *cells, str(r.get("note") or ""))
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    console.print(t)


def _cell(v, integer: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if integer:
        return str(int(v))
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def write_ablation(df: pd.DataFrame, directory: str | Path, meta: dict) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    df.to_csv(directory / "ablation.csv", index=False)
    rows = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]
    (directory / "ablation.json").write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
    return directory


def cmd_ablation(sc, args) -> int:
    """``edgepop simulate`` on a scenario with an ``ablation`` list."""
    import time

    if args.trace or args.fail or args.only == "central":
        raise UserError(f"{sc.source}: an ablation scenario runs its own edge-only workload; --trace, --fail and "
                        "--only central do not apply")
    t0 = time.perf_counter()
    df = run_ablation(sc, requests=args.requests, seed=args.seed)
    wall = round(time.perf_counter() - t0, 2)
    meta = {"scenario": sc.name, "seed": args.seed if args.seed is not None else sc.seed, "wall_s": wall}
    path = write_ablation(df, args.out, meta)
    if args.json:
        print((path / "ablation.json").read_text())
    else:
        print_table(df, f"edgepop ablation: {sc.name} (seed {meta['seed']}, edge only, same arrivals)")
        print(f"wall time {wall} s. Wrote {path}/ablation.csv, ablation.json")
    return 0
