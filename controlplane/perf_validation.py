"""Leave-one-group-out cross-validation of the roofline service-time model.

For each grouping (``model``, ``gpu``, ``tp``) and each value of it, the constants are refitted on every row of
the other groups (:func:`controlplane.perf_calibration.fit`) and the held-out rows are predicted: a held-out GPU
type is predicted from constants that never saw it (its architecture's or memory kind's fitted value when a
sibling board was seen, their median otherwise), a held-out model from constants fitted on other models, a
held-out tensor-parallel degree from the other degrees. What this reports is the error to expect on a
configuration the reference data does not contain.

Errors are mean absolute percentage errors by phase: ``prefill`` and ``decode`` are serving engines'
end-to-end figures; ``kernel`` the operator-level transformer body passes; ``allreduce`` the collectives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.perf import IMAGE_ENGINE
from controlplane.perf_calibration import Rows, fit, load_rows, mape
from controlplane.perf_params import RooflineParams
from controlplane.perf_rows import (
    HOLDOUT_EDGE_FILE,
    HOLDOUT_FILE,
    HOLDOUT_IMAGE_FILE,
    HOLDOUT_NIM_FILE,
    HOLDOUT_STATIC_FILE,
    REFERENCE_IMAGE_FILE,
)

GROUPINGS = ("model", "gpu", "tp")
PHASES = ("prefill", "decode", "kernel", "allreduce")
GOAL_MAPE = 0.10  # prefill and decode, each grouping, end-to-end rows
# Held-out engine releases and the fitted profile of another release of the same engine (the other reading of an
# engine the constants never saw is the ``default`` profile, what estimates use).
# (``tensorrt-llm-0.5-static``: the fitted release itself, measured another way, by its static-batch throughput
# benchmark, whose decode steps no reference row has; ``-0.6-static`` and ``-0.9-static``: later releases, the same
# benchmark)
# (``mlperf-tensorrt-lwis``: the image server's profile, fitted on the same harness's datacenter-board rows.)
OTHER_RELEASE = {"tensorrt-llm-0.9": "tensorrt-llm-0.5", "nim-2024-tensorrt-llm": "nim-1.8-tensorrt-llm",
                 "tensorrt-llm-0.5-static": "tensorrt-llm-0.5", "tensorrt-llm-0.6-static": "tensorrt-llm-0.5",
                 "tensorrt-llm-0.9-static": "tensorrt-llm-0.5", "mlperf-tensorrt-lwis": IMAGE_ENGINE}
HOLDOUT_BREAKDOWNS = ("phase", "gpu", "tp", "batch", "tokens", "model")
# The external checks: tables no fit reads, each reported on its own.
HOLDOUT_FILES = (HOLDOUT_FILE, HOLDOUT_NIM_FILE, HOLDOUT_STATIC_FILE, HOLDOUT_EDGE_FILE, HOLDOUT_IMAGE_FILE)


def cross_validate(rows: Rows | None = None) -> pd.DataFrame:
    """The rows' table with ``fit_ms`` (in-sample) and ``cv_<grouping>_ms`` for every grouping."""
    rows = rows or load_rows()
    out = rows.table.copy()
    out["fit_ms"] = rows.predict(fit(rows))
    for key in GROUPINGS:
        col = f"cv_{key}_ms"
        out[col] = np.nan
        values = rows.table[key].astype(str).to_numpy()
        for value in sorted(set(values)):
            if value == "":  # collectives have no model: never held out by model
                continue
            test = values == value
            params = fit(rows.subset(~test))
            out.loc[test, col] = rows.subset(test).predict(params)
    return out


def _errors(frame: pd.DataFrame, col: str) -> dict:
    out = {}
    for phase in PHASES:
        sel = frame[(frame.phase == phase) & frame[col].notna()]
        if len(sel):
            out[phase] = {"rows": int(len(sel)), "mape": mape(sel[col].to_numpy(), sel.measured_ms.to_numpy())}
    return out


def summary(cv: pd.DataFrame) -> dict:
    """Pooled and per-group MAPE by phase for every grouping, plus the in-sample errors."""
    out = {"in_sample": _errors(cv, "fit_ms"), "goal_mape": GOAL_MAPE}
    for key in GROUPINGS:
        col = f"cv_{key}_ms"
        groups = {str(v): _errors(g, col) for v, g in cv.groupby(cv[key].astype(str)) if str(v)}
        engines = {str(e): _errors(g, col) for e, g in cv[cv.kind == "e2e"].groupby("engine")}
        out[f"by_{key}"] = {"pooled": _errors(cv, col), "groups": groups, "by_engine": engines}
    return out


def goal_failures(report: dict) -> list[str]:
    """Which grouping/phase pooled errors exceed :data:`GOAL_MAPE` (end-to-end prefill and decode)."""
    bad = []
    for key in GROUPINGS:
        for phase in ("prefill", "decode"):
            m = report[f"by_{key}"]["pooled"].get(phase, {}).get("mape")
            if m is not None and m > GOAL_MAPE:
                bad.append(f"{key}/{phase} {m:.1%}")
    return bad


def holdout_report(params: RooflineParams | None = None, path=None) -> dict:
    """The shipped constants (``params``; default ``perf_params.json``) against a table of published measurements
    that no fit and no cross-validation fold ever sees (``path``; default ``perf_holdout.csv``, see
    :data:`HOLDOUT_FILES`). Each row is predicted twice: with the ``default`` engine profile (an engine the fit
    never saw) and with the fitted profile of its engine's nearest release (:data:`OTHER_RELEASE`; an engine with
    no fitted release, such as MLPerf's image harness, is read with the ``default`` profile both times). Returns
    pooled and per-breakdown MAPE for both readings (``tokens``: prompt tokens) and every row's errors (with its
    batch)."""
    params = params or RooflineParams.load()
    path = path or HOLDOUT_FILE
    rows = load_rows(("e2e",), reference=path)
    t = rows.table.assign(tokens=rows.table.prompt_tokens)
    readings = {"default": "default",
                "other_release": np.array([OTHER_RELEASE.get(e, "default") for e in t.engine], dtype=object)}
    out = {"file": Path(path).name, "rows": int(len(t)), "engines": sorted(set(t.engine)),
           "sources": sorted(set(t.source)), "other_release": {e: OTHER_RELEASE[e] for e in sorted(set(t.engine))
                                                               if e in OTHER_RELEASE},
           "readings": {}, "points": []}
    preds = {}
    for name, engines in readings.items():
        pred = preds[name] = rows.predict(params, engines)
        err = np.abs(pred / rows.measured - 1.0)
        entry = {"mape": float(err.mean()), "median_ape": float(np.median(err)),
                 "mean_signed": float(np.mean(pred / rows.measured - 1.0))}
        for key in HOLDOUT_BREAKDOWNS:
            values = t[key].astype(str).to_numpy()
            entry[f"by_{key}"] = {v: {"rows": int((values == v).sum()), "mape": float(err[values == v].mean())}
                                  for v in sorted(set(values), key=lambda x: (len(x), x))}
        out["readings"][name] = entry
    for i, r in enumerate(t.itertuples()):
        out["points"].append({"model": r.model, "gpu": r.gpu, "tp": int(r.tp), "engine": r.engine, "phase": r.phase,
                              "batch": int(r.batch), "tokens": int(r.tokens), "context": int(r.context), "measured_ms": float(r.measured_ms),
                              **{f"{k}_ms": round(float(v[i]), 2) for k, v in preds.items()}})
    return out


def image_server_report(params: RooflineParams | None = None) -> dict:
    """The image server's profile (shipped constants) and its fit: every row of ``perf_reference_mlperf_images.csv``
    predicted in sample. (Its check, the L4 and T4 rows no fit sees, is :func:`holdout_report` of
    ``perf_holdout_mlperf_images.csv``.)"""
    params = params or RooflineParams.load()
    if IMAGE_ENGINE not in params.engines:
        return {}
    prof = params.engines[IMAGE_ENGINE]
    rows = load_rows(("e2e",), reference=REFERENCE_IMAGE_FILE)
    pred = rows.predict(params, IMAGE_ENGINE)
    return {"file": REFERENCE_IMAGE_FILE.name, "rows": int(len(pred)), "prefill_overhead_ms": prof.prefill_overhead_ms,
            "gemm_efficiency": prof.gemm_efficiency, "in_sample_mape": mape(pred, rows.measured),
            "points": [{"gpu": r.gpu, "batch": int(r.batch), "measured_ms": float(r.measured_ms),
                        "fit_ms": round(float(p), 3)} for r, p in zip(rows.table.itertuples(), pred, strict=True)]}
