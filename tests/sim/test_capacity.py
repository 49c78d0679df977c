"""Capacity matching: equal budgets, no idle GPU, replicas in proportion to demand, one language model per GPU;
and the capacity, fault and cold-start blocks of summary.json."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.placement.fill import idle_gpus
from controlplane.placement.packing import GpuLedger
from sim.run import prepare, run_scenario, scenario_deployment
from sim.scenario import load_scenario, with_overrides


def _ledger(dep):
    placement = dep.placement
    net = placement.net
    ledger = GpuLedger(net)
    index = {m: i for i, m in enumerate(net.models)}
    for node, model, gpus in zip(placement.table.node, placement.table.model, placement.table.gpu_index,
                                 strict=True):
        ledger.seat(int(node), index[model], tuple(gpus))
    return net, ledger


@pytest.fixture(scope="module", params=["gpus", "usd"])
def built(request, topo):
    sc = load_scenario("small")
    sc = with_overrides(sc, central=__import__("dataclasses").replace(sc.central, budget=request.param,
                                                                      baseline="global-6"))
    setup = prepare(sc, topo)
    return request.param, setup, {name: scenario_deployment(setup, name) for name in ("edge", "central")}


def test_equal_budget(built):
    budget, _, deps = built
    e, c = (deps[n].fleet.nodes for n in ("edge", "central"))
    if budget == "gpus":
        assert e.gpus.sum() == c.gpus.sum()
        assert e.price_usd_hr.sum() == pytest.approx(c.price_usd_hr.sum())
        assert (c.gpus <= 8).all()  # racked in 8-GPU servers
    else:  # equal dollars: H100x8 boxes, within one box of the edge's $/hour
        assert set(c.gpu) == {"H100"} and (c.gpus == 8).all()
        assert abs(c.price_usd_hr.sum() - e.price_usd_hr.sum()) <= 24.0 / 2 * len(deps["central"].fleet.sites)


def test_no_idle_gpu_while_a_demanded_model_fits(built):
    _, _, deps = built
    for name, dep in deps.items():
        net, ledger = _ledger(dep)
        for node, gpus in enumerate(idle_gpus(ledger)):
            if len(gpus):  # an idle GPU is allowed only if no demanded model fits on it
                assert not net.fits[node].any() or all(net.tp[m] > len(gpus) for m in np.flatnonzero(
                    net.fits[node])), f"{name}: idle GPUs {gpus.tolist()} on node {node}"


def test_one_language_model_per_gpu(built):
    _, _, deps = built
    for dep in deps.values():
        table = dep.placement.table
        generative = {s.id for s in dep.plane.catalog if s.generative}
        gen = table.model.isin(generative)
        seen = set()
        for node, gpus in zip(table.node[gen], table.gpu_index[gen], strict=True):
            for g in gpus:
                assert (node, g) not in seen
                seen.add((node, g))


def test_central_replicas_follow_demand_in_each_region(built):
    """Water-filling: in each region, a language model got its last replica only while it was the most loaded per
    unit of capacity. So, with p = demand / capacity, every model's p is at most any other model's p computed
    without that model's last replica (when that model has more than its first one). Single-GPU models only: a
    tensor-parallel model also needs its GPUs idle on one node, which the last free GPUs may not offer."""
    _, _, deps = built
    placement = deps["central"].placement
    net = placement.net
    need = np.zeros((net.n_sites, net.n_models))
    np.add.at(need, (net.cand_site[:, 0], net.pair_model), net.pair_demand)
    gen = np.array([s.generative for s in net.specs]) & (net.tp == 1)
    checked = 0
    for site in range(net.n_sites):
        members = np.flatnonzero(net.node_site == site)
        counts = placement.counts[members]
        cap = (counts * net.cap[members]).sum(axis=0)
        models = np.flatnonzero(gen & (need[site] > 0) & (cap > 0))
        for j in models:
            if counts[:, j].sum() < 2:
                continue
            last = net.cap[members, j][counts[:, j] > 0].max()  # the largest a single replica of j adds
            before = need[site, j] / (cap[j] - last)
            for i in models:
                assert need[site, i] / cap[i] <= before * (1 + 1e-9), (site, net.models[i], net.models[j])
                checked += 1
    assert checked > 0


def test_summary_has_capacity_faults_and_cold_starts(topo):
    out = run_scenario("small", topo=topo, requests=1500, faults=["node:FRA-0@5+30"])
    s = out.summary
    for name in ("edge", "central"):
        cap = s["capacity"][name]
        assert cap["gpus"] == 228 and cap["replicas"] > 0 and cap["usd_per_hour"] > 0
        assert cap["capacity_rps"] > 0 and cap["capacity_tokens_per_s"] > 0
        assert 0 < cap["utilisation_mean"] <= cap["utilisation_peak_hour"] <= 1
        assert 0 <= cap["shared_busy_share"] <= 1 and cap["wait_p95_ms"] >= 0
        b = s["deployments"][name]
        assert set(b["faults"]) >= {"lost", "retried", "failed", "applied", "skipped"}
        assert b["cold_starts"]["requests"] >= 0
        assert b["e2e_ms_generation"]["n"] + b["e2e_ms_one_shot"]["n"] == b["e2e_ms"]["n"]
    # An edge node fault applies to the edge and is reported as skipped for central (no such node there).
    assert s["deployments"]["edge"]["faults"]["applied"] == ["node:FRA-0@5+30"]
    assert s["deployments"]["central"]["faults"]["applied"] == []
    assert "no node 'FRA-0' in the central fleet" in s["deployments"]["central"]["faults"]["skipped"][0]
    assert s["deployments"]["edge"]["gpu_usd"] == s["deployments"]["central"]["gpu_usd"]  # same window and GPUs
    # a run of ~60 s is sampled hundreds of times, not once a minute (its one sample at t=0 read 0% busy slots)
    u = out.utilisation
    for name in ("edge", "central"):
        assert (u.deployment == name).sum() >= 100
        assert s["deployments"][name]["mean_slot_utilisation"] > 0


def test_ilp_keeps_one_language_model_per_gpu_and_places_every_model(topo):
    """The MILP packs by groups of nodes: without its own one-LLM-per-GPU rows, packing its plan GPU by GPU lost
    every replica of some models on a scaled-down fleet."""
    from dataclasses import replace

    sc = load_scenario("small")
    sc = with_overrides(sc, edge=replace(sc.edge, placement="ilp", placement_options={"time_limit_s": 8.0}))
    setup = prepare(sc, topo)
    dep = scenario_deployment(setup, "edge")
    table = dep.placement.table
    assert set(setup.frame.model) <= set(table.model)
    generative = {s.id for s in dep.plane.catalog if s.generative}
    gen = table.model.isin(generative)
    seats = [(n, g) for n, gpus in zip(table.node[gen], table.gpu_index[gen], strict=True) for g in gpus]
    assert len(seats) == len(set(seats))


def test_short_span_cost_is_not_rounded_away(topo):
    """300 requests at 6,400 req/s arrive within ~0.05 s: the fleet's GPU-hours and dollars over that span are
    fractions of a cent, and the sweep row's cost per request is divided from them."""
    from sim.sweep_variant import summary_rows

    sc = with_overrides(load_scenario("small"), workload={"rps": 6400.0})
    out = run_scenario(sc, requests=300, seed=3, topo=topo)
    span_s = float(out.requests.arrival_s.max())  # the billing window: the arrivals' span
    assert 0 < span_s < 0.5
    rows = {r["deployment"]: r for r in summary_rows(out.summary)}
    for name, block in out.summary["deployments"].items():
        usd_per_hour = out.summary["capacity"][name]["usd_per_hour"]
        assert block["gpu_hours"] == pytest.approx(block["gpus"] * span_s / 3600, rel=1e-3)
        assert block["gpu_usd"] == pytest.approx(usd_per_hour * span_s / 3600, rel=1e-3)
        row = rows[name]
        assert row["slo_met"] == block["slo_met"] > 0
        assert row["gpu_usd_per_1k_ok"] == pytest.approx(1e3 * usd_per_hour * span_s / 3600 / row["ok"], rel=1e-3)


def test_speech_replicas_are_planned_at_their_clips_cost(built):
    """The placement's and the summary's capacity for a speech model cost its clips one by one (each pays its
    started windows), as the replica engine runs them: not the mean clip, which is ~1.5x cheaper here."""
    from controlplane.perf import capacity_rps, capacity_rps_mix
    from sim.capacity import serving_capacity

    _, setup, deps = built
    whisper = "@cf/openai/whisper"
    mix = setup.shape["prompt_mix"][whisper]
    assert len(mix) > 1 and sum(w for _, w in mix) == pytest.approx(1.0)
    net = deps["edge"].placement.net
    m = net.models.index(whisper) if isinstance(net.models, list) else list(net.models).index(whisper)
    spec = setup.catalog[whisper]
    for node in np.flatnonzero(net.cap[:, m] > 0)[:3]:
        gpu = net.node_gpu[node]
        assert net.cap[node, m] == pytest.approx(capacity_rps_mix(setup.perf, spec, gpu, mix, 0.0))
        assert net.cap[node, m] < 0.9 * capacity_rps(setup.perf, spec, gpu, setup.shape["prompt"][whisper], 0.0)
    table = deps["edge"].table
    _, per_model = serving_capacity(table[table.model == whisper], setup.catalog, setup.perf, setup.shape,
                                    setup.mix, setup.scenario.slo)
    expected = sum(capacity_rps_mix(setup.perf, spec, g, mix, 0.0) for g in table[table.model == whisper].gpu)
    assert per_model[whisper] == pytest.approx(expected)
