"""Prefix KV reuse: exact greedy outputs with and without the cache, block keys, LRU under the byte budget."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.prefix_cache import PrefixCache, PrefixCacheConfig, block_hashes
from dataplane.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, stop_on_eos=False)


def _prompts(seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 256, 100).tolist()
    other = rng.integers(0, 256, 70).tolist()
    return [shared + rng.integers(0, 256, n).tolist() for n in (5, 17, 40)] + [other, shared[:50] + other]


@pytest.fixture(scope="module")
def engines(lm):
    plain = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096))
    cached = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096,
                                         prefix_cache=PrefixCacheConfig(block_size=16, max_bytes=32 << 20)))
    yield plain, cached
    plain.close()
    cached.close()


def test_cached_prefix_gives_identical_greedy_outputs(engines):
    plain, cached = engines
    prompts = _prompts()
    want = [plain.generate(p, GREEDY, timeout=60).token_ids for p in prompts]
    got = [cached.generate(p, GREEDY, timeout=60) for p in prompts]
    assert [r.token_ids for r in got] == want
    # the 2nd and 3rd prompts share 100 tokens = 6 full blocks with the first; the last shares 3 blocks
    assert [r.cached_tokens for r in got] == [0, 96, 96, 0, 48]
    # concurrent requests mixing hits and misses in one admission also match
    handles = [cached.submit(p, GREEDY) for p in prompts]
    assert [h.result(60).token_ids for h in handles] == want
    assert all(h.result().cached_tokens > 0 for h in handles)
    assert cached.prefix_cache.stats.hits >= 7


def test_block_hashes_are_chained_prefix_keys():
    a, b = block_hashes([1, 2, 3, 4, 5], 2), block_hashes([9, 2, 3, 4], 2)
    assert len(a) == 2 and len(b) == 2
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix: different key
    assert block_hashes([1, 2, 3, 4], 2) == a


def test_lru_respects_byte_budget_and_leaves_one_token():
    kv = [np.ones((2, 8, 4), np.float32)]  # one layer: 2 heads x 8 tokens x 4 dims
    block_bytes = 2 * 2 * 4 * 4
    cache = PrefixCache(PrefixCacheConfig(block_size=2, max_bytes=3 * block_bytes))
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8], kv) == 3  # the deepest block does not fit: never stored
    assert len(cache) == 3 and cache.nbytes == 3 * block_bytes
    assert (cache.stats.inserted_blocks, cache.stats.evicted_blocks) == (3, 0)
    n, got = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert n == 6 and got[0].shape == (1, 2, 6, 4)
    assert cache.lookup([1, 2, 3])[0] == 2  # at least one token is left to prefill
    assert cache.lookup([1, 2])[0] == 0
    assert cache.lookup([7, 2, 3, 4])[0] == 0
    cache.insert([9, 9, 9, 9], kv)  # two new blocks evict the two least recently used
    assert len(cache) == 3 and cache.lookup([1, 2, 3, 4, 5])[0] == 2
    assert cache.stats.evicted_blocks == 2


def test_insert_never_holds_more_than_the_budget():
    # 4 layers x [4 heads, 1000 tokens, 64 dims] float32: 100 blocks of 40 KiB against a 5-block budget
    kv = [np.ones((4, 1000, 64), np.float32) for _ in range(4)]
    block_bytes = 4 * 4 * 10 * 64 * 4
    cache = PrefixCache(PrefixCacheConfig(block_size=10, max_bytes=5 * block_bytes))
    cache.insert(list(range(1000, 1050)), kv)  # 5 blocks of another prompt, to be evicted for the new one
    tracemalloc.start()
    try:
        assert cache.insert(list(range(1000)), kv) == 5
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 5 * block_bytes  # the kept blocks plus bookkeeping; copying all 100 blocks took 4 MB
    assert len(cache) == 5 and cache.nbytes == 5 * block_bytes
    assert (cache.stats.inserted_blocks, cache.stats.evicted_blocks) == (10, 5)
    assert cache.lookup(list(range(1000)))[0] == 50
    assert PrefixCache(PrefixCacheConfig(block_size=10, max_bytes=block_bytes - 1)).insert(list(range(10)), kv) == 0


def test_a_long_prompt_keeps_only_its_leading_blocks_within_the_budget(lm):
    eng = LMEngine(lm, LMEngineConfig(prefix_cache=PrefixCacheConfig(block_size=16, max_bytes=1 << 20)))
    try:
        prompt = np.random.default_rng(5).integers(0, 256, 500).tolist()
        want = eng.generate(prompt, GREEDY, timeout=60)
        pc = eng.prefix_cache
        assert 0 < len(pc) < 500 // 16 and pc.nbytes <= 1 << 20
        assert (pc.stats.inserted_blocks, pc.stats.evicted_blocks) == (len(pc), 0)
        again = eng.generate(prompt, GREEDY, timeout=60)
        assert again.cached_tokens == 16 * len(pc) and again.token_ids == want.token_ids
    finally:
        eng.close()
