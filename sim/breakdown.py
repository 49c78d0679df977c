"""Where a deployment's figures come from: its blocks per model and per GPU type.

A gap between two deployments is often one model or one GPU type: the edge's tail in one model short of replicas,
its token rate in the share of requests a slower GPU type serves. ``per_model`` gives each model's GPUs and
replicas (the placement's, before any autoscaling) beside what it served and how fast; ``per_gpu_type`` gives each
GPU type's count, the share of generation requests it served, its TPOT and the share of its GPU-time that had work
(a GPU counts as busy while any sequence runs on it, however small its batch).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _r(v) -> float | None:
    return None if v is None or not np.isfinite(v) else round(float(v), 2)


def _held_gpus(table: pd.DataFrame) -> pd.Series:
    """Distinct GPUs each model's replicas sit on (a GPU shared by two models counts for both)."""
    gpus = {(m, n, g) for m, n, idx in zip(table.model.tolist(), table.node.tolist(), table.gpu_index.tolist(),
                                            strict=True) for g in idx}
    return pd.Series([m for m, _, _ in gpus], dtype=object).value_counts()


def per_model(frame: pd.DataFrame, table: pd.DataFrame) -> dict:
    """model -> requests, ok, replicas, GPUs, TTFT p50/p95 and TPOT p50 (ok interactive generation requests), E2E
    p50 (ok one-shot requests)."""
    replicas = table.model.value_counts()
    held = _held_gpus(table) if len(table) else pd.Series(dtype=int)
    cols = [c for c in ("model", "outcome", "batch", "task", "ttft_ms", "tpot_ms", "e2e_ms") if c in frame]
    out = {}
    for model, g in frame[cols].groupby("model", sort=True):
        ok = g.outcome == "ok"
        fast = ok & ~g.batch if "batch" in g else ok
        gen = g.task == "text-generation"
        out[str(model)] = {"requests": int(len(g)), "ok": int(ok.sum()), "replicas": int(replicas.get(model, 0)),
                           "gpus": int(held.get(model, 0)),
                           "ttft_p50_ms": _r(g.ttft_ms[fast & gen].median()),
                           "ttft_p95_ms": _r(g.ttft_ms[fast & gen].quantile(0.95)),
                           "tpot_p50_ms": _r(g.tpot_ms[fast & gen].median()),
                           "e2e_p50_ms_one_shot": _r(g.e2e_ms[fast & ~gen].median())}
    return out


def per_gpu_type(frame: pd.DataFrame, fleet, busy_s: dict[str, float], duration_s: float) -> dict:
    """GPU type -> GPUs, the share of ok generation requests it served, their TPOT p50, and the share of its
    GPU-time with work (``busy_s``: GPU-seconds with work per type, over ``duration_s``)."""
    gpu_of = dict(zip(fleet.nodes.node_id.tolist(), fleet.nodes.gpu.tolist(), strict=True))
    ok = (frame.outcome == "ok") & (frame.task == "text-generation")
    if "batch" in frame:
        ok &= ~frame.batch
    gen = frame.loc[ok, ["node", "tpot_ms"]]
    kind = gen.node.map(gpu_of)
    out = {}
    for gpu, count in sorted(fleet.total_gpus.items()):
        mine = (kind == gpu).to_numpy()
        out[gpu] = {"gpus": int(count),
                    "generation_share": _r(mine.mean()) if len(gen) else None,
                    "tpot_p50_ms": _r(gen.tpot_ms[mine].median()) if mine.any() else None,
                    "busy_share": round(busy_s.get(gpu, 0.0) / max(count * duration_s, 1e-9), 4)}
    return out

