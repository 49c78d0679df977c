"""``least-ttft``: the earliest predicted first token, counting the prefills the router has sent each replica."""

import numpy as np
import pytest
from kit.controlplane import LLAMA, make_fleet, placement

from controlplane.perf import Roofline, gpu_table
from controlplane.plane import ControlPlane
from controlplane.state import Request
from topology import load_gpus


def plane(catalog, rtt_row, sites=None, **options):
    n = len(sites) if sites is not None else len(rtt_row)
    fleet = make_fleet([1] * n, sites=sites)
    return ControlPlane(catalog, fleet, placement([(LLAMA, i) for i in range(n)]), np.array([rtt_row], dtype=float),
                        router="least-ttft", router_options=options, perf=Roofline(gpu_table(load_gpus())))


def test_a_long_prompt_goes_to_the_farther_replica_when_the_near_one_is_still_prefilling(catalog):
    cp = plane(catalog, [0.0, 30.0])
    near, far = cp.state.replicas
    prefill = near.est_prefill_a + near.est_prefill_b * 6000
    assert prefill > 60.0  # a 6,000-token prompt keeps the replica busy for longer than the detour costs
    assert cp.submit(Request(0, LLAMA, 0, 6000, 10), 0.0).replica is near  # idle: the nearest
    # 10 ms later the first prompt is still prefilling: the next one is better off 30 ms away
    d = cp.submit(Request(1, LLAMA, 0, 6000, 10), 0.010)
    assert d.replica is far and d.rtt_ms == 30.0
    # once the near replica's prefills are done, it is the nearest again (both are idle of prefills)
    assert cp.submit(Request(2, LLAMA, 0, 100, 10), 10.0).replica is near


def test_a_router_that_underestimates_prefill_leaves_the_prompt_to_wait(catalog):
    # believing prefill 1,000x faster than it is, the router sees the near replica's backlog gone at once
    cp = plane(catalog, [0.0, 30.0], prefill_estimate_scale=0.001)
    near, _ = cp.state.replicas
    assert cp.submit(Request(0, LLAMA, 0, 6000, 10), 0.0).replica is near
    assert cp.submit(Request(1, LLAMA, 0, 6000, 10), 0.010).replica is near


def test_short_prompts_stay_near_and_a_site_spreads_them_by_expected_work(catalog):
    # two replicas at one site (same RTT), one farther away
    cp = plane(catalog, [5.0, 40.0], sites=[0, 0, 1])
    a, b, far = cp.state.replicas
    picks = [cp.submit(Request(i, LLAMA, 0, 50, 10), i * 1.0).replica for i in range(6)]
    assert far not in picks  # 35 ms more RTT is never worth a short prompt's prefill
    assert {a, b} == set(picks)  # both of the site's replicas take work, not the first one only
    assert abs(a.active - b.active) <= 1


def test_window_zero_takes_the_earliest_first_token_only(catalog):
    cp = plane(catalog, [5.0, 5.0], window_ms=0.0)
    assert cp.router.window_ms == 0.0
    first = cp.submit(Request(0, LLAMA, 0, 2000, 10), 0.0).replica
    # the other replica has no backlog: the next prompt goes there even though the work is equal otherwise
    assert cp.submit(Request(1, LLAMA, 0, 2000, 10), 0.0).replica is not first


def test_full_replicas_fall_back_to_nearest_with_capacity(catalog):
    cp = plane(catalog, [0.0, 10.0])
    for r in cp.state.replicas:
        r.active = r.slots  # (no slot anywhere)
        r.stats.free = 0
    d = cp.router.route(Request(0, LLAMA, 0, 100, 10), 0.0)
    assert d.action == "queue" and d.replica is cp.state.replicas[0]


@pytest.mark.parametrize(("bad", "words"), [(-1.0, "window_ms must be in"), (1001.0, "window_ms must be in"),
                                             (float("nan"), "'window_ms' must be a number"),
                                             ("5", "'window_ms' must be a number")])
def test_bad_window_is_refused(catalog, bad, words):
    from edgepop.errors import UserError

    with pytest.raises(UserError, match=f"least-ttft.*{words}"):
        plane(catalog, [0.0], window_ms=bad)
    with pytest.raises(UserError, match="prefill_estimate_scale must be in"):
        plane(catalog, [0.0], prefill_estimate_scale=0.0)


def test_the_scan_bound_only_skips_replicas_that_could_not_win(monkeypatch):
    # The scan stops once RTT + the least prefill of any replica is past the window: the same decisions as a scan
    # that stops on the RTT alone, on a whole run of the small scenario routed by least-ttft on both sides.
    from dataclasses import replace

    from controlplane.routing.least_ttft import LeastTTFT
    from sim.run import run_scenario
    from sim.scenario import load_scenario

    sc = load_scenario("small")
    sc = replace(sc, edge=replace(sc.edge, router="least-ttft"), central=replace(sc.central, router="least-ttft"))
    bounded = run_scenario(sc, requests=2000).requests
    monkeypatch.setattr(LeastTTFT, "_least_prefill", lambda self, model, tokens: 0.0)
    loose = run_scenario(sc, requests=2000).requests
    assert bounded.equals(loose)
    assert (bounded.node != "").all()  # (every request served somewhere: the comparison covers real decisions)
