"""Faults in a run: requests re-routed around a PoP that is down pay the access of the PoP they enter at, with
their own last mile, and their latency parts add up; faults overlapping on one target keep it down until the last
of them ends."""

from dataclasses import replace

import numpy as np
import pytest

from sim.run import run_scenario
from sim.scenario import load_scenario, with_overrides
from topology import Topology


@pytest.fixture(scope="module")
def rerouted():
    """Japan's busiest PoP down for the whole run, users' last mile by country."""
    sc = with_overrides(load_scenario("small"), last_mile="country")
    return run_scenario(sc, requests=1500, deployments=("edge",), faults=["pop:NRT@0+100000"]).requests


def test_rerouted_requests_latency_parts_add_up(rerouted):
    ok = rerouted[rerouted.outcome == "ok"]
    parts = ok.network_rtt_ms + ok.queue_ms + ok.cold_start_ms + ok.prefill_ms + ok.retry_lost_ms
    np.testing.assert_allclose(ok.ttft_ms, parts, rtol=0, atol=1e-6)
    assert not (rerouted.ingress_pop == "NRT").any()
    assert (ok.user_country == "JP").sum() > 20  # Japan's users are in the run, entering elsewhere


def test_rerouted_requests_pay_their_new_pops_access_with_their_last_mile(rerouted):
    """Served where they entered (no backbone leg), a request's network RTT is its access: the user's RTT to that
    PoP including the last mile of the user's country, for the re-routed ones as for the others."""
    topo = Topology.load(last_mile="country")
    here = rerouted[(rerouted.outcome == "ok") & (rerouted.serving_site == rerouted.ingress_pop)]
    assert (here.user_country == "JP").sum() > 10
    last_mile = topo.last_mile.ms(here.user_country.to_numpy(), here.user_continent.to_numpy())
    rtt = topo.user_pop_rtt(here.user_lat.to_numpy(), here.user_lon.to_numpy(), last_mile)
    pop = topo.pops.reset_index(drop=True).reset_index().set_index("id")["index"]
    expected = rtt[np.arange(len(here)), pop[here.ingress_pop.to_numpy()].to_numpy()]
    np.testing.assert_allclose(here.network_rtt_ms.to_numpy(), expected, rtol=0, atol=1e-3)


@pytest.mark.parametrize("second", ["pop:NRT@20+5", "node:NRT-0@20+5"])
def test_overlapping_faults_keep_the_target_down_until_the_last_ends(topo, second):
    out = run_scenario("small", topo=topo, requests=2000, deployments=("edge",),
                       faults=["pop:NRT@10+1000", second])
    f = out.requests
    later = f[f.arrival_s > 26]  # after the shorter fault's end, inside the longer one
    assert len(later) > 500
    assert not (later.ingress_pop == "NRT").any()
    assert not (later.node == "NRT-0").any()
    assert set(f.outcome) <= {"ok", "rejected", "failed"} and len(f) == 2000


def test_a_fault_after_the_run_is_skipped_not_applied(topo):
    out = run_scenario("small", topo=topo, requests=600, deployments=("edge",),
                       faults=["pop:FRA@99999+10", "pop:LHR@1+10"])
    faults = out.summary["deployments"]["edge"]["faults"]
    assert faults["applied"] == ["pop:LHR@1+10"]
    assert len(faults["skipped"]) == 1 and faults["skipped"][0].startswith("pop:FRA@99999+10: starts after the run")


def test_simulate_warns_on_stderr_of_a_fault_no_deployment_took(tmp_path, capsys):
    """A fault every simulated deployment skipped leaves a run without it: said last, on stderr, not only among
    the notes. One that a deployment took is not named."""
    from edgepop.cli import main

    assert main(["simulate", "--scenario", "small", "--requests", "200", "--fail", "node:FRA-99@1+10",
                 "--fail", "pop:LHR@1+5", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgepop: warning: fault node:FRA-99@1+10 (no node 'FRA-99' in the edge fleet; no node 'FRA-99' "
                   "in the central fleet) applied to no simulated deployment: these figures are of a run without it"]


def test_link_faults_between_ids_with_dashes(topo):
    """Region ids have dashes of their own: a link fault finds the split that names two backbone nodes, either
    way round."""
    from sim.faults import link_ends

    names = set(topo.latency.backbone.nodes.name)
    assert link_ends("aws:ap-northeast-1-aws:ap-northeast-3", names) == ("aws:ap-northeast-1", "aws:ap-northeast-3")
    assert link_ends("gcp:europe-west4-AMS", names) == ("gcp:europe-west4", "AMS")
    assert link_ends("AMS-nowhere", names) == (None, None)
    out = run_scenario("small", topo=topo, requests=400, deployments=("edge",),
                       faults=["link:gcp:europe-west4-AMS@1+10"])
    assert out.summary["deployments"]["edge"]["faults"]["applied"] == ["link:gcp:europe-west4-AMS@1+10"]


def test_node_faults_with_disaggregation_are_refused_before_any_work(topo):
    from dataclasses import replace

    from edgepop.errors import UserError

    sc = load_scenario("small")
    sc = replace(sc, techniques=replace(sc.techniques, disaggregation=True))
    with pytest.raises(UserError, match="not modelled for disaggregated pools"):
        run_scenario(sc, topo=topo, requests=200, faults=["node:FRA-0@5+30"])


def test_a_pop_down_serves_nothing_and_a_refused_retry_was_served_nowhere():
    """One PoP down: the utilisation samples count no ready slot on its failed nodes; a request lost there and
    refused on its retry has no node and no network RTT (it kept its lost attempt's)."""
    sc = load_scenario("small")
    sc = with_overrides(sc, sample_s=1.0, gpu_inventory_scale=1.0, central=None, workload={"rps": 50.0},
                        edge=replace(sc.edge, pops=["FRA"], queue_limit=4))  # (all of FRA's GPUs: the 70B fits)
    out = run_scenario(sc, requests=1500, deployments=("edge",), faults=["pop:FRA@5+5"])
    u = out.utilisation
    assert (u[(u.t_s >= 5) & (u.t_s < 10)].ready_slots == 0).all() and (u[u.t_s < 5].ready_slots > 0).all()
    f = out.requests
    refused = f[(f.outcome == "rejected") & (f.retries > 0)]
    assert len(refused) and (refused.node.fillna("") == "").all() and refused.network_rtt_ms.isna().all()


def test_misrouted_requests_around_a_pop_down_have_ttft_parts_that_add_up(topo):
    """Anycast sent some Manchester users to London; with London down, Manchester (nearer) takes them: decided
    when the trip to London would have ended, they keep that access RTT, so their parts still add up."""
    sc = with_overrides(load_scenario("small"), anycast_misroute=0.3, jitter=True)
    f = run_scenario(sc, requests=2000, deployments=("edge",), faults=["pop:LHR@0+100000"]).requests
    ok = f[f.outcome == "ok"]
    parts = ok.network_rtt_ms + ok.queue_ms + ok.cold_start_ms + ok.prefill_ms + ok.retry_lost_ms
    np.testing.assert_allclose(ok.ttft_ms, parts, rtol=0, atol=1e-6)
    assert (ok.user_country == "GB").sum() > 20


def test_a_fault_is_echoed_as_the_spec_that_reads_it_back():
    from sim.faults import fault_spec, parse_fault

    for spec in ("pop:FRA@1234567+5", "node:LHR-0@2.5+12345678", "link:NewYork-Bude@0.1+100000000000000000000"):
        assert parse_fault(fault_spec(parse_fault(spec))) == parse_fault(spec)
    assert fault_spec(parse_fault("pop:FRA@1234567+5")) == "pop:FRA@1234567+5"  # (it read 1.23457e+06)


@pytest.mark.parametrize("spec", [f"pop:FRA@1+{'9' * 400}", f"node:FRA-0@{'9' * 400}+5"])
def test_a_fault_time_too_long_for_a_float_is_refused(spec):
    """400 digits read as inf, which ``--fail`` refuses when written as ``inf``."""
    from edgepop.errors import UserError
    from sim.faults import parse_fault

    with pytest.raises(UserError, match=r"start and duration must be finite numbers of seconds$"):
        parse_fault(spec)


POP_FAULT = """seed = 11
faults = ["pop:IAD@5+10"]

[workload]
kind = "poisson"
requests = 1000
rps = 150.0
start_utc = "2024-03-20T20:00:00+00:00"
mix = { "@cf/meta/llama-3.1-8b-instruct" = 1.0 }

[edge]
placement = "greedy-demand"
router = "nearest-with-capacity"
pops = ["FRA", "LHR", "IAD", "SJC", "SIN", "NRT"]
queue_limit = 1

[central]
enabled = false
"""


def test_a_pop_fault_takes_its_nodes_down_together_so_a_request_is_retried_once(tmp_path):
    # One node after another, a request lost on IAD-0 was retried on IAD-1, lost again a moment later: 2 retries.
    f = tmp_path / "pop_fault.toml"
    f.write_text(POP_FAULT)
    out = run_scenario(str(f))
    r = out.requests
    assert out.summary["deployments"]["edge"]["faults"]["retried"] > 0
    assert r.retries.max() == 1


def test_a_request_that_never_decodes_has_no_decode_stalls(tmp_path):
    # One-token answers finish at their prefill: the stalls the replica's decoding sequences saw before are not
    # theirs (they read all of them, since the run began: e2e == ttft beside stall_ms of hundreds of ms).
    f = tmp_path / "one_token.toml"
    f.write_text(POP_FAULT.replace('faults = ["pop:IAD@5+10"]\n', "").replace("requests = 1000", "requests = 600")
                 .replace("rps = 150.0", "rps = 40.0").replace("queue_limit = 1\n", "")
                 .replace("[edge]", "[workload.tokens.text-generation]\noutput = { median = 4, sigma = 2.0 }\n\n[edge]"))
    r = run_scenario(str(f)).requests
    one = r[(r.outcome == "ok") & (r.output_tokens == 1)]
    assert len(one) > 50 and (r[r.outcome == "ok"].stall_ms > 0).any()
    assert (one.stall_ms == 0).all() and (one.stalls == 0).all()


def test_requests_timed_out_at_the_horizon_are_not_counted_as_failed_by_a_fault():
    """A request still streaming when the run ends fails with 3007 whatever the faults; only 3043 (its node
    failed under it) is a fault's failure."""
    from kit.sim import TokenClock, deployment, workload

    from controlplane.catalog import Catalog, default_catalog
    from controlplane.outcomes import Code
    from sim.metrics import fault_block
    from sim.simulator import Simulation

    spec = default_catalog()["@cf/meta/llama-3.1-8b-instruct"]
    cat, model = Catalog([spec]), spec.id
    w = workload([0.0, 0.1, 0.2], model, "text-generation", 10, output=1000)
    dep = deployment(cat, model, 1, [[0.0]])
    # 1,000 tokens at 1 s a step cannot finish within 5 s of the last arrival: every request times out mid-stream
    f = Simulation(dep, w, TokenClock(step_ms=1000.0), drain_s=5.0).run().requests
    assert (f.outcome == "failed").all() and (f.error_code == int(Code.TIMEOUT)).all()
    assert fault_block(f) == {"lost": 0, "retried": 0, "failed": 0}
    f.loc[0, "error_code"] = int(Code.INTERNAL)  # as a node fault ends a request that had streamed
    assert fault_block(f) == {"lost": 1, "retried": 0, "failed": 1}
