"""Figures the technique ablation compares: TTFT, inter-token latency (ITL), E2E, batch completion, GPU cost.

ITL per token is reconstructed from the per-request columns without logging every token: a request with ``n``
output tokens has ``n - 1`` gaps; ``stalls`` of them contain a prefill stall (``stall_ms / stalls`` each on top of
the base gap) and the rest are plain decode steps, so base = (decode time - stall time) / (n - 1). Percentiles are
taken over tokens (each gap weighted equally), which is what a streaming client perceives.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from edgepop.stats import percentile, weighted_percentiles

ITL_COLUMNS = ("outcome", "output_tokens", "tpot_ms", "stall_ms", "stalls")  # what itl_percentiles reads


def itl_percentiles(frame: pd.DataFrame, pcts=(50, 99)) -> dict:
    """Inter-token latency percentiles (ms) over all generated-token gaps of ok generation requests."""
    ok = (frame.outcome == "ok").to_numpy(dtype=bool) & (frame.output_tokens.to_numpy() > 1)
    f = frame[ok]
    gaps = f.output_tokens.to_numpy(dtype=float) - 1.0
    decode_ms = f.tpot_ms.to_numpy(dtype=float) * gaps
    stall_ms = np.nan_to_num(f.stall_ms.to_numpy(dtype=float))
    stalls = np.minimum(f.stalls.to_numpy(dtype=float), gaps)
    base = np.maximum(decode_ms - stall_ms, 0.0) / gaps
    stalled = base + np.where(stalls > 0, stall_ms / np.maximum(stalls, 1.0), 0.0)
    vals = np.concatenate([base, stalled])
    wts = np.concatenate([gaps - stalls, stalls])
    return {f"p{p}": None if v is None else round(v, 3)
            for p, v in zip(pcts, weighted_percentiles(vals, wts, pcts), strict=True)}


def technique_figures(frame: pd.DataFrame, interactive=None, completion_s=None) -> dict:
    """TTFT p50/p95 and TPOT p50 (interactive generation), ITL p50/p99, E2E p50/p95; batch completion if given."""
    inter = np.ones(len(frame), bool) if interactive is None else np.asarray(interactive, bool)
    ok = frame.outcome.to_numpy() == "ok"
    gen = frame.task.to_numpy() == "text-generation"
    sel = ok & gen & inter
    itl = itl_percentiles(frame[list(ITL_COLUMNS)][gen & inter])
    out = {"ttft_p50_ms": percentile(frame.ttft_ms[sel], 50), "ttft_p95_ms": percentile(frame.ttft_ms[sel], 95),
           "tpot_p50_ms": percentile(frame.tpot_ms[sel], 50),
           "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"],
           "e2e_p50_ms": percentile(frame.e2e_ms[ok & inter], 50), "e2e_p95_ms": percentile(frame.e2e_ms[ok & inter], 95),
           "ok_share": round(float(ok.mean()), 4) if len(frame) else None}
    if completion_s is not None and interactive is not None:
        c = np.asarray(completion_s, dtype=float)[~inter & ok]
        out["batch_completion_p50_s"] = percentile(c, 50)
        out["batch_completion_p95_s"] = percentile(c, 95)
    return out
