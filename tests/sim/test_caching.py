"""Prefix caching and LoRA adapters in the simulator: exact hit ratio, prefill skip, adapter load time, routing."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from kit.sim import TokenClock, deployment, poisson, simulate, workload

from controlplane.catalog import Catalog, default_catalog
from controlplane.deployment import Deployment
from controlplane.fleet import Fleet
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.prefix_index import PrefixIndex
from edgepop.errors import UserError
from sim.simulator import Simulation
from sim.techniques import Techniques
from sim.techniques.adapters import draw_adapters, zipf_weights
from sim.traces import MOONCAKE_EXAMPLE, prefix_reuse_ratio, read_mooncake_trace
from sim.workload import COLUMNS, generate
from sim.workload_config import WorkloadConfig

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def llama_catalog(kv_pool_tokens=32768):
    spec = replace(default_catalog()[LLAMA], context_window=10**9, kv_pool_tokens=kv_pool_tokens)
    return Catalog([spec])


def big_node_deployment(catalog, n_nodes=1, gpu_memory_gb=80.0, router="nearest-with-capacity", plane=None, **opt):
    nodes = pd.DataFrame({"node_id": [f"N{i}" for i in range(n_nodes)], "site_id": "S0", "site": 0, "gpu": "H100",
                          "gpus": 1, "gpu_memory_gb": gpu_memory_gb})
    nodes["memory_gb"], nodes["price_usd_hr"] = gpu_memory_gb, 3.0
    sites = pd.DataFrame({"site_id": ["S0"], "backbone": [0], "lat": 0.0, "lon": 0.0, "tz": "UTC", "continent": "EU"})
    f = Fleet("test", nodes, sites)
    plane = ControlPlane(catalog, f, pd.DataFrame({"model": LLAMA, "node": range(n_nodes)}), np.zeros((1, 1)),
                         router=router, router_options=opt, admission=AdmissionConfig(queue_limit=10**6,
                                                                                      queue_timeout_s=1e9),
                         **(plane or {}))
    return Deployment("edge", plane, f, ingress_col="ingress", access_col="access_rtt_ms")


def trace_workload():
    t = read_mooncake_trace(MOONCAKE_EXAMPLE)
    t = t.iloc[np.argsort(t.arrival_s.to_numpy(), kind="stable")].reset_index(drop=True)
    w = workload(t.arrival_s.to_numpy(), LLAMA, "text-generation", t.prompt_tokens.to_numpy(),
                 np.maximum(t.output_tokens.to_numpy(), 1))
    w["hash_ids"] = t.hash_ids.to_numpy()
    return w, t


def test_one_node_unbounded_cache_hits_the_trace_reuse_ratio_exactly():
    w, t = trace_workload()
    cat = llama_catalog(kv_pool_tokens=1_200_000)  # more KV than the trace's 1049 distinct blocks: nothing evicted
    sim, f, blocks = simulate(lambda **kw: big_node_deployment(cat, gpu_memory_gb=1000.0, plane=kw), w,
                              TokenClock(step_ms=2.0), Techniques(prefix_cache=True, prefix_cache_fraction=1.0))
    assert (f.outcome == "ok").all()
    summary = blocks["prefix_cache"]
    assert summary["evicted_blocks"] == 0
    expected = prefix_reuse_ratio(t.hash_ids, 512, t.prompt_tokens.to_numpy())
    assert 0.3 < expected < 0.7
    assert summary["token_hit_ratio"] == round(expected, 6)
    assert int(f.cached_tokens.sum()) / int(f.prompt_tokens.sum()) == expected
    # A cache too small for the trace evicts and hits less.
    _, _, small = simulate(lambda **kw: big_node_deployment(llama_catalog(kv_pool_tokens=8192), gpu_memory_gb=1000.0,
                                                            plane=kw),
                           w, TokenClock(step_ms=2.0), Techniques(prefix_cache=True, prefix_cache_fraction=0.5))
    st = small["prefix_cache"]
    assert st["evicted_blocks"] > 0 and st["token_hit_ratio"] < expected


def test_cached_tokens_skip_prefill():
    cat = llama_catalog()
    w = workload([0.0, 10.0, 20.0], LLAMA, "text-generation", [1500, 1800, 512], 1)
    w["hash_ids"] = [(0, 1, 2), (0, 1, 3, 4), (0,)]
    _, f, _ = simulate(lambda **kw: big_node_deployment(cat, plane=kw), w, TokenClock(), Techniques(prefix_cache=True))
    assert f.cached_tokens.tolist() == [0, 1024, 512]
    # TokenClock: prefill of n tokens takes n microseconds; a full hit still computes one token.
    assert f.prefill_ms.tolist() == pytest.approx([1.5, (1800 - 1024) / 1e3, 1 / 1e3])
    off = Simulation(big_node_deployment(cat), w, TokenClock()).run().requests
    assert off.cached_tokens.tolist() == [0, 0, 0] and off.prefill_ms.tolist() == pytest.approx([1.5, 1.8, 0.512])


@pytest.mark.parametrize("technique", ["plain", "chunked_prefill"])
def test_a_hit_needs_blocks_whose_prefill_has_ended(technique):
    # A is routed first but has the longer way to the node: B, routed 2 ms later over a short backbone, reaches it
    # first. B cannot hit A's blocks (nothing has computed them yet): it recomputes them, and A, whose prefill
    # starts after B's has ended, hits them. C reaches the node while B's prefix is still being prefilled: it
    # waits for that prefill and hits (vLLM's automatic prefix caching: only computed blocks are hits).
    ids = tuple(range(12))
    w = workload([0.0, 0.002, 0.005], LLAMA, "text-generation", 6000, 5, ingress=[0, 1, 1])
    w["hash_ids"] = [ids, ids, ids]
    tech = Techniques(prefix_cache=True, prefill_chunk_tokens=8192,  # (a prompt's blocks count once all computed)
                      **({} if technique == "plain" else {technique: True}))
    sim, f, _ = simulate(lambda **kw: deployment(llama_catalog(), LLAMA, 1, [[100.0], [0.0]], **kw), w,
                         TokenClock(step_ms=0.5), tech)
    assert (f.outcome == "ok").all()
    first_token = f.arrival_s * 1e3 + f.ttft_ms
    assert f.cached_tokens.tolist() == [6000, 0, 6000]
    assert first_token[0] > first_token[1] and first_token[2] > first_token[1]
    assert sim.dep.plane.state.prefix.stats()["hit_tokens"] == 12000


class QuadClock(TokenClock):
    """Prefill of n tokens: 1 us per token plus 1 ns per token pair (an attention-like quadratic term)."""

    def prefill_ms(self, spec, gpu, tokens):
        return tokens / 1e3 + tokens * tokens / 1e6


@pytest.mark.parametrize("chunked", [False, True])
def test_a_hit_pays_its_new_tokens_attention_to_the_cached_prefix(chunked):
    # The second request finds 1024 of its 1800 tokens cached: its 776 new tokens attend to those 1024 as well,
    # so with a quadratic prefill it costs T(1800) - T(1024), not a fresh prompt of 776 tokens, T(776).
    w = workload([0.0, 10.0], LLAMA, "text-generation", [1500, 1800], 1)
    w["hash_ids"] = [(0, 1, 2), (0, 1, 3, 4)]
    tech = Techniques(prefix_cache=True, chunked_prefill=chunked, prefill_chunk_tokens=4096)
    _, f, _ = simulate(lambda **kw: big_node_deployment(llama_catalog(), plane=kw), w, QuadClock(), tech)
    assert f.cached_tokens.tolist() == [0, 1024]
    clock = QuadClock()
    hit = clock.prefill_ms(None, None, 1800) - clock.prefill_ms(None, None, 1024)
    assert f.prefill_ms.tolist() == pytest.approx([clock.prefill_ms(None, None, 1500), hit], rel=1e-9, abs=1e-5)  # within two tokens
    assert hit > clock.prefill_ms(None, None, 776) * 1.5


def test_the_roofline_charges_a_cached_prefix_attention_and_its_first_token_decode():
    from controlplane.perf import Roofline
    from topology import Topology

    spec = default_catalog()[LLAMA]
    for engine in ("default", "lmdeploy-turbomind-0.1"):  # the second leaves the first token to a decode step
        r = Roofline.from_topology(Topology.load(), engine=engine)
        assert r.profile.first_token_decode == (engine != "default")
        fresh = r.prefill_batch_ms(spec, "H100", [1000])
        after = [r.prefill_batch_ms(spec, "H100", [1000], prior=[o]) for o in (0, 4000, 30000)]
        assert after[0] == fresh and fresh < after[1] < after[2]
        assert after[2] < r.prefill_ms(spec, "H100", 31000)  # less than prefilling the whole prompt again
    with pytest.raises(UserError, match="prior"):
        r.prefill_batch_ms(spec, "H100", [1000, 10], prior=[5])


def lora_workload(n, rate, seed, catalog):
    rng = np.random.default_rng(seed)
    w = workload(poisson(rate, n, rng), LLAMA, "text-generation", 200, 30)
    w["adapter"] = draw_adapters(w, catalog, 1.0, 0.5, rng)
    return w


def test_adapter_load_time_adds_up_exactly_for_a_single_request():
    cat = Catalog([default_catalog()[LLAMA]])
    a = cat[LLAMA].adapters[2]
    w = workload([1.0], LLAMA, "text-generation", 700, 5, access_ms=10.0)
    w["adapter"] = [a.name]
    _, frame, blocks = simulate(lambda **kw: deployment(cat, LLAMA, 1, [[20.0]], **kw), w, TokenClock(step_ms=5.0),
                                Techniques(lora=True, lora_load_gbs=3.0))
    f = frame.iloc[0]
    load_ms = a.size_bytes / 3e9 * 1e3
    assert f.adapter_load_ms == pytest.approx(load_ms, abs=1e-9)
    assert f.ttft_ms == pytest.approx(10.0 + 20.0 + load_ms + 700 / 1e3, abs=1e-6)
    assert f.queue_ms == pytest.approx(0.0, abs=1e-9)
    assert f.e2e_ms == pytest.approx(f.ttft_ms + 4 * 5.0, abs=1e-6)
    assert blocks["lora"]["adapter_loads"] == 1


def test_adapter_aware_routing_cuts_adapter_loads():
    cat = Catalog([default_catalog()[LLAMA]])
    w = lora_workload(600, 40.0, 3, cat)
    loads = {}
    for routing in (False, True):
        sim, f, blocks = simulate(lambda **kw: deployment(cat, LLAMA, 4, np.zeros((1, 4)), sites=[0, 0, 0, 0], **kw),
                                  w, TokenClock(step_ms=10.0),
                                  Techniques(lora=True, lora_slots=2, lora_routing=routing))
        assert (f.outcome == "ok").all()
        loads[routing] = blocks["lora"]["adapter_loads"]
        assert loads[routing] == sum(sim.adapter_loaded)
    assert loads[True] < loads[False] / 2, loads


def test_lora_off_by_default_and_adapter_column_optional(topo):
    cat = default_catalog()
    cfg = WorkloadConfig.from_dict({"requests": 3000, "rps": 50, "mix": {LLAMA: 1.0}, "session_fraction": 0.5,
                                    "adapter_fraction": 0.4, "adapter_zipf": 1.2})
    w1 = generate(cfg, topo, cat, np.random.default_rng(4)).requests
    w2 = generate(cfg, topo, cat, np.random.default_rng(4)).requests
    assert tuple(w1.columns) == COLUMNS + ("adapter",) and w1.adapter.tolist() == w2.adapter.tolist()
    named = w1.adapter[w1.adapter != ""]
    assert abs(len(named) / len(w1) - 0.4) < 0.06
    s = w1[w1.session_id >= 0].groupby("session_id").adapter.nunique()
    assert (s == 1).all()
    share = named.value_counts(normalize=True)
    names = [a.name for a in cat[LLAMA].adapters]
    assert share[names[0]] > share[names[-1]]
    assert zipf_weights(3, 1.0).tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    plain = generate(WorkloadConfig.from_dict({"requests": 3000, "rps": 50, "mix": {LLAMA: 1.0},
                                               "session_fraction": 0.5}), topo, cat, np.random.default_rng(4))
    assert tuple(plain.requests.columns) == COLUMNS
    pd.testing.assert_frame_equal(plain.requests, w1.drop(columns=["adapter"]))


def test_scenario_switches_and_block_size_check(topo):
    from edgepop.errors import UserError
    from sim.run import run_scenario
    from sim.scenario import load_scenario, with_overrides
    from sim.techniques import parse_techniques

    sc = with_overrides(load_scenario("small"), workload={"requests": 600, "session_fraction": 0.8,
                                                          "adapter_fraction": 0.5})
    base = run_scenario(sc, topo=topo, deployments=("edge",))
    assert "prefix_cache" not in base.summary["deployments"]["edge"] and base.requests.cached_tokens.sum() == 0
    sc.techniques = parse_techniques({"prefix_cache": True, "lora": True, "lora_slots": 2}, "t.toml [techniques]")
    sc.edge.router = "prefix-aware"
    on = run_scenario(sc, topo=topo, deployments=("edge",))
    block = on.summary["deployments"]["edge"]
    assert 0 < block["prefix_cache"]["token_hit_ratio"] < 1 and block["lora"]["adapter_loads"] > 0
    assert on.requests.cached_tokens.sum() > 0 and (on.requests.adapter != "").any()
    assert len(on.requests) == len(base.requests) and (on.requests.outcome == "ok").mean() > 0.9
    with pytest.raises(UserError, match="prefix_block_tokens"):
        sc.techniques = parse_techniques({"prefix_cache": True, "prefix_block_tokens": 256}, "t.toml [techniques]")
        run_scenario(sc, topo=topo, deployments=("edge",))
    with pytest.raises(UserError, match="lora_slots"):
        parse_techniques({"lora_slots": 1.5}, "t.toml [techniques]")
    from sim.techniques.config import check_block_tokens
    from sim.workload_config import WorkloadConfig

    with pytest.raises(UserError, match="prefix_cache needs hash_ids, and an Azure trace has none"):
        check_block_tokens(parse_techniques({"prefix_cache": True}, "t"), WorkloadConfig(kind="azure"))


@pytest.mark.parametrize("without_hash_ids", [False, True])
def test_cached_blocks_live_in_free_kv_and_never_overfill_the_pool(without_hash_ids):
    """Running KV plus unpinned cached blocks fit the pool at every admission, also when some requests carry no
    hash_ids (they reserve KV too: the cached blocks they leave no room for are evicted)."""
    w, t = trace_workload()
    if without_hash_ids:  # every other request without prefix blocks (a trace's rows may lack them)
        w["hash_ids"] = [() if i % 2 else h for i, h in enumerate(w.hash_ids)]
        t = t.assign(hash_ids=list(w.hash_ids))
    caches = PrefixIndex(block_tokens=512)
    dep = big_node_deployment(llama_catalog(kv_pool_tokens=60_000), gpu_memory_gb=1000.0, plane={"prefix": caches})
    sim = Simulation(dep, w, TokenClock(step_ms=2.0))
    assert caches.fraction == 1.0
    seen = {"admit": 0, "release": 0, "full": 0}

    def check(name, method):  # observe every pin/unpin: running KV plus unpinned cached blocks fit the pool
        def observed(replica, hash_ids, *args):
            out = method(replica, hash_ids, *args)
            leaving = args[0] if name == "release" and args else 0
            used = replica.kv_used - leaving + caches.of(replica).unpinned_tokens
            assert used <= replica.kv_capacity, (name, used, replica.kv_capacity)
            seen[name] += 1
            seen["full"] += used > replica.kv_capacity - 512
            return out
        return observed

    caches.admit, caches.release = check("admit", caches.admit), check("release", caches.release)
    f = sim.run().requests
    hashed = sum(1 for h in w.hash_ids if len(h))  # (a request without blocks has none to unpin)
    assert (f.outcome == "ok").all() and seen["admit"] == len(f) and seen["release"] == hashed
    st = caches.stats()
    c = caches.caches[0]
    assert st["evicted_blocks"] > 0 and seen["full"] > 0 and not c.refs and not sim.plane._pins
    looked_up = t[[len(h) > 0 for h in t.hash_ids]]  # (the hit ratio is over the prompts that were looked up)
    expected = prefix_reuse_ratio(looked_up.hash_ids, 512, looked_up.prompt_tokens.to_numpy())
    assert 0 < st["token_hit_ratio"] < expected
    # The old reserved share (a cap of half the pool) holds fewer blocks and hits less.
    _, _, capped = simulate(lambda **kw: big_node_deployment(llama_catalog(kv_pool_tokens=60_000),
                                                             gpu_memory_gb=1000.0, plane=kw),
                            w, TokenClock(step_ms=2.0), Techniques(prefix_cache=True, prefix_cache_fraction=0.5))
    assert capped["prefix_cache"]["token_hit_ratio"] < st["token_hit_ratio"]


def test_a_trace_override_that_breaks_the_prefix_blocks_names_the_scenario_and_the_trace(topo, tmp_path):
    from sim.run import run_scenario
    from sim.scenario import load_scenario

    path = tmp_path / "pc.toml"
    path.write_text('[workload]\nrequests = 10\nrps = 1.0\n[techniques]\nprefix_cache = true\n')
    azure = "sim/data/azure_llm_conv_2023.csv"
    with pytest.raises(UserError, match=rf"^pc\.toml \[techniques\] with the azure trace {azure}: prefix_cache needs "
                                        "hash_ids") as info:
        run_scenario(load_scenario(path), topo=topo, trace=azure)
    assert "\n" not in str(info.value)
    path.write_text('[workload]\nrequests = 10\nrps = 1.0\nblock_tokens = 256\n[techniques]\nprefix_cache = true\n'
                    'prefix_block_tokens = 256\n')
    with pytest.raises(UserError, match=rf"^pc\.toml \[techniques\] with the mooncake trace {MOONCAKE_EXAMPLE}: "
                                        "prefix_block_tokens = 256 but the workload's hash_ids use 512-token"):
        run_scenario(load_scenario(path), topo=topo, trace=str(MOONCAKE_EXAMPLE))
