"""The router-side prefix index (chained matching, pinning, LRU in the free KV space) owned by the control plane,
the prefix-aware gate, LoRA catalog declarations and adapter slots."""

from dataclasses import replace

import numpy as np
import pytest
from kit.controlplane import LLAMA, line_rtt, make_fleet, placement

from controlplane.adapter_index import AdapterIndex, AdapterSlots
from controlplane.catalog import Catalog, CatalogError, attention_lora_bytes, default_catalog
from controlplane.plane import AdmissionConfig, ControlPlane
from controlplane.prefix_index import PrefixIndex, ReplicaPrefixIndex
from controlplane.routing import START
from controlplane.state import Request
from edgepop.errors import UserError


def test_chained_match_stops_at_the_first_missing_block():
    c = ReplicaPrefixIndex(block_tokens=4, block_bytes=1.0, capacity_bytes=None)
    assert c.admit((1, 2, 3), 11) == 0
    assert c.match((1, 2, 9, 3), 16) == 8  # block 9 is missing: block 3 after it cannot be reused
    assert c.match((1, 2, 3), 10) == 10  # the partial last block counts its remainder only
    assert c.match((7, 1, 2), 12) == 0


def test_blocks_being_computed_are_pinned_but_no_hit_until_their_prefill_ends():
    c = ReplicaPrefixIndex(block_tokens=4, block_bytes=1.0, capacity_bytes=None, track=True)
    assert c.admit((1, 2), 8) == 0  # A: routed, its prefill not run yet
    assert c.admit((1, 2, 3), 12) == 0 and c.match((1, 2), 8, computed_only=False) == 8  # routers still see them
    c.fit(0)  # no free KV: in-use blocks stay
    assert c.refs == {1: 2, 2: 2, 3: 1} and c.computing == {1, 2, 3}
    c.computed((1, 2))  # A's prefill ended
    assert c.match((1, 2, 3), 12) == 8 and c.admit((1, 9), 8) == 4
    c.release((1, 2, 3))  # the second request left before its prefill: block 3 was never computed
    assert 3 not in c and c.match((1, 2, 3), 12) == 8 and c.computing == {9}


def test_lru_eviction_respects_the_byte_budget_and_evicts_leaves_first():
    c = ReplicaPrefixIndex(block_tokens=16, block_bytes=100.0, capacity_bytes=450.0)  # cap: 4 blocks
    assert c.capacity_blocks == 4
    rng = np.random.default_rng(5)
    for _ in range(300):
        ids = tuple(rng.integers(0, 40, rng.integers(1, 7)).tolist())
        c.admit(ids, 16 * len(ids))
        assert set(ids) <= set(c.refs) and len(c.blocks) <= max(0, 4 - len(c.refs))  # running blocks are kept
        c.release(ids)
        assert c.used_bytes <= 450.0 and len(c) <= 4 and not c.refs
    assert c.evictions > 0
    c.clear()
    for ids in ((1, 2, 3), (8, 9)):  # (8, 9) needs room for 2 blocks: the least recent is the leaf 3, not head 1
        c.admit(ids, 16 * len(ids))
        c.release(ids)
    assert list(c.blocks) == [2, 1, 9, 8] and c.match((1, 2, 3), 48) == 32
    c.admit((5,), 16)
    assert c.match((1, 2, 3), 48) == 16 and len(c) == 4
    c.release((5,))
    assert list(c.blocks) == [1, 9, 8, 5]


def test_pinned_blocks_are_shared_and_unpinned_ones_fit_the_free_space():
    c = ReplicaPrefixIndex(block_tokens=16, block_bytes=100.0, capacity_bytes=None)
    c.admit((1, 2, 3), 48, free_tokens=1000)
    c.admit((1, 2, 7), 48, free_tokens=1000)  # shares 1 and 2 with the running request
    assert c.refs == {1: 2, 2: 2, 3: 1, 7: 1} and not c.blocks
    c.release((1, 2, 3), free_tokens=0)  # no free space: 3 is evicted, 1 and 2 are still in use
    assert c.refs == {1: 1, 2: 1, 7: 1} and not c.blocks and c.evictions == 1
    c.release((1, 2, 7), free_tokens=40)  # room for 2 blocks of 16: the leaf 7 goes
    assert list(c.blocks) == [2, 1] and c.evictions == 2 and c.match((1, 2, 7), 48) == 32


def llama_plane(catalog, kv_pool_tokens):
    """One Llama replica whose control plane keeps a prefix index (fraction 1.0: all the pool's free space)."""
    cat = Catalog([replace(catalog[LLAMA], kv_pool_tokens=kv_pool_tokens)])
    return ControlPlane(cat, make_fleet([1]), placement([(LLAMA, 0)]), line_rtt(1, 1),
                        prefix=PrefixIndex(block_tokens=512))


def test_running_requests_kv_pressure_evicts_cached_blocks(catalog):
    p = llama_plane(catalog, 8192)
    r = p.state.replicas[0]
    c = p.state.prefix.of(r)
    assert r.kv_capacity == 8192 and c.capacity_blocks is None

    def run(i, hash_ids, prompt, output):
        req = Request(i, LLAMA, 0, prompt, output, hash_ids=hash_ids)
        assert p.submit(req, float(i)).action == START  # the plane pins its blocks as it starts
        assert r.kv_used + c.unpinned_tokens <= r.kv_capacity  # cached blocks never overfill the pool
        return req, req.cached_tokens

    def end(req):
        p.finish(req, 9.0)  # ... and unpins them as it finishes
        assert r.kv_used + c.unpinned_tokens <= r.kv_capacity

    a, _ = run(0, (1, 2, 3, 4), 2048, 0)
    end(a)
    assert r.kv_used == 0 and c.unpinned_tokens == 2048 and c.evictions == 0  # cached in the free space
    b, hit = run(1, tuple(range(100, 114)), 7000, 168)  # needs all but 1024 tokens: 2 blocks go, leaves first
    assert hit == 0 and c.evictions == 2 and c.match((1, 2, 3, 4), 2048) == 1024
    end(b)
    assert c.evictions == 2 and c.unpinned_tokens == 16 * 512  # its 14 blocks and 1, 2 fill the pool exactly
    # A hit needs no new KV space: the cached blocks become the running request's own.
    q = llama_plane(catalog, 8192)
    p, r = q, q.state.replicas[0]
    c = p.state.prefix.of(r)
    end(run(0, (1, 2, 3, 4), 2048, 0)[0])
    b, hit = run(1, (1, 2, 3, 4) + tuple(range(100, 110)), 7000, 168)
    assert hit == 2048 and c.evictions == 0 and set(c.refs) >= {1, 2, 3, 4}


def test_budget_comes_from_the_replica_kv_pool(catalog):
    spec = catalog[LLAMA]
    p = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), line_rtt(1, 1))
    caches = PrefixIndex(block_tokens=512, fraction=0.5)
    c = caches.of(p.state.replicas[0])
    assert c.block_bytes == spec.kv_bytes_per_token * 512
    assert c.capacity_blocks == int(0.5 * spec.kv_pool_tokens * spec.kv_bytes_per_token // c.block_bytes)
    with pytest.raises(UserError, match="fraction"):
        PrefixIndex(fraction=1.5)


def _plane(catalog, router, n=4, prefix=None, **opt):
    table = placement([(LLAMA, i) for i in range(n)])
    rtt = np.zeros((1, n))  # every replica equally near: only the cache and the gate decide
    return ControlPlane(catalog, make_fleet([1] * n), table, rtt, router=router, router_options=opt,
                        admission=AdmissionConfig(queue_limit=64), rng=np.random.default_rng(0), prefix=prefix)


def test_prefix_aware_follows_the_cache_until_the_gate_spreads_load(catalog):
    p = _plane(catalog, "prefix-aware", prefix=PrefixIndex(block_tokens=512, fraction=0.5), max_imbalance=0.25)
    shared = (0, 1)
    p.state.prefix.admit(p.state.replicas[2], shared, 600)  # replica 2 holds the popular prefix
    placed = []
    for i in range(60):
        req = Request(i, LLAMA, 0, 600, 16, hash_ids=shared)
        d = p.submit(req, 0.0)
        assert d.action == START
        placed.append(d.replica.id)
    slots = p.state.replicas[2].slots
    # The first requests all follow the prefix; once replica 2 is max_imbalance x slots ahead, the rest spread.
    assert placed[: int(0.25 * slots) + 1] == [2] * (int(0.25 * slots) + 1)
    loads = [r.load for r in p.state.replicas]
    assert max(loads) - min(loads) <= 0.25 + 1.0 / slots
    assert p.router.counts["gated"] > 0 and len(set(placed)) > 1
    # Without the gate (a huge threshold) everything piles onto replica 2: the gate is what spreads load.
    q = _plane(catalog, "prefix-aware", prefix=PrefixIndex(block_tokens=512, fraction=0.5), max_imbalance=1e9)
    q.state.prefix.admit(q.state.replicas[2], shared, 600)
    assert {q.submit(Request(i, LLAMA, 0, 600, 16, hash_ids=shared), 0.0).replica.id for i in range(60)} == {2}


def test_prefix_aware_keeps_a_session_where_its_last_turn_ran(catalog):
    p = _plane(catalog, "prefix-aware")
    p.state.replicas[0]._start(Request(-1, LLAMA, 0, 10, 10), 0.0)  # make replica 0 not the obvious choice
    first = p.submit(Request(0, LLAMA, 0, 100, 10, session=7), 0.0).replica
    for i in range(1, 5):
        assert p.submit(Request(i, LLAMA, 0, 100, 10, session=7), 0.0).replica is first


def _catalog_with(tmp_path, adapters_toml: str) -> Catalog:
    base = (tmp_path / "c.toml")
    base.write_text(f'''[models."@cf/meta/llama-3.1-8b-instruct"]
task = "text-generation"
family = "llama"
parameters = 8.03e9
precision = "bf16"
context_window = 7968
layers = 32
hidden = 4096
heads = 32
kv_heads = 8
intermediate = 14336
vocab = 128256
neurons_per_m_input = 1
neurons_per_m_output = 1
kv_pool_tokens = 32768
stand_in = "gpt2-small"
{adapters_toml}''')
    return Catalog.load(base)


def test_catalog_adapters_parse_and_validate(tmp_path):
    spec = default_catalog()[LLAMA]
    assert len(spec.adapters) >= 4 and all(a.base == LLAMA and a.rank <= 32 for a in spec.adapters)
    assert all(0 < a.size_bytes <= 300e6 for a in spec.adapters)
    # default size: q, k, v, o projections, A and B, fp16: rank 16 on Llama 8B is 16 x 26624 x 32 x 2 bytes
    assert attention_lora_bytes(16, 32, 4096, 8, 128) == 16 * 26624 * 32 * 2
    ok = _catalog_with(tmp_path, '[[models."@cf/meta/llama-3.1-8b-instruct".adapters]]\nname = "a"\nrank = 8\n')
    assert ok[LLAMA].adapters[0].name == "a"
    for bad, msg in [('name = "a"\nrank = 64\n', "rank"), ('name = "a"\nrank = 8\nsize_mb = 301\n', "300 MB"),
                     ('rank = 8\n', "name"), ('name = "a"\nrank = 8\nalpha = 2\n', "alpha")]:
        with pytest.raises(CatalogError) as exc:
            _catalog_with(tmp_path, '[[models."@cf/meta/llama-3.1-8b-instruct".adapters]]\n' + bad)
        assert msg in str(exc.value) and "c.toml" in str(exc.value) and "\n" not in str(exc.value)


def test_adapter_slots_lru_never_evicts_one_in_use():
    s = AdapterSlots(2)
    assert s.acquire("a", 0.0, 1.0) == (1.0, True)
    assert s.acquire("a", 0.5, 1.0) == (1.0, False)  # still loading: wait for the copy under way
    s.acquire("b", 2.0, 1.0)
    s.release("b")
    s.acquire("c", 3.0, 1.0)  # a is in use (two holders), so b goes
    assert set(s.entries) == {"a", "c"} and s.loads == 3
    assert s.acquire("d", 4.0, 1.0) is None and len(s.entries) == 2  # all in use: d waits for a release
    assert s.release("c") and s.acquire("d", 5.0, 1.0) == (6.0, True) and set(s.entries) == {"a", "d"}


def test_adapter_index_load_time_is_size_over_bandwidth(catalog):
    p = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), line_rtt(1, 1))
    r = p.state.replicas[0]
    a = r.spec.adapters[0]
    idx = AdapterIndex(slots=2, load_gbs=4.0)
    wait, loaded = idx.acquire(r, a.name, 10.0)
    assert loaded and wait == pytest.approx(a.size_bytes / 4e9)
    with pytest.raises(UserError, match="no LoRA adapter"):
        idx.acquire(r, "nope", 0.0)
    assert replace(r.spec, adapters=()).adapters == ()


def test_a_request_waiting_for_an_adapter_slot_never_joins_before_it_reaches_its_node(catalog):
    """It is registered when it is decided (reaching the node at ``t``); a slot that frees before ``t`` loads its
    adapter from ``t`` on, not from the release (it joined its batch before it got there: negative waits)."""
    p = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), line_rtt(1, 1))
    r = p.state.replicas[0]
    a, b = (x.name for x in r.spec.adapters[:2])
    idx = AdapterIndex(slots=1, load_gbs=4.0)
    first, second = Request(1, LLAMA, 0, 10, adapter=a), Request(2, LLAMA, 0, 10, adapter=b)
    first.replica = second.replica = r
    assert idx.take(r, first, 0.0) is not None
    assert idx.take(r, second, 10.0) is None  # one slot, in use: it waits (it reaches the node at 10 s)
    [(req, ready, loaded)] = idx.give_back(first, 5.0)  # the slot frees at 5 s
    load = idx.load_s(idx.adapter(r, b))
    assert req is second and loaded and ready == pytest.approx(10.0 + load)
