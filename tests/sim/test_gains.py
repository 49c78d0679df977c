"""Gains with intervals: the bootstrap covers the true gain on synthetic data; crossovers on a scenario built to
cross over (small GPUs near the users, big ones far away)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.gains import HEADLINE_LOSSES, Bootstrap, Paired, crossovers, loss_sentence, losses, prompt_bin
from sim.run import run_scenario


def _frame(ttft: np.ndarray, arrival: np.ndarray) -> pd.DataFrame:
    n = len(ttft)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrival, "task": "text-generation",
                         "outcome": "ok", "batch": False, "ttft_ms": ttft, "prompt_tokens": 100,
                         "user_continent": "EU"})


def test_intervals_cover_the_true_gain():
    """Edge and central TTFT lognormal with medians e^4 and e^5 ms (same spread): every percentile's true
    reduction is 1 - e^-1 = 63.2%. The 95% intervals must cover it in about 95% of independent runs."""
    truth = 100 * (1 - np.exp(-1.0))
    hits = {"p50": 0, "p95": 0}
    runs = 200
    for k in range(runs):
        rng = np.random.default_rng(1000 + k)
        n = 3000
        arrival = np.sort(rng.uniform(0, 600, n))
        e = _frame(np.exp(4 + 0.5 * rng.standard_normal(n)), arrival)
        c = _frame(np.exp(5 + 0.5 * rng.standard_normal(n)), arrival)
        p = Paired(e, c, seed=k)
        g = p.quantile_gain("ttft_ms", p.gen, (0.5, 0.95))
        for q in hits:
            lo, hi = g[q]["ci95"]
            hits[q] += lo <= truth <= hi
    for q, h in hits.items():
        assert 0.89 <= h / runs <= 0.99, (q, h / runs)


def test_batch_rows_held_on_one_side_keep_blocks_and_load_windows_on_the_users_clock():
    """A night policy holds some edge batch rows for hours (their arrival_s is their release): the bootstrap's
    blocks and the load windows still cut the users' 100 s, not the edge's hours (every interactive request in block
    0 gave zero-width intervals, some excluding their own point)."""
    rng = np.random.default_rng(5)
    n = 2000
    arrival = np.sort(rng.uniform(0, 100, n))
    e, c = _frame(rng.exponential(50, n), arrival), _frame(rng.exponential(80, n), arrival)
    held = rng.random(n) < 0.1
    e["batch"] = c["batch"] = held
    e.loc[held, "arrival_s"] = e.loc[held, "arrival_s"] + 30_000.0
    p = Paired(e, c, seed=1)
    assert len(np.unique(p.boot.block[~held])) == 50
    lo, hi = p.quantile_gain("ttft_ms", ~held)["p50"]["ci95"]
    assert hi - lo > 1.0
    levels = crossovers(p, window_s=10.0)["by_load"]
    assert sum(v["requests"] for v in levels.values()) == int((~held).sum())
    assert min(v["requests"] for v in levels.values()) > 300  # terciles of the users' rate, not one bin


def test_same_seed_same_intervals_and_order_free_pairing():
    rng = np.random.default_rng(3)
    arrival = np.sort(rng.uniform(0, 100, 500))
    e, c = _frame(rng.exponential(50, 500), arrival), _frame(rng.exponential(80, 500), arrival)
    a = Paired(e, c, seed=1).quantile_gain("ttft_ms", np.ones(500, bool))
    b = Paired(e, c.iloc[::-1], seed=1).quantile_gain("ttft_ms", np.ones(500, bool))  # rows re-aligned by id
    assert a == b


def test_prompt_bins_are_the_documented_edges():
    bins = prompt_bin(np.array([1, 256, 257, 1024, 1025, 4096, 4097, 16384, 16385]))
    assert list(bins) == ["<=256", "<=256", "257-1k", "257-1k", "1k-4k", "1k-4k", "4k-16k", "4k-16k", ">16k"]


@pytest.fixture(scope="module")
def crossing(tmp_path_factory, topo):
    """14 single-L4 PoPs in Europe against one H200 box in Virginia, one 8B model, prompts from tens of tokens
    to tens of thousands: the edge is nearer, central prefills long prompts an order of magnitude faster."""
    pops = topo.pops[(topo.pops.tier == 4) & (topo.pops.continent == "EU")].id.tolist()
    path = tmp_path_factory.mktemp("xo") / "xo.toml"
    path.write_text(f'''seed = 5
[workload]
kind = "poisson"
requests = 3000
rps = 1.5
mix = {{"@cf/meta/llama-3.1-8b-instruct-fp8" = 1.0}}
[workload.tokens.text-generation]
prompt = {{median = 600, sigma = 2.0}}
output = {{median = 16, sigma = 0.3}}
[edge]
pops = {pops!r}
router = "nearest-balanced"
[central]
baseline = "us-east"
budget = "usd"
node = "H200x8"
router = "nearest-balanced"
'''.replace("'", '"'))
    return run_scenario(str(path), topo=topo).summary


def test_goodput_of_both_deployments_is_over_one_window(crossing):
    """Same arrivals, same window: the goodputs compare as the SLO-met counts do (each side's own drain decided
    its figure: the side that met more SLOs could read lower)."""
    e, c = (crossing["deployments"][d] for d in ("edge", "central"))
    span = crossing["simulated_span_s"]
    for block in (e, c):
        assert block["goodput_rps"] == pytest.approx(block["slo_met"] / span, abs=1e-3)


def test_load_levels_are_rates_over_equal_windows():
    """Arrivals thickening over 310 s, windows of about 25 s: the busiest arrivals, at the end, are the high load
    (with 25-s windows the last one held 10 s of arrivals and read as a low load)."""
    from sim.gains import load_level

    arrival = 310.0 * np.sqrt(np.linspace(0.0, 1.0, 20_000))  # rate rising linearly with time
    level = load_level(arrival, 25.0)
    assert level[-1] == "high" and level[0] == "low"
    assert (level[arrival > 300] == "high").all()


def test_crossover_table_shows_where_the_edge_wins_and_loses(crossing):
    by = crossing["gains"]["by_prompt_tokens"]
    assert set(by) == {"<=256", "257-1k", "1k-4k", "4k-16k", ">16k"}
    short, long = by["<=256"], by[">16k"]
    assert short["requests"] >= 30 and long["requests"] >= 30
    assert short["ttft_p50_reduction_pct"] > 0 and short["ttft_p50_ci95"][0] > 0  # the edge wins, surely
    assert long["ttft_p50_reduction_pct"] < 0 and long["ttft_p50_ci95"][1] < 0  # and loses, surely
    # the gain falls with the prompt size: prefill time, not the network, decides long prompts
    p50 = [by[b]["ttft_p50_reduction_pct"] for b in ("<=256", "257-1k", "1k-4k", "4k-16k", ">16k")]
    assert p50 == sorted(p50, reverse=True)
    found = [text for _, text in losses(crossing["gains"])]
    assert any("prompts of >16k tokens" in t for t in found)
    assert crossing["gains"]["edge_loses"].startswith("edge loses: ")
    assert set(crossing["gains"]["by_continent"]) and set(crossing["gains"]["by_load"]) == {"low", "mid", "high"}


def test_every_headline_figure_with_an_interval_can_be_named_a_loss():
    """The report's table gives TTFT p99 and SLO attainment with intervals too: a loss there is named (it was left
    out of the sentence while the table showed it), SLO attainment as a difference of shares, not a %."""
    gains = {"ci95": {"ttft_ms_p99_reduction_pct": [-29.1, -18.3], "slo_attainment_delta": [-0.0012, -0.0007],
                      "ttft_ms_p50_reduction_pct": [10.0, 20.0], "network_rtt_ms_p50_reduction_pct": [-5.0, -1.0]},
             "ttft_ms_p99_reduction_pct": -24.1, "slo_attainment_delta": -0.001, "ttft_ms_p50_reduction_pct": 15.0,
             "network_rtt_ms_p50_reduction_pct": -3.0}
    assert [text for _, text in losses(gains)] == ["TTFT p99 overall -24.1% [-29.1, -18.3]",
                                                   "network RTT p50 overall -3.0% [-5.0, -1.0]",
                                                   "SLO attainment overall -0.0010 [-0.0012, -0.0007]"]
    from sim.report import HEADLINE

    keys = {row[3] for row in HEADLINE if row[3]}  # every figure the report's table gives with an interval
    assert keys <= {key for key, _ in HEADLINE_LOSSES}


def test_loss_sentence_when_the_edge_loses_nowhere():
    gains = {"ci95": {"ttft_ms_p50_reduction_pct": [10.0, 20.0]}, "ttft_ms_p50_reduction_pct": 15.0,
             "by_prompt_tokens": {"<=256": {"ttft_p50_reduction_pct": 5.0, "ttft_p50_ci95": [-1.0, 9.0]}}}
    assert losses(gains) == []
    assert loss_sentence(gains).startswith("the edge loses nowhere in this run")


def test_crossovers_skip_thin_bins():
    rng = np.random.default_rng(0)
    n = 400
    arrival = np.sort(rng.uniform(0, 100, n))
    e, c = _frame(rng.exponential(50, n), arrival), _frame(rng.exponential(80, n), arrival)
    e.loc[:9, "prompt_tokens"] = c.loc[:9, "prompt_tokens"] = 20_000  # 10 long prompts: too few for a figure
    out = crossovers(Paired(e, c, seed=0), window_s=10.0)
    assert out["by_prompt_tokens"][">16k"] == {"requests": 10}
    assert "ttft_p50_ci95" in out["by_prompt_tokens"]["<=256"]


def _running_sum_quantiles(boot, values, mask, qs):
    """Reference: numpy's linear quantile over each resample's multiset (every value repeated by its block's
    weight), its k-th value read from the running sum of weights over the sorted values."""
    idx = np.flatnonzero(mask & np.isfinite(values))
    out = np.full((len(boot.weights), len(qs)), np.nan)
    if idx.size:
        order = idx[np.argsort(values[idx], kind="stable")]
        v = values[order]
        for r, weights in enumerate(boot.weights):
            run = np.cumsum(weights[boot.block[order]])
            if run[-1] > 0:
                for j, q in enumerate(qs):
                    h = (run[-1] - 1) * q
                    k = np.floor(h)
                    a = v[np.searchsorted(run, k + 1, side="left")]
                    b = v[np.searchsorted(run, min(k + 2, run[-1]), side="left")]
                    out[r, j] = float(np.quantile([a, b], h - k))  # numpy's own interpolation between the two
    return out


@pytest.mark.parametrize("seed", range(6))
def test_bootstrap_quantiles_equal_the_running_sum_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    boot = Bootstrap(np.sort(rng.random(n)), seed=seed, blocks=int(rng.integers(1, 60)), resamples=40)
    values = np.round(rng.exponential(10.0, n), 1)  # ties
    values[rng.random(n) < 0.05] = np.nan
    mask = rng.random(n) < 0.7
    qs = [0.0, 0.5, 0.95, 0.99, 1.0]
    want = _running_sum_quantiles(boot, values, mask, qs)
    assert np.array_equal(boot.quantiles(values, mask, qs), want, equal_nan=True)
    # the same from the whole column's stable order, as Paired hands it (ties and NaN included)
    assert np.array_equal(boot.quantiles(values, mask, qs, np.argsort(values, kind="stable")), want, equal_nan=True)
    assert np.isnan(boot.quantiles(values, np.zeros(n, bool), qs)).all()


def test_resampled_quantiles_are_numpys_over_the_weighted_multiset():
    """Each resample's quantile is numpy's default (linear) quantile over the values repeated by their block's
    weight, the definition of the point estimates, so a figure and its interval are of one statistic (also for
    ties, a subset and fewer values than the search's marks)."""
    rng = np.random.default_rng(5)
    for n in (1, 2, 40, 3000):
        arrival = np.sort(rng.uniform(0, 100, n))
        values = np.round(rng.lognormal(4, 1, n), 1 if n > 100 else 3)  # ties at n = 3000
        mask = rng.uniform(size=n) < 0.8
        boot = Bootstrap(arrival, seed=n, resamples=30)
        qs = (0.0, 0.05, 0.5, 0.95, 1.0)
        got = boot.quantiles(values, mask, qs)
        for r in range(30):
            reps = np.repeat(values[mask], boot.weights[r][boot.block[mask]].astype(int))
            want = np.quantile(reps, qs) if reps.size else np.full(len(qs), np.nan)
            np.testing.assert_array_equal(got[r], want)
    boot = Bootstrap(np.arange(500.0), seed=1, resamples=3)
    boot.weights[:] = 1.0  # every request once: the point estimate itself
    values = rng.exponential(10.0, 500)
    np.testing.assert_array_equal(boot.quantiles(values, np.ones(500, bool), (0.5, 0.95))[0],
                                  np.percentile(values, [50, 95]))


@pytest.mark.parametrize("arrival", ["all at once", "one early request"])
def test_arrivals_too_uneven_for_equal_time_blocks_get_equal_count_blocks(arrival):
    """A trace sent all at once put every request in one time block (zero-width intervals, points outside their
    own interval); a lone request two hours early left three blocks. Blocks then hold equal request counts, in
    arrival order, and the method says so."""
    rng = np.random.default_rng(3)
    n = 1200
    t = np.zeros(n) if arrival == "all at once" else np.r_[-7200.0, np.sort(rng.uniform(0, 600, n - 1))]
    e, c = _frame(rng.lognormal(4, 0.5, n), t), _frame(rng.lognormal(4.5, 0.5, n), t)
    p = Paired(e, c, seed=1)
    assert np.bincount(p.boot.block).tolist() == [n // 50] * 50
    assert "equal request counts" in p.boot.method
    g = p.quantile_gain("ttft_ms", p.gen, (0.5, 0.95))
    for v in g.values():
        lo, hi = v["ci95"]
        assert lo < v["reduction_pct"] < hi  # a real width, around its own point
    spread = Paired(e.assign(arrival_s=np.sort(rng.uniform(0, 600, n))), c.assign(arrival_s=0.0), seed=1)
    assert "equal-time" in spread.boot.method  # (the users' clock: the earlier of the two sides' arrival)


def test_block_bootstrap_covers_gains_under_time_correlated_load():
    """Each side's latency drifts with its own load (an AR(1) process, correlation time 2 s) besides a per-request
    part both sides share (the user's distance): requests close in time are correlated, as under queueing. The
    run's 50 time blocks (12 s each) cover the true 63.2% reduction in 183 runs of 200; 1 s blocks (five requests
    each), which treat requests seconds apart as independent, in 146: the blocks' length is what
    the intervals need."""
    from scipy.signal import lfilter

    truth = 100 * (1 - np.exp(-1.0))
    runs, n = 200, 3000
    phi = np.exp(-1 / 2.0)  # an AR(1) step's correlation on the 1 s grid
    hits = {"blocks": 0, "requests": 0}
    for k in range(runs):
        rng = np.random.default_rng(2000 + k)
        arrival = np.sort(rng.uniform(0, 600, n))
        second = arrival.astype(int)

        def load(rng=rng, at=second):  # on a 1 s grid, stationary: unit variance from the first second on
            shocks = rng.standard_normal(601) * np.r_[1.0, np.full(600, np.sqrt(1 - phi ** 2))]
            return 0.4 * lfilter([1.0], [1.0, -phi], shocks)[at]

        user = 0.3 * rng.standard_normal(n)
        e = _frame(np.exp(4 + user + load() + 0.3 * rng.standard_normal(n)), arrival)
        c = _frame(np.exp(5 + user + load() + 0.3 * rng.standard_normal(n)), arrival)
        p = Paired(e, c, seed=k)
        lo, hi = p.quantile_gain("ttft_ms", p.gen)["p50"]["ci95"]
        hits["blocks"] += lo <= truth <= hi
        p.boot = Bootstrap(p.arrival, k, blocks=600, resamples=200)  # 1 s blocks: about five requests each
        lo, hi = p.quantile_gain("ttft_ms", p.gen)["p50"]["ci95"]
        hits["requests"] += lo <= truth <= hi
    assert 0.85 <= hits["blocks"] / runs <= 0.99, hits
    assert hits["requests"] / runs < 0.8, hits


def test_report_title_and_plots_speak_of_what_ran():
    import pandas as pd

    from sim.plots import _interactive
    from sim.report import title_line

    s = {"scenario": "small", "requests": 10, "seed": 1, "baseline": "big3", "deployments": {"edge": {}}}
    assert title_line(s).endswith("GPU inventory x1, edge only)")  # no central was simulated
    s["deployments"]["central"] = {}
    assert title_line(s).endswith("central big3)")
    frame = pd.DataFrame({"batch": [True, False, False]})
    assert list(_interactive(frame)) == [False, True, True]  # the plots leave async batch rows out, as the tables do


def test_the_report_says_failed_only_where_requests_went_unanswered():
    from sim.report import _cell

    keys = ("ttft_ms_counting_failures", "p95")
    none = {"p50": None, "p90": None, "p95": None, "p99": None}
    # no text generation at all (an embeddings-only run, some embeddings rejected): nothing fell on failures
    assert _cell(keys, {"ttft_ms_counting_failures": none, "generation_requests": 0,
                        "outcomes": {"ok": 790, "rejected": 10, "failed": 0}}) is None
    assert _cell(keys, {"ttft_ms_counting_failures": none, "generation_requests": 100,
                        "outcomes": {"ok": 10, "rejected": 90, "failed": 0}}) == "failed"
    from sim.metrics import attainment

    assert (attainment(19_999, 20_000), attainment(20_000, 20_000), attainment(0, 0)) == (0.9999, 1.0, None)
    from sim.report import _fmt

    assert (_fmt(2999 / 3000), _fmt(1.0), _fmt(0.9982)) == ("0.9997", "1.000", "0.998")  # no false 1.000


def test_country_gain_leaves_async_batch_rows_out():
    """The per-country map reads interactive requests, as the summary's tables do: a batch row's TTFT (it waits
    for spare capacity by design) moves no median."""
    from sim.metrics import country_gain, interactive

    def frame(ttft, batch):
        n = len(ttft)
        return pd.DataFrame({"outcome": ["ok"] * n, "task": ["text-generation"] * n, "user_country": ["DE"] * n,
                             "user_lat": [50.0] * n, "user_lon": [8.0] * n, "ttft_ms": ttft, "batch": batch})

    edge = frame([50.0, 60.0, 70.0, 9000.0, 9000.0, 9000.0], [False, False, False, True, True, True])
    central = frame([100.0, 100.0, 100.0, 5.0, 5.0, 5.0], [False, False, False, True, True, True])
    g = country_gain(edge, central).set_index("user_country")
    assert g.loc["DE", "n"] == 3 and g.loc["DE", "ttft_edge"] == 60.0 and g.loc["DE", "ttft_central"] == 100.0
    assert g.loc["DE", "gain_pct"] == pytest.approx(40.0)
    assert len(interactive(edge)) == 3 and len(interactive(edge.drop(columns="batch"))) == 6


def test_country_gain_of_rows_chosen_once_equals_the_filtering_path():
    """The gain map chooses its rows once and passes only the columns it reads (filtered=True); on a run's real
    frame, with failed, one-shot and other-country rows mixed in, that gives the same table as the filtering path."""
    from sim.metrics import country_gain, interactive

    req = run_scenario("small", requests=600).requests
    edge, central = (req[req.deployment == dep] for dep in ("edge", "central"))
    full = country_gain(edge, central)

    def chosen(f):
        f = interactive(f)
        keep = ((f.outcome == "ok") & (f.task == "text-generation")).to_numpy(dtype=bool)
        return f.loc[keep, ["user_country", "ttft_ms", "user_lat", "user_lon"]]

    assert len(full) > 3 and (edge.task != "text-generation").any()
    pd.testing.assert_frame_equal(country_gain(chosen(edge), chosen(central), filtered=True), full)


def test_loss_sentence_claims_no_loss_only_over_figures_with_an_interval():
    none = {"ci95": {key: None for key, _ in HEADLINE_LOSSES},
            "by_prompt_tokens": {"<=256": {"ttft_p50_reduction_pct": 5.0, "ttft_p50_ci95": None}}}
    text = loss_sentence(none)
    assert "loses nowhere" not in text and text.startswith("no loss can be shown in this run")
    some = {"ci95": {**none["ci95"], "ttft_ms_p50_reduction_pct": [10.0, 20.0]}, "ttft_ms_p50_reduction_pct": 15.0}
    text = loss_sentence(some)
    assert f"of the 1 headline figure with one ({len(HEADLINE_LOSSES) - 1} had none)" in text
    every = {"ci95": {key: [1.0, 2.0] for key, _ in HEADLINE_LOSSES}, **{key: 1.5 for key, _ in HEADLINE_LOSSES}}
    assert loss_sentence(every).startswith("the edge loses nowhere in this run: no headline figure")
