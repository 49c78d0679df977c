"""Invariants of the roofline service-time model, its calibration, the measured profile and ``edgepop estimate``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from controlplane import perf_arch, perf_calibration
from controlplane.catalog import default_catalog
from controlplane.perf import Roofline, capacity_rps, capacity_rps_mix, clip_mix, prompt_units, with_precision
from controlplane.perf_params import PARAMS_FILE, RooflineParams
from controlplane.perf_profile import ExtrapolationWarning, MeasuredProfile
from edgepop.cli import main as edgepop_main
from edgepop.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
L8 = "@cf/meta/llama-3.1-8b-instruct"
L70 = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"


@pytest.fixture(scope="module")
def model(topo):
    return Roofline.from_topology(topo)


@pytest.fixture(scope="module")
def cat():
    return default_catalog()


# ---------------------------------------------------------------- physics invariants
@pytest.mark.parametrize("mid", [L8, L70, "@cf/mistral/mistral-7b-instruct-v0.1", "@cf/baai/bge-m3"])
@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "L4", "T4"])
def test_more_prompt_tokens_never_faster(model, cat, mid, gpu):
    times = [model.prefill_ms(cat[mid], gpu, t) for t in (1, 2, 8, 32, 128, 512, 2048, 8192, 32768)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False)), times


@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "L40S"])
def test_decode_step_grows_with_context_and_batch_but_throughput_does_not_fall(model, cat, gpu):
    spec = cat[L8]
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for context in (128, 2048):
        steps = np.array([model.decode_step_ms(spec, gpu, b, context) for b in batches])
        assert np.all(np.diff(steps) >= 0), steps
        throughput = np.array(batches) / steps
        assert np.all(np.diff(throughput) >= -1e-9), throughput
    by_context = [model.decode_step_ms(spec, gpu, 16, c) for c in (0, 100, 1000, 10000)]
    assert all(b > a for a, b in zip(by_context, by_context[1:], strict=False))


def test_higher_tp_reduces_step_time_for_big_models(model, cat):
    spec = with_precision(cat[L70], "bf16", "bf16")
    for gpu in ("H100", "A100-80GB"):
        decode = [model.decode_step_ms(spec, gpu, 8, 1024, tp=tp) for tp in (1, 2, 4, 8)]
        prefill = [model.prefill_ms(spec, gpu, 2048, tp=tp) for tp in (1, 2, 4, 8)]
        assert all(b < a for a, b in zip(decode, decode[1:], strict=False)), decode
        assert all(b < a for a, b in zip(prefill, prefill[1:], strict=False)), prefill


def test_fp8_faster_than_bf16_only_where_the_gpu_has_fp8(model, cat):
    fp8, bf16 = cat["@cf/meta/llama-3.1-8b-instruct-fp8"], with_precision(cat["@cf/meta/llama-3.1-8b-instruct-fp8"],
                                                                          "bf16", "bf16")
    for gpu in ("H100", "H200", "L40S", "L4"):
        assert model.prefill_ms(fp8, gpu, 4096) < 0.75 * model.prefill_ms(bf16, gpu, 4096)
        assert model.decode_step_ms(fp8, gpu, 1, 512) < model.decode_step_ms(bf16, gpu, 1, 512)
    # A100 has no FP8 tensor cores: fp8 is weight-only, so prefill math is 16-bit (no speed-up) ...
    assert model.scheme(fp8, "A100-80GB").weight_only
    assert model.prefill_ms(fp8, "A100-80GB", 4096) == pytest.approx(model.prefill_ms(bf16, "A100-80GB", 4096),
                                                                     rel=0.05)
    # ... while decode streams half the weight bytes.
    assert model.decode_step_ms(fp8, "A100-80GB", 1, 512) < 0.8 * model.decode_step_ms(bf16, "A100-80GB", 1, 512)


@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "H200"])
def test_batch1_decode_is_memory_bound_at_weight_bytes_over_bandwidth(model, cat, gpu):
    spec = cat[L8]
    g = model.gpu(gpu)
    ideal_ms = 1e3 * perf_arch.streamed_weight_bytes(spec, model.scheme(spec, gpu)) / g.mem_bw
    step = model.decode_breakdown(spec, gpu, 1, 64)
    assert step.bottleneck == "memory"
    assert ideal_ms < step.total_ms < 1.6 * ideal_ms + model.profile.step_overhead_ms


def test_architecture_counts_match_published_parameter_counts(cat):
    # Llama/Mistral keep a separate LM head; Gemma ties it to the embedding (one vocab x hidden table).
    for mid, tied in ((L8, False), (L70, False), ("@cf/mistral/mistral-7b-instruct-v0.1", False),
                      ("@cf/google/gemma-3-12b-it", True)):
        spec = cat[mid]
        counted = perf_arch.body_params(spec) + spec.vocab * spec.hidden * (1 if tied else 2)
        assert counted == pytest.approx(spec.parameters, rel=0.04), mid


def test_schemes_follow_the_hardware():
    assert perf_arch.scheme("fp8", has_fp8=True).gemm_peak == "flops8"
    assert perf_arch.scheme("fp8", has_fp8=False).weight_only
    assert perf_arch.scheme("int8", has_fp8=False).gemm_peak == "flops8"  # INT8 tensor cores exist everywhere
    assert perf_arch.scheme("int8", has_fp8=True, weight_only=True).weight_only
    assert perf_arch.scheme("int4", has_fp8=True).weight_only
    assert perf_arch.split_precision("int8-wo") == ("int8", True)
    with pytest.raises(UserError):
        perf_arch.split_precision("fp4")


def test_tp_and_gpu_validation(model, cat, topo):
    with pytest.raises(UserError, match="does not divide"):
        model.prefill_ms(cat[L70], "H100", 128, tp=3)
    with pytest.raises(UserError, match="unknown GPU"):
        model.decode_step_ms(cat[L8], "B200", 1, 10)
    with pytest.raises(UserError, match="unknown roofline parameter"):
        Roofline.from_topology(topo, not_a_constant=1.0)
    with pytest.raises(UserError, match="unknown engine"):
        Roofline.from_topology(topo, engine="nope")
    slower = Roofline.from_topology(topo, bw_efficiency=0.4)
    assert slower.decode_step_ms(cat[L8], "H100", 1, 64) > model.decode_step_ms(cat[L8], "H100", 1, 64)


def test_memory_per_gpu_splits_weights_and_replicates_kv_heads_under_wide_tp(model, cat):
    spec = cat[L70]
    two, eight = (model.memory_per_gpu(spec, "H100", tp=t, kv_tokens=10000) for t in (2, 8))
    assert two["weights_bytes"] == pytest.approx(4 * eight["weights_bytes"])
    assert two["kv_bytes"] == pytest.approx(4 * eight["kv_bytes"])  # 8 KV heads: no replication up to tp 8
    sixteen = model.memory_per_gpu(spec, "H100", tp=16, kv_tokens=10000)
    assert sixteen["kv_bytes"] == pytest.approx(eight["kv_bytes"])  # tp 16 > 8 KV heads: each head on 2 GPUs
    assert not model.memory_per_gpu(with_precision(spec, "bf16"), "H100", tp=1)["fits"]


def test_an_encoders_capacity_is_its_batched_pass_of_separate_prompts(model, cat):
    """A batch of B prompts is one pass over B separate sequences (as the replica engine runs it), not one sequence
    of B x P tokens: capacity grows with the batch up to the GPU's throughput, never falls."""
    spec = cat["@cf/baai/bge-base-en-v1.5"]
    caps = [capacity_rps(model, spec, "L4", 512, 0, batch=b) for b in (1, 8, 64, 512)]
    assert caps == sorted(caps) and caps[2] > 1.5 * caps[0]
    assert caps[2] == pytest.approx(64e3 / model.prefill_batch_ms(spec, "L4", [512] * 64))


def test_capacity_falls_with_longer_outputs_and_respects_the_kv_pool(model, cat):
    spec = cat[L8]
    short, long = (capacity_rps(model, spec, "H100", 512, o) for o in (64, 1024))
    assert long < short
    pool_limited = capacity_rps(model, spec, "H100", 512, 128, batch=10_000)
    assert pool_limited == pytest.approx(capacity_rps(model, spec, "H100", 512, 128,
                                                      batch=spec.kv_pool_tokens // 640))


def test_capacity_counts_the_first_token_as_the_prefills(model, cat):
    """A request of n output tokens decodes n - 1 of them (the prefill makes the first), as the replica engine
    runs it: one output token alone is the prefill; each token more adds one shared decode step."""
    spec = cat[L8]
    assert capacity_rps(model, spec, "L4", 16, 1, batch=1) == pytest.approx(1e3 / model.prefill_ms(spec, "L4", 16))
    step = model.decode_step_ms(spec, "L4", 1, 16 + 9 / 2)
    assert 1e3 / capacity_rps(model, spec, "L4", 16, 9, batch=1) == pytest.approx(
        model.prefill_ms(spec, "L4", 16) + 8 * step)


def test_speech_capacity_is_the_clips_mean_cost_not_the_mean_clips(model, cat):
    """Clips pay per started 30 s window: a mix of 10 s and 50 s clips (1 and 2 windows) costs each clip's own
    time, more than their mean 24 s clip (1 window) would; grouping clips by window count loses nothing."""
    spec = cat["@cf/openai/whisper"]
    clips = np.array([10.0, 10.0, 10.0, 10.0, 50.0, 55.0]) / 60.0
    each = [1.0 / capacity_rps(model, spec, "L4", c, 0) for c in clips]
    mixed = capacity_rps_mix(model, spec, "L4", clip_mix(spec, clips), 0)
    assert mixed == pytest.approx(1.0 / np.mean(each), rel=1e-3)
    assert mixed < 0.8 * capacity_rps(model, spec, "L4", clips.mean(), 0)
    assert [round(w, 3) for _, w in clip_mix(spec, clips)] == [0.667, 0.333]
    assert capacity_rps_mix(model, spec, "L4", [(0.5, 2.0)], 0) == pytest.approx(capacity_rps(model, spec, "L4", 0.5, 0))
    with pytest.raises(UserError, match="positive share"):
        capacity_rps_mix(model, spec, "L4", [(0.5, 0.0)], 0)


def test_every_model_and_engine_gives_finite_prefill_and_capacity(topo, cat):
    """An image or speech pass has no attention layers or heads, so an engine's dense score-matrix term adds
    nothing to it (its GEMM rows are unbounded: the product must not be computed as inf * 0)."""
    engines = sorted(Roofline.from_topology(topo).params.engines)
    assert len(engines) > 1
    for engine in engines:
        m = Roofline.from_topology(topo, engine=engine)
        for spec in cat:
            prompt = 1.0 if spec.unit != "token" else 64
            pre = m.prefill_ms(spec, "H200", prompt_units(spec, prompt))
            cap = capacity_rps(m, spec, "H200", prompt, 8 if spec.generative else 0, batch=4)
            assert math.isfinite(pre) and math.isfinite(cap) and cap > 0, (engine, spec.id, pre, cap)


# ---------------------------------------------------------------- calibration
@pytest.fixture(scope="module")
def rows():
    return perf_calibration.load_rows()


def test_vectorised_fit_predictions_are_the_rooflines_own(rows):
    """The fit's array arithmetic and ``Roofline._time`` give the same milliseconds for every reference row."""
    assert rows.check(RooflineParams.load()) < 1e-9
    assert rows.check(RooflineParams()) < 1e-9


def test_shipped_params_are_the_current_fit(rows):
    doc = json.loads(PARAMS_FILE.read_text())
    shipped = RooflineParams.load()
    refit = perf_calibration.fit(rows)
    pred_shipped, pred_refit = rows.predict(shipped), rows.predict(refit)
    assert np.allclose(pred_shipped, pred_refit, rtol=0.02)
    for phase in ("prefill", "decode", "kernel", "allreduce"):
        sel = (rows.table.phase == phase).to_numpy()
        assert doc["metrics"]["in_sample_mape"][phase] == pytest.approx(
            perf_calibration.mape(pred_shipped[sel], rows.measured[sel]), abs=2e-3)


def test_held_out_rows_never_influence_the_fit(rows):
    """Doubling every measurement of one GPU type leaves a fit without that GPU unchanged."""
    keep = (rows.table.gpu != "H100").to_numpy()
    a = perf_calibration.fit(rows.subset(keep))
    table = rows.table.copy()
    table.loc[~keep, "measured_ms"] *= 2
    doubled = perf_calibration.Rows(table, rows.specs, rows.gpus, rows.schemes, rows.costs, rows.prefills)
    b = perf_calibration.fit(doubled.subset(keep))
    assert a.to_dict() == b.to_dict()


def test_unmeasured_gpu_kinds_fall_back_to_their_siblings(rows):
    """Without any Ada board in the rows, Ada's GEMM efficiency is the median of the fitted architectures'."""
    params = perf_calibration.fit(rows.subset((rows.table.gpu != "L40S").to_numpy()))
    fitted = [params.gemm_efficiency[a] for a in ("ampere", "hopper")]
    assert params.gemm_efficiency["ada"] == pytest.approx(float(np.median(fitted)))
    assert "L40S" not in params.gemm_efficiency


def test_an_architecture_measured_by_few_rows_is_pooled_towards_the_others(rows, monkeypatch):
    """Ada is measured by four L40S FP8 first-token rows only: pooled, its GEMM efficiency stays near the other
    architectures' (unpooled, those rows drove it to the fit's 0.95 bound, which every L4 then used)."""
    pooled = perf_calibration.fit(rows).gemm_efficiency
    archs = np.log([pooled[a] for a in ("ampere", "hopper", "ada")])
    assert np.abs(archs - archs.mean()).max() < 0.05 and pooled["ada"] < 0.9
    monkeypatch.setattr(perf_calibration, "ARCH_SPREAD", 1e6)  # (a prior this wide weighs nothing)
    assert perf_calibration.fit(rows).gemm_efficiency["ada"] > 0.9


def test_a_board_measured_only_memory_bound_takes_its_architectures_gemm_efficiency(rows):
    """H200's rows are small-batch decode steps (weight streaming): they fit its memory efficiency, not its GEMMs'."""
    names = [n for n, _, _ in perf_calibration.constants(rows)]
    assert "bw_efficiency.H200" in names and "gemm_efficiency.H200" not in names
    assert "H200" not in RooflineParams.load().gemm_efficiency


def test_kernel_and_collective_tables_are_well_formed():
    kernels = pd.read_csv(perf_calibration.KERNELS_FILE)
    assert set(kernels.gpu) == {"A100-80GB", "H100", "A40"} and set(kernels.tp) == {1, 2, 4, 8}
    assert (kernels.measured_ms > 0).all() and kernels.source.str.startswith("https://github.com/microsoft/vidur").all()
    coll = pd.read_csv(perf_calibration.COLLECTIVES_FILE)
    # More bytes never take less time in the profile's medians beyond noise (the table is not garbled).
    for _, g in coll.groupby(["gpu", "workers"]):
        ms = g.sort_values("bytes").measured_ms.to_numpy()
        assert ms[-1] > 3 * ms[0]


def test_reference_tables_are_attributed(rows):
    attribution = (ROOT / "controlplane" / "data" / "ATTRIBUTION.md").read_text()
    for url in set(rows.table.source):
        assert url.split("/blob/")[0].split("/builds/")[0].split("/tree/")[0] in attribution, url


# ---------------------------------------------------------------- measured profile
@pytest.fixture(scope="module")
def profile_csv(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    env = {**os.environ, "EDGEPOP_CACHE": str(out / "cache"), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "edgepop.cli", "profile", "--quick", "--models", "gpt2-tiny",
                    "--out", str(out / "profile.csv")], check=True, env=env, capture_output=True, timeout=120)
    return out / "profile.csv"


def test_measured_profile_interpolates_the_real_profile(profile_csv, cat):
    table = pd.read_csv(profile_csv)
    assert set(table.phase) == {"prefill", "decode"}
    prof = MeasuredProfile.load(profile_csv)
    spec = cat["@edgepop/gpt2-tiny"]
    pre = table[(table.phase == "prefill") & (table.batch_size == 1)].sort_values("tokens")
    lo, hi = pre.iloc[0], pre.iloc[-1]
    at_lo, at_hi = prof.prefill_ms(spec, "H100", int(lo.tokens)), prof.prefill_ms(spec, "H100", int(hi.tokens))
    assert at_lo == pytest.approx(lo.ms)  # grid point (smallest cell is never raised by the running maximum)
    assert at_hi >= hi.ms  # grid point, possibly raised to keep the curve monotone
    mid = prof.prefill_ms(spec, "H100", int((lo.tokens + hi.tokens) // 2))
    assert at_lo <= mid <= at_hi
    with pytest.warns(ExtrapolationWarning, match="prefill tokens .* lies past the measured"):
        assert prof.prefill_ms(spec, "H100", int(hi.tokens) * 4) > at_hi  # extrapolates upward, and says so
    with pytest.warns(ExtrapolationWarning, match="decode (context|batch_size) .* lies past the measured"):
        dec = [prof.decode_step_ms(spec, "H100", b, c) for b in (1, 2, 8, 32) for c in (32, 64, 200, 1000)]
    assert min(dec) >= table[table.phase == "decode"].ms.min() - 1e-9
    for b in (1, 8):
        curve = [prof.decode_step_ms(spec, "H100", b, c) for c in (0, 64, 128, 256, 512)]
        assert all(y >= x for x, y in zip(curve, curve[1:], strict=False))
    assert capacity_rps(prof, spec, "H100", 64, 32, batch=8) > 0


def test_measured_profile_errors_and_parquet(profile_csv, cat, tmp_path):
    table = pd.read_csv(profile_csv)
    table.to_parquet(tmp_path / "p.parquet", index=False)
    prof = MeasuredProfile.load(tmp_path / "p.parquet")
    spec = cat["@edgepop/gpt2-tiny"]
    assert prof.decode_step_ms(spec, "x", 1, 64) == pytest.approx(
        MeasuredProfile.load(profile_csv).decode_step_ms(spec, "x", 1, 64))
    with pytest.raises(UserError, match="no rows for model 'minilm-l6-v2'"):
        prof.prefill_ms(cat["@cf/baai/bge-base-en-v1.5"], "H100", 32)
    no_decode = MeasuredProfile(table[table.phase != "decode"], source="t.csv")
    with pytest.raises(UserError, match="no 'decode' rows"):
        no_decode.decode_step_ms(spec, "H100", 1, 10)
    with pytest.raises(UserError, match="one device"):
        prof.prefill_ms(spec, "H100", 10, tp=2)
    with pytest.raises(UserError, match="not a profile table"):
        MeasuredProfile(table.drop(columns=["host"]))
    with pytest.raises(UserError, match="not found"):
        MeasuredProfile.load(tmp_path / "missing.csv")


# ---------------------------------------------------------------- edgepop estimate
def _estimate(capsys, *args):
    rc = edgepop_main(["estimate", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_capacity_runs_the_batch_the_kv_pool_allows(capsys):
    """--batch 256 does not fit an L40S, but capacity runs the KV pool's batch (6 such sequences), which does."""
    args = ["--model", L8, "--gpu", "L40S", "--prompt-tokens", "4000", "--output-tokens", "1000", "--json"]
    big = json.loads(_estimate(capsys, *args, "--batch", "256")[1])
    small = json.loads(_estimate(capsys, *args, "--batch", str(big["capacity_batch"]))[1])
    assert not big["memory_per_gpu"]["fits"] and small["memory_per_gpu"]["fits"]
    assert big["capacity_batch"] < 256 and big["capacity_rps_per_replica"] == small["capacity_rps_per_replica"] > 0


def test_estimate_memory_holds_the_context_the_decode_step_is_estimated_at(capsys):
    """--context 7000 at batch 64 is 448k tokens of KV: the memory figure and 'fits' read them, as the decode
    step does (it said 22.5 of 24 GB, fits, beside a step at that context)."""
    args = ["--model", L8, "--gpu", "L4", "--batch", "64", "--json"]
    at = json.loads(_estimate(capsys, *args, "--context", "7000")[1])
    same = json.loads(_estimate(capsys, *args, "--prompt-tokens", "6900", "--output-tokens", "100")[1])
    assert not at["memory_per_gpu"]["fits"]
    assert at["memory_per_gpu"] == same["memory_per_gpu"]


def test_estimate_json_fields(capsys):
    rc, out, _ = _estimate(capsys, "--model", L70, "--gpu", "A100-80GB", "--tp", "4", "--batch", "8",
                           "--prompt-tokens", "1024", "--json")
    assert rc == 0
    est = json.loads(out)
    for key in ("prefill_ms", "decode_ms_per_token", "decode_tokens_per_s_per_seq", "decode_tokens_per_s",
                "memory_per_gpu", "bottleneck", "capacity_rps_per_replica", "execution"):
        assert key in est, key
    assert est["tp"] == 4 and est["batch"] == 8 and est["context"] == 1024 + 64
    assert est["decode_tokens_per_s"] == pytest.approx(8 * est["decode_tokens_per_s_per_seq"], rel=1e-3)
    assert est["memory_per_gpu"]["fits"] is True
    assert est["bottleneck"]["decode"] in ("memory", "compute", "interconnect", "overhead")
    assert "weight-only" in est["execution"]  # fp8 on an A100
    rc, out, _ = _estimate(capsys, "--model", "@cf/baai/bge-m3", "--gpu", "L4", "--json")
    assert rc == 0 and json.loads(out)["decode_ms_per_token"] is None


@pytest.mark.parametrize("args,message", [
    (["--model", "@cf/meta/llama-3.1-8b", "--gpu", "H100"], "close: @cf/meta/llama-3.1-8b-instruct"),
    (["--model", L8, "--gpu", "B200"], "unknown GPU"),
    (["--model", L70, "--gpu", "L4", "--tp", "1"], "does not fit"),
    (["--model", L70, "--gpu", "H100", "--tp", "3"], "does not divide"),
    (["--model", L70, "--gpu", "L4", "--tp", "3"], "does not divide its 64 attention heads; --tp 4 fits"),
    (["--model", L8, "--gpu", "H100", "--batch", "0"], "--batch must be an integer from 1 to 100,000, got 0"),
    (["--model", L8, "--gpu", "H100", "--batch", "100000000000"], "--batch must be an integer from 1"),  # was a
    # MemoryError: a batch of 10^11 prompts was built before anything looked at its size
    (["--model", "@cf/openai/whisper", "--gpu", "T4", "--prompt-tokens", "1" + "0" * 40],
     "--prompt-tokens is audio minutes for @cf/openai/whisper: from 1/60 (one second) to 100,000"),
    (["--model", L8, "--gpu", "H100", "--prompt-tokens", "-1"], "--prompt-tokens must be a whole number of tokens"),
    (["--model", L8, "--gpu", "H100", "--prompt-tokens", "12.5"], "whole number of tokens from 1 to 100,000,000, "
                                                                   "got 12.5"),
    (["--model", "@cf/microsoft/resnet-50", "--gpu", "L4", "--tp", "2"],
     "tensor parallelism is not modelled for image models (tp 2)"),  # was accepted: a free 2x (any tp)
    (["--model", L8, "--gpu", "L4", "--precision", "fp16-wo"], "weight-only execution applies to 8- and 4-bit"),
    (["--model", L8, "--gpu", "H100", "--prompt-tokens", "500000"], "tokens exceed the context window of " + L8),
    (["--model", L8, "--gpu", "H100", "--context", "1e9"], "--context 1e+09 tokens exceed the context window"),
    (["--model", "@cf/baai/bge-m3", "--gpu", "L4", "--prompt-tokens", "100000"], "exceed the context window"),
])
def test_estimate_errors_are_one_line(capsys, args, message):
    rc, out, err = _estimate(capsys, *args)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1 and err.startswith("edgepop: error:")


def test_estimate_takes_a_speech_clip_in_minutes_and_pays_whole_windows(capsys):
    """--prompt-tokens was an integer: no clip under a minute could be estimated, and a speech model's default was
    512 minutes (8.5 hours) per request. A 10 s and a 30 s clip share one encoder window; a 31 s clip takes two."""
    def prefill(*extra):
        rc, out, _ = _estimate(capsys, "--model", "@cf/openai/whisper", "--gpu", "L4", "--json", *extra)
        assert rc == 0
        return json.loads(out)

    ten, thirty, more = (prefill("--prompt-tokens", str(s / 60))["prefill_ms"] for s in (10, 30, 31))
    assert ten < thirty < 1.05 * ten and more > 1.5 * thirty
    default = prefill()
    assert default["prompt_tokens"] == 1.0 and default["prefill_ms"] == prefill("--prompt-tokens", "1")["prefill_ms"]


def test_fp32_runs_on_cuda_cores_where_a_gpu_has_no_tf32(model):
    """Turing (T4) has no TF32 tensor cores: fp32 at its CUDA cores' 8.1 TFLOPS, not half its 65 FP16 TFLOPS."""
    t4, l4 = model.gpu("T4"), model.gpu("L4")
    assert t4.peak("flops32") == pytest.approx(8.125e12)
    assert l4.peak("flops32") == pytest.approx(l4.flops16 / 2)
