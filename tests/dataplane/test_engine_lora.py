"""Per-request LoRA adapters in the continuous-batching LM engine: mixed rows, prefix cache namespaced per adapter."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from dataplane import lora
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.errors import InvalidInputError
from dataplane.models import gpt2
from dataplane.models.gpt2_ref import forward_numpy
from dataplane.prefix_cache import PrefixCacheConfig, block_hashes
from dataplane.runtime import LanguageModel
from dataplane.sampling import SamplingParams
from dataplane.session import SessionConfig

SPEC = gpt2.PRESETS["tiny"]
GREEDY = SamplingParams(max_tokens=5, temperature=0, stop_on_eos=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    w = gpt2.random_weights(SPEC, np.random.default_rng(5))
    path = tmp_path_factory.mktemp("eng-lora") / "base.onnx"
    onnx.save(gpt2.build_graph(SPEC, w), str(path))
    model = lora.LoraLanguageModel("gpt2-tiny-eng", SPEC, path, SessionConfig(provider="cpu"))
    ads = [lora.random_adapter(SPEC, 8, 16.0, np.random.default_rng(s), std=0.05) for s in (31, 32)]
    eng = LMEngine(model, LMEngineConfig(max_batch=8, prefix_cache=PrefixCacheConfig(16, 16 << 20)))
    yield w, path, eng, ads
    eng.close()


def _greedy(w, ids: list[int], adapter, n: int) -> list[int]:
    out: list[int] = []
    deltas = adapter.deltas() if adapter is not None else None
    for _ in range(n):
        out.append(int(np.argmax(forward_numpy(SPEC, w, np.array([ids + out]), deltas)[0])))
    return out


def test_mixed_adapters_in_one_batch_match_numpy_reference(setup):
    w, _, eng, ads = setup
    rng = np.random.default_rng(8)
    prompts = [list(map(int, rng.integers(0, SPEC.vocab_size, n))) for n in (5, 9, 7, 12)]
    rows = [ads[0], None, ads[1], ads[0]]
    before = sum(c for b, c in eng.stats.batch_sizes.items() if b > 1)
    handles = [eng.submit(p, GREEDY, adapter=a) for p, a in zip(prompts, rows, strict=True)]
    got = [h.result(30).token_ids for h in handles]
    for p, a, g in zip(prompts, rows, got, strict=True):
        assert g == _greedy(w, p, a, 5)
    assert sum(c for b, c in eng.stats.batch_sizes.items() if b > 1) > before  # rows really shared steps
    assert got[0] != _greedy(w, prompts[0], None, 5)  # the adapter changes the tokens


def test_prefix_cache_is_namespaced_per_adapter(setup):
    w, _, eng, ads = setup
    prompt = list(map(int, np.random.default_rng(9).integers(0, SPEC.vocab_size, 40)))
    order = [ads[0], ads[1], None, ads[0], None]
    cached = []
    for a in order:
        res = eng.submit(prompt, GREEDY, adapter=a).result(30)
        assert res.token_ids == _greedy(w, prompt, a, 5)
        cached.append(res.cached_tokens)
    assert cached == [0, 0, 0, 32, 32]
    salts = {lora.adapter_salt(a) for a in (*ads, None)}
    assert len(salts) == 3 and block_hashes(prompt, 16, salts.pop()) != block_hashes(prompt, 16, salts.pop())


def test_adapter_needs_a_lora_model(setup):
    _, path, _, ads = setup
    eng = LMEngine(LanguageModel("gpt2-tiny-plain", SPEC, path, SessionConfig(provider="cpu")))
    try:
        with pytest.raises(InvalidInputError, match="LoRA"):
            eng.submit([1, 2, 3], GREEDY, adapter=ads[0])
    finally:
        eng.close()


def test_lora_models_keep_their_cache_on_the_host(setup):
    # Adapter inputs go with every call, so a LoRA model's KV stays in host memory: asked to keep it on the
    # device (as a base model's engine does on CUDA), it answers with host arrays, and takes a device past back.
    _, _, eng, _ = setup
    model = eng.model
    logits, past, mask = model.prefill([[1, 2, 3]])
    mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
    ids, pos = np.array([[4]]), np.array([[3]])
    host_logits, host_present = model.step(ids, mask, pos, past)
    kept_logits, kept_present = model.step(ids, mask, pos, model.device_past(past), keep_on_device=True)
    assert isinstance(kept_present, list)
    np.testing.assert_array_equal(kept_logits, host_logits)
    forced = LMEngine(model, LMEngineConfig(device_kv=True))
    try:
        assert forced._device_kv is False  # the engine does not ask a LoRA model for a device cache
    finally:
        forced.close()
