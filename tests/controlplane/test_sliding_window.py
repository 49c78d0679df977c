"""Sliding-window attention (Gemma 3): a local layer keeps and reads KV for its window only."""

import math
from dataclasses import replace

import numpy as np
import pytest
from kit.controlplane import LLAMA, make_fleet, placement

from controlplane import perf_arch
from controlplane.catalog import Catalog, CatalogError
from controlplane.perf import Roofline, capacity_rps
from controlplane.plane import ControlPlane
from controlplane.routing import QUEUE, START
from controlplane.state import Request

GEMMA = "@cf/google/gemma-3-12b-it"


@pytest.fixture(scope="module")
def roof(topo):
    return Roofline.from_topology(topo)


def all_global(spec):
    return replace(spec, sliding_window=0, global_layers=0)


def test_gemma_3_12b_has_its_configs_window(catalog):
    # google/gemma-3-12b-it config.json: sliding_window 1024, sliding_window_pattern 6 (every sixth layer global)
    spec = catalog[GEMMA]
    assert (spec.layers, spec.global_layers, spec.sliding_window) == (48, 8, 1024)
    assert spec.kv_pool_tokens == math.ceil((8 * 80_000 + 40 * 1024) / 48) == 14_187
    assert spec.replica_gb == pytest.approx(31.05, abs=0.01)  # 56.9 GB with KV for the whole context on every layer


def test_a_full_gemma_context_is_admitted_on_a_48_gb_gpu_and_charges_the_windowed_kv(catalog):
    spec = catalog[GEMMA]
    cp = ControlPlane(catalog, make_fleet([1], gpu_memory_gb=48.0), placement([(GEMMA, 0)]), np.zeros((1, 1)))
    r = cp.state.by_model[GEMMA][0]
    assert r.kv_capacity == spec.kv_pool_tokens
    req = Request(0, GEMMA, 0, 79_000, 1_000)
    assert cp.submit(req, 0.0).action == START
    # The bytes of 8 global layers over 80,000 tokens and 40 local ones over 1,024, per layer and token
    # 2 x 8 KV heads x 256 x 2 bytes; the pool counts them in whole full-layer tokens (rounded up).
    per_layer_token = 2 * spec.kv_heads * spec.head_dim * 2
    formula_bytes = (8 * 80_000 + 40 * 1024) * per_layer_token
    charged_bytes = r.kv_used * spec.kv_bytes_per_token
    assert r.kv_used == req.kv_tokens == math.ceil(formula_bytes / spec.kv_bytes_per_token)
    assert 0 <= charged_bytes - formula_bytes < spec.kv_bytes_per_token
    # The pool is full: a second full context waits, a short one (its footprint is its length) still fits.
    assert cp.submit(Request(1, GEMMA, 0, 79_000, 1_000), 0.0).action == QUEUE
    cp.finish(req, 1.0)
    assert r.kv_used == spec.kv_charge(80_000) and r.active == 1  # the queued one started in its place
    short = Request(2, GEMMA, 0, 500, 500)
    assert cp.submit(short, 1.0).action == QUEUE  # 14,187 + 1,000 is over the pool
    assert short.kv_tokens == 1_000
    # One token over the window is 3006, whatever the pool holds.
    assert cp.submit(Request(3, GEMMA, 0, 80_000, 1), 1.0).code == 3006


def test_decode_reads_local_layers_over_the_window_only(catalog, roof):
    spec = catalog[GEMMA]
    full = all_global(spec)
    for ctx in (100, 1023.5, 1024):  # within the window every layer reads the whole context
        assert roof.decode_step_ms(spec, "H100", 8, ctx) == roof.decode_step_ms(full, "H100", 8, ctx)
    for ctx in (4_096, 40_000, 80_000):
        assert roof.decode_step_ms(spec, "H100", 8, ctx) < roof.decode_step_ms(full, "H100", 8, ctx)
    sch = roof.scheme(spec, "H100")
    d = perf_arch.decode_pass(spec, sch, 8, 40_000)
    seen = (8 * 40_000 + 40 * 1024) / 48
    assert d.kv_bytes == pytest.approx(8 * (seen + 1) * spec.kv_bytes_per_token, rel=1e-12)
    assert d.attn_flops == pytest.approx(4.0 * 48 * spec.heads * spec.head_dim * seen * 8, rel=1e-12)


def test_prefill_charges_local_layers_at_most_the_window(catalog, roof):
    spec = catalog[GEMMA]
    full = all_global(spec)
    sch = roof.scheme(spec, "H100")
    hd = spec.heads * spec.head_dim
    # Within the window: the all-global count (2 L H d t^2).
    assert perf_arch.prefill_pass(spec, sch, [1000]).attn_flops == pytest.approx(
        perf_arch.prefill_pass(full, sch, [1000]).attn_flops, rel=1e-12)
    # 8,000 tokens: 8 global layers over t^2 / 2 pairs, 40 local ones over W t - W^2 / 2.
    t, w = 8000.0, 1024.0
    assert perf_arch.prefill_pass(spec, sch, [8000]).attn_flops == pytest.approx(
        4 * hd * (8 * t * t / 2 + 40 * (w * t - w * w / 2)), rel=1e-12)
    # 1,000 new tokens after 30,000 cached: local layers see 1,024 keys each; the prefix is read as its footprint.
    p = perf_arch.prefill_pass(spec, sch, [1000], prior=[30_000])
    assert p.attn_flops == pytest.approx(4 * hd * (8 * (1000 * 30_000 + 1000 ** 2 / 2) + 40 * 1000 * w), rel=1e-12)
    assert p.kv_bytes == pytest.approx((1000 + spec.kv_footprint(30_000)) * spec.kv_bytes_per_token, rel=1e-12)
    assert roof.prefill_ms(spec, "H100", 30_000) < roof.prefill_ms(full, "H100", 30_000)


def test_a_model_without_a_window_is_unchanged(catalog, roof):
    spec = catalog[LLAMA]
    assert (spec.sliding_window, spec.global_layers) == (0, 0)
    for t in (1, 1024, 5000, 7968):
        assert spec.kv_footprint(t) == spec.kv_charge(t) == t
    from controlplane.catalog import kv_footprint

    assert kv_footprint(2048.5, 32) == 2048.5
    cp = ControlPlane(catalog, make_fleet([1]), placement([(LLAMA, 0)]), np.zeros((1, 1)))
    req = Request(0, LLAMA, 0, 3000, 900)
    assert cp.submit(req, 0.0).action == START
    assert req.kv_charge == -1 and req.kv_tokens == 3900 and cp.state.by_model[LLAMA][0].kv_used == 3900
    d = perf_arch.decode_pass(spec, roof.scheme(spec, "H100"), 4, 3000.0)
    assert d.kv_bytes == 4 * 3000.0 * spec.kv_bytes_per_token + 4 * spec.kv_bytes_per_token
    # capacity_rps batches as many sequences as the pool holds: prompt + output each
    assert capacity_rps(roof, spec, "H100", 4000, 4000) == capacity_rps(roof, spec, "H100", 4000, 4000, batch=4)


def test_capacity_batches_as_many_windowed_sequences_as_the_pool_holds(catalog, roof):
    spec = catalog[GEMMA]
    per_seq = spec.kv_footprint(6000)  # (8 x 6,000 + 40 x 1,024) / 48 = 1,853.3
    batch = math.floor(spec.kv_pool_tokens / per_seq)
    assert batch == 7
    assert capacity_rps(roof, spec, "H100", 5000, 1000) == capacity_rps(roof, spec, "H100", 5000, 1000, batch=batch)


WINDOWED = """
[models."@cf/x/chat"]
task = "text-generation"
family = "gemma"
parameters = 1e9
precision = "bf16"
context_window = 8192
layers = 12
hidden = 2048
heads = 8
kv_heads = 4
intermediate = 8192
vocab = 32000
neurons_per_m_input = 1
neurons_per_m_output = 1
sliding_window = 512
global_layers = 2
kv_pool_tokens = 1792
stand_in = "gpt2-tiny"
"""


def test_a_windowed_pool_need_only_hold_the_contexts_footprint(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(WINDOWED)  # (2 x 8,192 + 10 x 512) / 12 = 1,792
    spec = Catalog.load(path)["@cf/x/chat"]
    assert spec.kv_charge(8192) == 1792 and spec.kv_footprint(100) == 100


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace("kv_pool_tokens = 1792", "kv_pool_tokens = 1791"),
     "'kv_pool_tokens': 1791 is below 1792, the full-layer KV equivalent of the context window 8192"),
    (lambda s: s.replace("global_layers = 2\n", ""), "'global_layers': missing: sliding_window needs it"),
    (lambda s: s.replace("sliding_window = 512\n", ""), "'sliding_window': missing: global_layers needs it"),
    (lambda s: s.replace("sliding_window = 512", "sliding_window = 0"), "'sliding_window': 0 must be positive"),
    (lambda s: s.replace("sliding_window = 512", "sliding_window = -4"),
     "'sliding_window': -4 is not a non-negative integer"),
    (lambda s: s.replace("global_layers = 2", "global_layers = 12"), "'global_layers': 12 must be between 1 and 11"),
    (lambda s: s.replace("global_layers = 2", "global_layers = 0"), "'global_layers': 0 must be between 1 and 11"),
    (lambda s: s.replace("global_layers = 2", "global_layers = 2.5"), "'global_layers': 2.5 is not a non-negative"),
    (lambda s: s.replace('task = "text-generation"', 'task = "text-embeddings"'),
     "'sliding_window': only text-generation models"),
])
def test_bad_window_fields_fail_in_one_line_naming_the_field(tmp_path, edit, needle):
    path = tmp_path / "mine.toml"
    path.write_text(edit(WINDOWED))
    with pytest.raises(CatalogError) as err:
        Catalog.load(path)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "mine.toml" in msg and "'@cf/x/chat'" in msg


def test_techniques_and_capacity_charge_the_window_as_replicas_do(catalog, roof):
    """Speculative verification reads the local layers' window only, a disaggregated KV transfer moves the
    prompt's footprint, and capacity_rps batches by the whole-token charge replicas reserve."""
    from sim.techniques.disagg import kv_transfer_s
    from sim.techniques.speculative import SpeculativePerf

    spec = catalog[GEMMA]
    spec_perf = SpeculativePerf(roof, 3, {"text-generation": 0.7}, 0.0)
    assert spec_perf.verify_ms(spec, "H100", 8, 70_000) < 0.5 * spec_perf.verify_ms(all_global(spec), "H100", 8, 70_000)
    assert kv_transfer_s(spec, 20_000, 100.0) == pytest.approx(
        spec.kv_footprint(20_000) * spec.kv_bytes_per_token * 8 / 100e9)
    prompt = 37_340  # two of them: 2 x 7,094 charged tokens, one over the 14,187-token pool
    assert 2 * spec.kv_charge(prompt + 100) > spec.kv_pool_tokens >= 2 * spec.kv_footprint(prompt + 100)
    assert capacity_rps(roof, spec, "H100", prompt, 100, batch=2) == capacity_rps(roof, spec, "H100", prompt, 100,
                                                                                    batch=1)
