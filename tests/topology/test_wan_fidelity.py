"""WAN model fidelity on the shipped RTT sets (cross-validated), the measured data sets themselves, the jitter
distribution and the last mile.

Goals on held-out pairs: median APE <= 10%, p90 <= 30%, every distance band's median predicted/measured within
0.85-1.15. Leaving one continent out and leaving one data set out both meet all of them. Short paths held out
by data set reached only 0.76 while Azure was the only fitted set with more than one pair under 500 km; AWS's
set (ten short pairs) brought them in, and the random-effects weighting of data sets keeps AWS's slower
long-haul paths from pushing the pooled error over 10% when Azure is the set held out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edgepop.errors import UserError
from topology.jitter import RttJitter, fit, jitter_report, path_sigma
from topology.last_mile import LastMile, load_table
from topology.rtt_sets import CONTINENTS, SETS, load_all, load_history, load_pairs
from topology.tables import DATA_DIR
from topology.wan_fidelity import wan_report


@pytest.fixture(scope="module")
def reported():
    frames = {}
    return wan_report(frames=frames), frames["wan"]


@pytest.fixture(scope="module")
def report(reported):
    return reported[0]


def test_sets_are_whole_and_cover_short_regional_and_intercontinental_pairs():
    m = load_all()
    assert set(m.set) == set(SETS) and m.rtt_ms.gt(0).all() and m.km.notna().all()
    assert len(load_pairs("azure-2026")) == 54 * 53 // 2 and len(load_pairs("ibm-2026")) == 78
    assert len(load_pairs("gcp-2023")) == 40 * 39 // 2 and len(load_pairs("aws-2025")) == 32 * 31 // 2
    fitted = load_all(fitted_only=True)
    counts = fitted.band.value_counts()
    assert counts["<500 km"] >= 50 and counts["500-2,000 km"] >= 150 and counts[">6,000 km"] >= 1000
    assert set(fitted.continent_a) | set(fitted.continent_b) == {"AF", "AS", "EU", "NA", "OC", "SA"}
    # Measured RTTs never beat light in fibre along the great circle (coordinates and units are right).
    assert (m.rtt_ms >= 2 * m.km / 200.0).all()


@pytest.mark.parametrize("name", list(SETS))
def test_every_matrix_is_square_positive_both_ways_and_placed(name):
    """Each shipped matrix names the same regions on both axes, every region has coordinates and a continent,
    every pair is measured in both directions, positive, and the two directions agree (within 25% or 5 ms)."""
    spec = SETS[name]
    raw = pd.read_csv(DATA_DIR / spec.matrix_file, comment="#", index_col=0)
    coords = pd.read_csv(DATA_DIR / spec.coords_file, keep_default_na=False).set_index("name")
    assert list(raw.columns) == list(raw.index) and raw.index.is_unique
    assert set(raw.index) <= set(coords.index)
    placed = coords.loc[raw.index]
    assert placed.lat.between(-90, 90).all() and placed.lon.between(-180, 180).all()
    assert placed.continent.isin(list(CONTINENTS)).all()
    a = raw.to_numpy(dtype=float)
    off = ~np.eye(len(a), dtype=bool)
    assert np.isfinite(a[off]).all() and (a[off] > 0).all() and not np.isfinite(np.diag(a)).any()
    gap = np.abs(a - a.T)[off]
    assert ((gap <= 5.0) | (gap <= 0.25 * np.minimum(a, a.T)[off])).all()


def test_aws_short_paths_match_azures_on_the_same_metros(report):
    """Why AWS is fitted and Google is not (topology/rtt_sets.py): AWS's short pairs sit where Azure's do."""
    assert SETS["aws-2025"].fitted
    bands = report["in_sample"]["by_set_band"]
    assert bands["aws-2025"]["<500 km"]["pairs"] >= 10
    assert abs(bands["aws-2025"]["<500 km"]["median_ratio"] - bands["azure-2026"]["<500 km"]["median_ratio"]) < 0.1


def test_google_short_paths_are_why_it_is_reported_not_fitted(report):
    """Google Cloud's private backbone is faster on short paths than the fitted providers at the same distance:
    the shipped model predicts its short pairs too slow, Azure's about right (see topology/rtt_sets.py)."""
    assert not SETS["gcp-2023"].fitted
    bands = report["in_sample"]["by_set_band"]
    assert bands["gcp-2023"]["<500 km"]["median_ratio"] > 1.2 > bands["azure-2026"]["<500 km"]["median_ratio"]


def test_leave_one_continent_out_meets_every_goal(report):
    cv = report["leave_one_continent_out"]
    assert cv["met"], cv["failures"]
    assert cv["pooled"]["median_ape"] <= 0.10 and cv["pooled"]["p90_ape"] <= 0.30


def test_each_continent_is_scored_by_the_fit_that_left_it_out(reported):
    """Its row of the per-continent table covers every pair touching it, each predicted by the fold without that
    continent (a pair spanning two continents is in two folds); the pooled figures count each pair once."""
    import numpy as np

    from topology.calibration import errors

    report, cv = reported
    table = report["leave_one_continent_out"]["by_continent"]
    for cont, row in table.items():
        touch = (cv.continent_a == cont) | (cv.continent_b == cont)
        own = errors(cv.loc[touch, f"cv_continent_{cont}_ms"].to_numpy(), cv.loc[touch, "rtt_ms"].to_numpy())
        assert row["pairs"] == int(touch.sum()) and row["median_ape"] == own["median_ape"]
    first = cv[["continent_a", "continent_b"]].min(axis=1)  # the first in alphabetical order
    pooled = [getattr(r, f"cv_continent_{c}_ms") for r, c in zip(cv.itertuples(), first, strict=True)]
    assert np.allclose(cv.cv_continent_ms.to_numpy(), pooled)


def test_leave_one_set_out_meets_every_goal(report):
    cv = report["leave_one_set_out"]
    assert cv["met"], cv["failures"]
    assert cv["pooled"]["median_ape"] <= 0.10 and cv["pooled"]["p90_ape"] <= 0.30


def test_short_paths_are_no_longer_too_fast(report):
    """The model before the distance-dependent inflation predicted 0.76 of measured below 500 km."""
    assert report["in_sample"]["by_band"]["<500 km"]["median_ratio"] >= 0.95


def test_jitter_distribution_reproduces_measured_min_and_max():
    j = fit()
    assert 0.0 < j.excess < 0.1 and 0.0 < j.sigma < 2.0
    rep = jitter_report()
    assert rep["median_abs_error_of_min"] <= 0.02 and rep["median_abs_error_of_max"] <= 0.05
    draws = j.factors(200_000, np.random.default_rng(3))
    assert draws.mean() == pytest.approx(1.0, abs=2e-3) and draws.min() >= 1.0 - j.excess
    assert np.quantile(draws, 0.99) == pytest.approx(float(j.quantile(0.99)), rel=0.01)
    again = j.factors(10, np.random.default_rng(3))
    assert np.array_equal(again, j.factors(10, np.random.default_rng(3)))


def test_path_sigma_inverts_the_quantile():
    j = RttJitter(0.05, 0.6)
    n = np.array([12.0])
    top = j.quantile(n / (n + 1))
    sig = path_sigma(np.array([j.excess]), np.array(top - (1 - j.excess)), n)
    assert sig[0] == pytest.approx(0.6, rel=1e-6)
    assert path_sigma(np.array([0.05]), np.array([0.04]), n)[0] == 0.0  # max below mean: no tail seen
    assert len(load_history()) == 78


def test_last_mile_modes():
    cc = np.array(["DE", "US", "CN", "NA", "XX"])
    cont = np.array(["EU", "NA", "AS", "AF", "EU"])
    assert (LastMile().ms(cc, cont) == 10.0).all()
    country = LastMile("country").ms(cc, cont)
    continent = LastMile("continent").ms(cc, cont)
    table = load_table().set_index("cc").median_ms
    assert country[0] == table["DE"] and country[1] == table["US"]
    assert "NA" in table.index  # Namibia is not read as a missing value
    assert table["CN"] > 2 * continent[2] and country[2] == continent[2]  # a server abroad: continent's figure
    assert country[4] == continent[4]  # unknown country: its continent's figure
    with pytest.raises(UserError, match="last mile mode"):
        LastMile("per-city")
    for bad in (-5.0, float("nan"), float("inf")):
        with pytest.raises(UserError, match="fixed last mile must be a non-negative number"):
            LastMile("fixed", bad)


def test_scenario_fields_select_last_mile_and_jitter_and_summary_says_which(topo):
    from sim.run import run_scenario
    from sim.scenario import load_scenario, parse_scenario, with_overrides

    sc = load_scenario("small")
    base = run_scenario(sc, requests=300, topo=topo)
    assert base.summary["network"] == {"last_mile": "fixed 10 ms for every user", "jitter": "off", "anycast_misroute": 0.0}
    jit = run_scenario(with_overrides(sc, jitter=True), requests=300, topo=topo)
    assert jit.summary["network"]["jitter"].startswith("on: ")
    a, b = base.requests, jit.requests
    assert np.array_equal(a.arrival_s.to_numpy(), b.arrival_s.to_numpy())  # the same arrivals, other RTTs
    ok = a.network_rtt_ms.notna() & b.network_rtt_ms.notna()
    ratio = (b.network_rtt_ms[ok] / a.network_rtt_ms[ok]).to_numpy()
    assert ratio.min() >= 1.0 - fit().excess - 1e-9 and not np.allclose(ratio, 1.0)
    country = run_scenario(with_overrides(sc, last_mile="country"), requests=300)
    assert country.summary["network"]["last_mile"].startswith("M-Lab NDT")
    with pytest.raises(UserError, match="field 'last_mile' must be one of fixed, country, continent"):
        parse_scenario({"last_mile": "city", "workload": {"requests": 10}}, "x.toml")
