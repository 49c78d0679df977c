"""Calibration of the WAN latency model on measured round-trip times.

Data: IBM Cloud's published average RTTs between 10 regions on 4 continents (Feb-Mar 2024, 45 pairs). The fit
chooses the circuity factors, the per-hop cost and the fixed base cost that minimise the mean absolute log
error, the physics (light at 200 km/ms in fibre) staying fixed. Leave-one-region-out cross-validation reports
how the model does on a region it was not fitted on, which is what held-out measurements will see.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from topology.geo import fibre_rtt_ms, haversine_km
from topology.latency import LatencyModel, LatencyParams, build_backbone, default_sites
from topology.tables import DATA_DIR

FREE = ("alpha_land", "alpha_sea", "hop_ms", "base_ms")
LOWER = np.array([1.0, 1.0, 0.05, 0.0])  # hop >= 50 us: routers are never free
UPPER = np.array([3.0, 2.5, 2.0, 10.0])


def load_measurements() -> pd.DataFrame:
    """IBM inter-region table as pairs: a, b, lat_a, lon_a, lat_b, lon_b, rtt_ms (mean of both directions)."""
    raw = pd.read_csv(DATA_DIR / "ibm_interregion_rtt_ms.csv", comment="#", index_col=0)
    coords = pd.read_csv(DATA_DIR / "ibm_region_coords.csv").set_index("name")
    rows = []
    names = list(raw.index)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            vals = [v for v in (raw.loc[a, b], raw.loc[b, a]) if pd.notna(v)]
            rows.append((a, b, *coords.loc[a, ["lat", "lon"]], *coords.loc[b, ["lat", "lon"]], float(np.mean(vals))))
    return pd.DataFrame(rows, columns=["a", "b", "lat_a", "lon_a", "lat_b", "lon_b", "rtt_ms"])


def predict(model: LatencyModel, m: pd.DataFrame) -> np.ndarray:
    return np.asarray(model.core_rtt_ms(m.lat_a, m.lon_a, m.lat_b, m.lon_b))


def errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    ape = np.abs(pred - meas) / meas
    return {"median_ape": float(np.median(ape)), "mean_ape": float(np.mean(ape)), "max_ape": float(np.max(ape))}


def _fit(backbone, start: LatencyParams, m: pd.DataFrame) -> LatencyParams:
    meas = m.rtt_ms.to_numpy()

    def loss(x: np.ndarray) -> float:
        x = np.clip(x, LOWER, UPPER)
        params = replace(start, **dict(zip(FREE, x, strict=True)))
        pred = predict(LatencyModel(backbone, params), m)
        return float(np.mean(np.abs(np.log(pred / meas))))

    x0 = np.array([getattr(start, f) for f in FREE])
    res = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-5, "maxiter": 400})
    return replace(start, **dict(zip(FREE, np.clip(res.x, LOWER, UPPER).round(4).tolist(), strict=True)))


def plain_distance_fit(m: pd.DataFrame) -> dict[str, float]:
    """Baseline: RTT = a + b * great-circle km, least squares. What a model without geography reaches."""
    km = haversine_km(m.lat_a, m.lon_a, m.lat_b, m.lon_b)
    b, a = np.polyfit(km, m.rtt_ms, 1)
    return errors(a + b * km, m.rtt_ms.to_numpy())


def calibrate(start: LatencyParams | None = None, cross_validate: bool = True) -> LatencyParams:
    """Fit the free parameters on the IBM table; returns params whose ``meta`` holds the error report."""
    start = start or LatencyParams()
    m = load_measurements()
    backbone = build_backbone(default_sites(), start.knn, start.max_link_km)
    fitted = _fit(backbone, start, m)
    model = LatencyModel(backbone, fitted)
    pred = predict(model, m)
    meta: dict = {"fit_on": "IBM Cloud inter-region average RTT, 45 pairs, Feb-Mar 2024",
                  "in_sample": errors(pred, m.rtt_ms.to_numpy()),
                  "plain_distance_fit": plain_distance_fit(m)}
    inflation = pred / fibre_rtt_ms(haversine_km(m.lat_a, m.lon_a, m.lat_b, m.lon_b))
    meta["median_inflation_vs_fibre_great_circle"] = float(np.median(inflation))
    if cross_validate:
        cv_pred = np.empty(len(m))
        for region in sorted(set(m.a) | set(m.b)):
            test = (m.a == region) | (m.b == region)
            p = _fit(backbone, fitted, m[~test])
            cv_pred[test.to_numpy()] = predict(LatencyModel(backbone, p), m[test])
        meta["leave_one_region_out"] = errors(cv_pred, m.rtt_ms.to_numpy())
    return replace(fitted, meta=meta)


if __name__ == "__main__":  # python -m topology.calibration  -> refits and rewrites data/latency_params.json
    params = calibrate()
    params.save()
    print(params)
