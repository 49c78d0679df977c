"""Engines: continuous batching equals solo runs, seeds, cancel and failure isolation, KV budget, dynamic batching."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from dataplane import registry, runtime
from dataplane.cache import cached_model
from dataplane.engine_batch import BatchConfig, BatchingEngine
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.errors import CapacityError, InvalidInputError
from dataplane.models import gpt2
from dataplane.prefix_cache import PrefixCacheConfig
from dataplane.sampling import SamplingParams, sample_token
from dataplane.service import DataPlaneConfig

# Seeded sampling rather than greedy: a synthetic LM's greedy output repeats one token, which would make
# "batched equals solo" trivially true; sampled sequences differ token by token.
SEEDED = SamplingParams(max_tokens=24, temperature=1.0, seed=11)
PROMPTS = ["Hello", "The edge PoP in Lisbon answers", "x", "Continuous batching lets sequences join and leave",
           "GPU", "tokens per second"]


@pytest.fixture(scope="module")
def engine(lm):
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def solo(engine):
    return {p: engine.generate(p, SEEDED).token_ids for p in PROMPTS}


def test_continuous_batching_equals_sequential(engine, solo):
    before = sum(engine.stats.batch_sizes.values())
    handles = [engine.submit(p, SamplingParams(max_tokens=8 + 3 * i, temperature=1.0, seed=11)) for i, p in enumerate(PROMPTS)]
    for i, (p, h) in enumerate(zip(PROMPTS, handles, strict=True)):
        res = h.result(60)
        assert res.token_ids == solo[p][: 8 + 3 * i]
        assert res.finish_reason == "length" and res.prompt_tokens == len(p.encode())
    sizes = engine.stats.batch_sizes
    assert sum(sizes.values()) > before and max(sizes) == 4  # capped by max_batch; rows joined as others left


def test_timing_counts_the_padded_length_each_decode_step_attends_over(lm):
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096))
    try:
        alone = eng.submit("The edge PoP in Lisbon answers", SamplingParams(max_tokens=9, temperature=1.0, seed=3))
        alone.result(60)
        tm, n = alone.timing, len(alone.prompt_ids)
        assert tm.steps >= 1 and tm.kv_len_sum == sum(n + 1 + i for i in range(tm.steps))
        # together, the short prompt's steps attend over the long one's padded length
        long_h = eng.submit("Continuous batching lets sequences join and leave", SamplingParams(max_tokens=12, seed=4))
        short_h = eng.submit("x", SamplingParams(max_tokens=12, seed=5))
        long_h.result(60), short_h.result(60)
        short = short_h.timing
        if short.batch_sum > short.steps:  # shared at least one step with the long prompt
            assert short.kv_len_sum > sum(len(short_h.prompt_ids) + 1 + i for i in range(short.steps))
        assert short.kv_len_sum >= sum(len(short_h.prompt_ids) + 1 + i for i in range(short.steps))
    finally:
        eng.close()


@pytest.mark.parametrize("joiner", ["Continuous batching lets sequences join and leave the batch", "x"])
def test_timing_records_what_merging_a_joiners_kv_into_the_batch_wrote(lm, joiner):
    # The batch's rows and the joiner's are left padded to the longer past, the shorter side first in a copy.
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096))
    try:
        decoding = threading.Event()
        batch = [eng.submit(p, SamplingParams(max_tokens=40, seed=i), lambda *_: decoding.set())
                 for i, p in enumerate(["Hello there", "GPU edge"])]
        assert decoding.wait(60)
        late = eng.submit(joiner, SamplingParams(max_tokens=3, seed=7))
        late.result(60)
        for h in batch:
            h.result(60)
        tm, first = late.timing, batch[0].timing
        assert first.merge_s == 0.0 and first.merge_tokens == 0  # it started the batch
        assert tm.merge_tokens > 0  # joined a running batch: it had 39 steps left when the joiner came
        longest = tm.merge_tokens // 3  # three rows at the common padded length
        assert tm.merge_tokens == 3 * longest and 0.0 < tm.merge_s <= tm.prefill_s
        if len(late.prompt_ids) > len(batch[1].prompt_ids) + 40:  # longer than the batch's past: the batch padded
            assert longest == len(late.prompt_ids) and tm.merge_pad_tokens == 2 * longest
        else:  # shorter: the joiner alone padded, to the batch's past
            assert longest > len(late.prompt_ids) and tm.merge_pad_tokens == longest
    finally:
        eng.close()


def test_leaving_rows_copy_the_others_out_once_into_contiguous_arrays(lm):
    from dataplane.padded_kv import keep_rows

    rng = np.random.default_rng(0)
    past = [rng.random((3, 2, 5, 4)).astype(np.float32) for _ in range(2)]
    mask = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    kept, kept_mask = keep_rows(past, mask, [0, 1])  # the column only the leaving row used goes
    assert kept_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    for a, k in zip(past, kept, strict=True):
        assert k.flags["C_CONTIGUOUS"] and np.array_equal(k, a[:2, :, 1:])  # no second copy by the next step
    # The engine stamps the copy on the rows that stay: once per row that left while they decoded.
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096))
    try:
        with eng._cond:  # admitted in one iteration: one leaves after 4 tokens, the other two stay for 12
            hs = [eng.submit(p, SamplingParams(max_tokens=m, seed=i))
                  for i, (p, m) in enumerate([("Hello", 4), ("GPU edge", 12), ("tokens per second", 12)])]
        for h in hs:
            h.result(60)
        first, stay = hs[0].timing, [h.timing for h in hs[1:]]
        assert first.trims == 0 and first.trim_s == 0.0
        # their past when the first left: the longer prompt and 3 decode steps (the first token came from the prefill)
        width = max(len(h.prompt_ids) for h in hs[1:]) + 3
        assert all(t.trims == 1 and 0.0 < t.trim_s <= t.decode_s and t.trim_tokens == 2 * width for t in stay)
    finally:
        eng.close()


def test_device_resident_kv_cache_gives_the_same_tokens(lm, solo):
    # The KV cache kept in the provider's memory between steps (on by default on CUDA) runs the same
    # IO-binding code on CPU, so this checks its bookkeeping here: rows join and leave, results unchanged.
    eng = LMEngine(lm, LMEngineConfig(max_batch=4, kv_budget_tokens=4096, device_kv=True))
    try:
        handles = [eng.submit(p, SamplingParams(max_tokens=8 + 3 * i, temperature=1.0, seed=11))
                   for i, p in enumerate(PROMPTS)]
        for i, (p, h) in enumerate(zip(PROMPTS, handles, strict=True)):
            assert h.result(60).token_ids == solo[p][: 8 + 3 * i]
        assert max(eng.stats.batch_sizes) == 4
    finally:
        eng.close()
    logits, past, mask = lm.prefill([[1, 2, 3]])
    ids, pos = np.array([[4]]), np.array([[3]])
    mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
    host_logits, host_present = lm.step(ids, mask, pos, past)
    dev_logits, dev_present = lm.step(ids, mask, pos, past, keep_on_device=True)
    assert isinstance(dev_present, runtime.DeviceKV)
    np.testing.assert_array_equal(dev_logits, host_logits)
    for a, b in zip(dev_present.numpy(), host_present, strict=True):
        np.testing.assert_array_equal(a, b)
    again_logits, _ = lm.step(ids, mask, pos, lm.device_past(past), keep_on_device=True)  # the profiler's path
    np.testing.assert_array_equal(again_logits, host_logits)


def test_same_seed_same_tokens_and_seeds_matter(engine):
    params = [SamplingParams(max_tokens=24, temperature=1.0, top_k=50, top_p=0.95, seed=s) for s in (7, 7, 8)]
    a, b, c = (h.result(60).token_ids for h in [engine.submit("seeded", p) for p in params])
    assert a == b and a != c
    assert engine.generate("seeded", params[0]).token_ids == a  # alone or batched, same tokens


def test_streaming_iterator_and_callback_see_every_token(engine):
    seen = []
    h = engine.submit("stream me", SamplingParams(max_tokens=20, temperature=0.8, seed=1),
                      on_token=lambda tok, text: seen.append(tok))
    pieces = list(h)
    res = h.result(60)
    assert "".join(pieces) == res.text and seen == res.token_ids and len(seen) == 20


def test_cancel_and_failure_do_not_disturb_the_batch(engine, solo):
    started = threading.Event()

    def slow_cb(tok, text):
        started.set()

    def bad_cb(tok, text, n=[0]):  # noqa: B006 - a counter local to this callback
        n[0] += 1
        if n[0] == 3:
            raise RuntimeError("client went away")

    params = SamplingParams(max_tokens=200, temperature=1.0, seed=5)
    victim = engine.submit("cancel me", params, on_token=slow_cb)
    failing = engine.submit("fail me", SEEDED, on_token=bad_cb)
    others = [engine.submit(p, SEEDED) for p in PROMPTS[:3]]
    assert started.wait(30)
    victim.cancel()
    res = victim.result(60)
    assert res.finish_reason == "cancelled" and len(res.token_ids) < 200
    with pytest.raises(RuntimeError, match="client went away"):
        failing.result(60)
    with pytest.raises(RuntimeError):
        list(failing)
    for p, h in zip(PROMPTS[:3], others, strict=True):
        assert h.result(60).token_ids == solo[p]


def test_stops_on_eos(lm, solo):
    tokens = solo["Hello"]
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    # The same file as gpt2-tiny's (built here if this session's cache does not hold it yet: a model loaded before
    # the session fixture set the cache directory lives in another one)
    path = cached_model("gpt2-tiny", lm.spec.key(), lambda: gpt2.build_graph(
        lm.spec, gpt2.random_weights(lm.spec, np.random.default_rng(lm.spec.seed))))
    model = runtime.LanguageModel("gpt2-eos", lm.spec, path)
    model.tokenizer.eos_id = tokens[k]  # pretend that token is <|endoftext|>
    eng = LMEngine(model)
    try:
        res = eng.generate("Hello", SEEDED, timeout=60)
        assert res.finish_reason == "stop" and res.token_ids == tokens[:k]
        nostop = eng.generate("Hello", SamplingParams(max_tokens=24, temperature=1.0, seed=11, stop_on_eos=False), timeout=60)
        assert nostop.token_ids == tokens
    finally:
        eng.close()


def test_kv_budget_limits_admission_and_refuses_impossible_requests(lm):
    eng = LMEngine(lm, LMEngineConfig(max_batch=8, kv_budget_tokens=100))
    try:
        with pytest.raises(CapacityError, match="KV budget"):
            eng.submit("a" * 60, SamplingParams(max_tokens=50))
        with pytest.raises(CapacityError, match="context"):
            eng.submit("a" * 600)
        handles = [eng.submit("a" * 10, SamplingParams(max_tokens=30, seed=1)) for _ in range(6)]
        assert all(h.result(60).completion_tokens == 30 for h in handles)
        assert max(eng.stats.batch_sizes) == 2  # 100 // (10 + 30): two at a time despite max_batch 8
    finally:
        eng.close()


@pytest.mark.parametrize("bad", [
    {"max_tokens": 0}, {"max_tokens": 2.5}, {"temperature": -1}, {"top_k": 0}, {"top_p": 0}, {"top_p": 1.5},
    {"seed": -3}, {"temperature": "hot"},
])
def test_bad_sampling_params_raise_typed_errors(bad):
    with pytest.raises(InvalidInputError):
        SamplingParams(**bad)


def test_bad_prompts_raise_typed_errors(engine):
    for prompt in (None, 3, [1, "a"], [-1], [10**6]):
        with pytest.raises(InvalidInputError):
            engine.submit(prompt)
    # a lone surrogate: a raw UnicodeEncodeError escaped (the task path said it in words)
    with pytest.raises(InvalidInputError, match=re.escape("prompt is not valid Unicode text (surrogates not "
                                                          "allowed at character 2)")):
        engine.submit("ab\ud800")


def test_sampling_filters_and_distribution():
    rng = np.random.default_rng(0)
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0])
    assert sample_token(logits, SamplingParams(temperature=1.0, top_k=1), rng) == 4
    assert sample_token(logits, SamplingParams(temperature=1.0, top_p=0.01), rng) == 4
    assert {sample_token(logits, SamplingParams(temperature=1.0, top_k=2), rng) for _ in range(200)} == {0, 4}
    draws = np.bincount([sample_token(logits, SamplingParams(temperature=1.0), rng) for _ in range(4000)],
                        minlength=5) / 4000
    p = np.exp(logits - logits.max())
    np.testing.assert_allclose(draws, p / p.sum(), atol=0.03)


def test_tiny_temperatures_are_greedy_and_never_sample_nan(engine, dp):
    greedy = engine.generate("Hello", SamplingParams(max_tokens=6, temperature=0, stop_on_eos=False)).token_ids
    for t in (1e-310, 5e-324, 1e-45, 9e-6):  # 1e-310 overflowed logits/temperature to inf, then NaN
        got = engine.generate("Hello", SamplingParams(max_tokens=6, temperature=t, seed=1, stop_on_eos=False))
        assert got.token_ids == greedy
    assert dp.run("gpt2-tiny", {"prompt": "Hello", "temperature": 1e-310, "max_tokens": 2})["usage"]
    rng = np.random.default_rng(0)
    huge = np.array([3e38, -3e38, 1e38], np.float32)  # at the threshold, the shifted logits stay finite
    assert {sample_token(huge, SamplingParams(temperature=1e-5), rng) for _ in range(20)} == {0}
    for broken in ([np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf]):
        with pytest.raises(ValueError, match="cannot sample from non-finite logits"):
            sample_token(np.array(broken, np.float32), SamplingParams(temperature=1.0), rng)


@pytest.mark.parametrize("make, field, value", [
    (LMEngineConfig, "max_batch", 0),  # admitted nothing: a submitted request's result never arrived
    (LMEngineConfig, "max_batch", 2.0),
    (LMEngineConfig, "kv_budget_tokens", -1),
    (LMEngineConfig, "kv_budget_tokens", True),
    (LMEngineConfig, "prefix_cache", 64),
    (LMEngineConfig, "device_kv", "yes"),
    (BatchConfig, "max_batch", 0),  # the engine thread spun on empty batches
    (BatchConfig, "max_batch", None),
    (BatchConfig, "max_wait_ms", -1),
    (BatchConfig, "max_wait_ms", float("nan")),
    (BatchConfig, "max_wait_ms", 1e300),  # overflowed Condition.wait and killed the engine thread
    (BatchConfig, "max_wait_ms", "2"),
    (DataPlaneConfig, "batch", {"max_batch": 4}),  # accepted, then the engine thread died at its first batch
    (DataPlaneConfig, "lm", {"max_batch": 4}),
    (DataPlaneConfig, "session", None),
])
def test_engine_configs_refuse_bad_fields_when_built(make, field, value):
    want = re.escape(f"{make.__name__}.{field} must be ") + f".*got {re.escape(repr(value))}$"
    with pytest.raises(ValueError, match=want):
        make(**{field: value})


def test_engine_configs_accept_their_edges(lm):
    assert BatchConfig(max_batch=1, max_wait_ms=0).max_wait_ms == 0
    assert BatchConfig(max_wait_ms=86_400_000).max_batch == 32
    cfg = LMEngineConfig(max_batch=1, kv_budget_tokens=64, prefix_cache=PrefixCacheConfig(), device_kv=False)
    eng = LMEngine(lm, cfg)
    try:
        assert len(eng.generate("hi", SamplingParams(max_tokens=3, temperature=0, stop_on_eos=False)).token_ids) == 3
    finally:
        eng.close()


def test_dynamic_batching_batches_and_isolates_failures():
    calls = []

    def run(items):
        calls.append(len(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [x * 2 for x in items]

    eng = BatchingEngine(run, BatchConfig(max_batch=8, max_wait_ms=50))
    try:
        futs = [eng.submit(x) for x in ["a", "b", "bad", "c"]]
        assert [f.result(10) for f in (futs[0], futs[1], futs[3])] == ["aa", "bb", "cc"]
        with pytest.raises(ValueError, match="bad item"):
            futs[2].result(10)
        assert calls[0] == 4  # all four went into one batch first
    finally:
        eng.close()


def test_encoder_engine_batches_concurrent_requests_with_unbatched_results():
    model = registry.load("bert-tiny-embed")
    texts = [f"request number {i} " * (1 + i % 5) for i in range(24)]
    single = [model.run([model.encode(t)])[0] for t in texts]
    eng = BatchingEngine(model.run, BatchConfig(max_batch=16, max_wait_ms=20))
    try:
        out: dict[int, np.ndarray] = {}

        def worker(i):
            out[i] = eng.submit(model.encode(texts[i])).result(30)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, ref in enumerate(single):
            np.testing.assert_allclose(out[i], ref, atol=1e-5)
        assert eng.stats.mean_batch > 2
    finally:
        eng.close()


def test_cancelled_batch_item_is_skipped():
    gate = threading.Event()
    seen = []

    def run(items):
        gate.wait(5)
        seen.extend(items)
        return items

    eng = BatchingEngine(run, BatchConfig(max_batch=1, max_wait_ms=0))
    try:
        first = eng.submit(1)
        time.sleep(0.05)
        second = eng.submit(2)
        assert second.cancel()
        gate.set()
        assert first.result(5) == 1
        eng.submit(3).result(5)
        assert seen == [1, 3]
    finally:
        eng.close()
