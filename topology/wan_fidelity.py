"""How well the WAN latency model predicts measured round-trip times: the tables ``edgepop validate`` prints.

:func:`wan_report` predicts every shipped RTT set (``topology.rtt_sets``) with the shipped constants and,
refitting without each data set's provider or each continent in turn (``topology.calibration``), out of sample.
Every table gives, per data set, distance band or continent: pairs, median and 90th-percentile absolute
percentage error and the median predicted/measured ratio. The goals are checked on the cross-validated
predictions: median APE <= 10%, p90 APE <= 30% and every distance band's median ratio within 0.85-1.15.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from topology.calibration import cross_validate, errors, fit, neutral_params, predict
from topology.latency import LatencyModel, LatencyParams, build_backbone, default_sites
from topology.rtt_sets import BANDS, SETS, load_all

GOALS = {"median_ape": 0.10, "p90_ape": 0.30, "band_ratio": (0.85, 1.15)}


def table(frame: pd.DataFrame, col: str, by: str) -> dict:
    """``errors`` of ``col`` against the measurement for each value of ``by`` (bands in distance order)."""
    order = [b for _, _, b in BANDS] if by == "band" else sorted(set(frame[by]))
    return {str(k): errors(frame.loc[frame[by] == k, col].to_numpy(), frame.loc[frame[by] == k, "rtt_ms"].to_numpy())
            for k in order if (frame[by] == k).any()}


def continent_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Each pair once per continent it touches (a pair inside one continent once), column ``continent``."""
    a = frame.assign(continent=frame.continent_a)
    b = frame[frame.continent_b != frame.continent_a].assign(continent=frame.continent_b)
    return pd.concat([a, b], ignore_index=True)


def goal_check(frame: pd.DataFrame, col: str) -> dict:
    """The goals on one prediction column: pooled median / p90 APE and each band's median ratio."""
    pooled = errors(frame[col].to_numpy(), frame.rtt_ms.to_numpy())
    lo, hi = GOALS["band_ratio"]
    bands = table(frame, col, "band")
    failures = []
    if pooled["median_ape"] > GOALS["median_ape"]:
        failures.append(f"median APE {pooled['median_ape']:.1%}")
    if pooled["p90_ape"] > GOALS["p90_ape"]:
        failures.append(f"p90 APE {pooled['p90_ape']:.1%}")
    failures += [f"{b} median ratio {e['median_ratio']:.2f}" for b, e in bands.items()
                 if not lo <= e["median_ratio"] <= hi]
    return {"pooled": pooled, "met": not failures, "failures": failures}


def wan_report(params: LatencyParams | None = None, cross_validated: bool = True, frames: dict | None = None
               ) -> dict:
    """Fidelity tables of the WAN model with ``params`` (the shipped constants by default). ``frames``: a dict
    that receives the fitted sets' pairs with their predictions (``wan``; held-out ones too when cross-validated),
    for plots."""
    params = params or LatencyParams.load()
    backbone = build_backbone(default_sites(), params.knn, params.max_link_km)
    m = load_all()
    m["predicted_ms"] = predict(LatencyModel(backbone, params), m)
    fitted = m[m.set.map(lambda s: SETS[s].fitted)].reset_index(drop=True)
    report = {
        "sets": {name: {"provider": s.provider, "statistic": s.statistic, "fitted": s.fitted}
                 for name, s in SETS.items()},
        "params": {k: getattr(params, k) for k in ("alpha_land", "alpha_sea", "hop_ms", "base_ms",
                                                   "short_inflation", "short_scale_km")},
        "goals": {"median_ape": GOALS["median_ape"], "p90_ape": GOALS["p90_ape"],
                  "band_ratio": list(GOALS["band_ratio"])},
        "in_sample": {"by_set": table(m, "predicted_ms", "set"), "by_band": table(fitted, "predicted_ms", "band"),
                      "by_set_band": {s: table(m[m.set == s], "predicted_ms", "band") for s in SETS},
                      "by_continent": table(continent_rows(fitted), "predicted_ms", "continent"),
                      "pooled": errors(fitted.predicted_ms.to_numpy(), fitted.rtt_ms.to_numpy())},
    }
    if cross_validated:
        cv = cross_validate(fitted, params, backbone)
        if frames is not None:
            frames["wan"] = cv
        conts = continent_rows(cv)
        report["leave_one_set_out"] = {"by_set": table(cv, "cv_set_ms", "set"),
                                       "by_band": table(cv, "cv_set_ms", "band"),
                                       "by_continent": table(conts, "cv_set_ms", "continent"),
                                       **goal_check(cv, "cv_set_ms")}
        # Per continent: its pairs as the fit that left that continent out predicts them (a pair spanning two
        # continents is predicted by two folds, one per row).
        own = conts.assign(cv_own_ms=[getattr(r, f"cv_continent_{r.continent}_ms") for r in conts.itertuples()])
        report["leave_one_continent_out"] = {"by_set": table(cv, "cv_continent_ms", "set"),
                                             "by_band": table(cv, "cv_continent_ms", "band"),
                                             "by_continent": table(own, "cv_own_ms", "continent"),
                                             **goal_check(cv, "cv_continent_ms")}
    elif frames is not None:
        frames["wan"] = fitted
    return report


def every_provider_report(params: LatencyParams | None = None) -> dict:
    """What fitting every provider's newest set (the reported-only ones too) would give: its constants, in-sample
    errors by band and the cross-validated goal checks. The docs show it beside the shipped fit."""
    params = params or LatencyParams.load()
    backbone = build_backbone(default_sites(), params.knn, params.max_link_km)
    fitted_providers = {s.provider for s in SETS.values() if s.fitted}
    names = [n for n, s in SETS.items() if s.fitted or s.provider not in fitted_providers]
    m = load_all(names)
    p = fit(m, neutral_params(params), backbone)
    m["predicted_ms"] = predict(LatencyModel(backbone, p), m)
    cv = cross_validate(m, p, backbone)
    return {"sets": names, "params": {k: getattr(p, k) for k in ("alpha_land", "alpha_sea", "hop_ms", "base_ms",
                                                                  "short_inflation", "short_scale_km")},
            "in_sample": {"by_band": table(m, "predicted_ms", "band"), **goal_check(m, "predicted_ms")},
            "leave_one_set_out": goal_check(cv, "cv_set_ms"), "leave_one_continent_out": goal_check(cv, "cv_continent_ms")}


def worst_pairs(params: LatencyParams | None = None, n: int = 5) -> list[dict]:
    """The ``n`` pairs of each data set the shipped model misses most (for the docs: where it stops holding)."""
    params = params or LatencyParams.load()
    m = load_all()
    m["predicted_ms"] = predict(LatencyModel(build_backbone(default_sites(), params.knn, params.max_link_km),
                                             params), m)
    m["ape"] = np.abs(m.predicted_ms - m.rtt_ms) / m.rtt_ms
    top = m.sort_values("ape", ascending=False, kind="stable").groupby("set", sort=False).head(n)
    return [{"set": r.set, "a": r.a, "b": r.b, "km": round(float(r.km)), "measured_ms": round(float(r.rtt_ms), 1),
             "predicted_ms": round(float(r.predicted_ms), 1)} for r in top.sort_values(["set", "ape"],
                                                                                   ascending=[True, False]).itertuples()]
