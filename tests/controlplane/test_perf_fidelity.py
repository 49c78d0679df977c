"""Fidelity of the service-time model: cross-validation on the shipped data, tensor-parallel decode, monotonicity,
mixed batches, and ``edgepop validate`` with the docs page it generates.

The leave-one-group-out goal is prefill and decode MAPE <= 10% in every grouping. Where the shipped model meets
it, the test asserts the goal; where it does not (prefill with a tensor-parallel degree held out: 10.3%), the test
asserts the bound the model reaches today, so a change can only make it better, and the docs page says the goal
is missed (see docs/perf-model.md for why).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline, straggler_factor, with_precision
from controlplane.perf_calibration import FIRST_TOKEN_DECODE, LEGACY_ENGINES
from controlplane.perf_params import RooflineParams
from controlplane.perf_validation import GOAL_MAPE
from controlplane.validation import fidelity_report, render_markdown

ROOT = Path(__file__).resolve().parents[2]
L8 = "@cf/meta/llama-3.1-8b-instruct"
L70 = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
# What the shipped model reaches where it misses the goal (pooled MAPE, held-out predictions): tp 1 held out
# takes every single-GPU row away, the L40S's with them (docs/perf-model.md).
REACHED = {("tp", "prefill"): 0.105}
# What the shipped constants reach on each external check set (pooled MAPE; raised only with a documented model
# change: pooling the architectures' GEMM efficiency took the static-decode set from 18.7% to 19.2%; the legacy
# stack's barrier wait, refitting the shared constants, NIM's default reading from 17.6% to 18.2%).
HOLDOUT_REACHED = {"perf_holdout.csv": {"default": 0.14, "other_release": 0.12},
                   "perf_holdout_nim.csv": {"default": 0.185, "other_release": 0.21},
                   "perf_holdout_static_decode.csv": {"default": 0.195, "other_release": 0.195},
                   "perf_holdout_edge.csv": {"default": 0.105, "other_release": 0.105},
                   # image passes on the L4 and T4: the language-model default, and the image server's profile
                   # fitted on the datacenter boards' rows (docs/perf-model.md)
                   "perf_holdout_mlperf_images.csv": {"default": 0.52, "other_release": 0.31}}


@pytest.fixture(scope="module")
def report():
    return fidelity_report()


@pytest.fixture(scope="module")
def model(topo):
    return Roofline.from_topology(topo)


@pytest.mark.parametrize("key", ["model", "gpu", "tp"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_leave_one_group_out_errors(report, key, phase):
    pooled = report["service_time"][f"by_{key}"]["pooled"][phase]
    assert pooled["rows"] >= 70
    bound = REACHED.get((key, phase), GOAL_MAPE)
    assert pooled["mape"] <= bound, (key, phase, pooled)
    missed = f"{key}/{phase}" in " ".join(report["service_time"]["goal_failures"])
    assert missed == (pooled["mape"] > GOAL_MAPE)


def test_cross_validation_covers_tp_1_to_8_and_an_edge_class_gpu(report):
    st = report["service_time"]
    assert st["tp"] == [1, 2, 4, 8]
    assert {"A100-80GB", "H100", "L40S", "A40"} <= set(st["gpus"])
    assert "A40" in st["by_gpu"]["groups"] and "L40S" in st["by_gpu"]["groups"]
    assert st["by_model"]["pooled"]["kernel"]["mape"] <= 0.12


def test_allreduce_takes_the_cheaper_protocol(model, topo):
    """Small messages (decode steps) pay the low-latency protocol's shorter latency, large ones (prefills) the
    simple protocol's full bandwidth; the time never falls as the message grows and is continuous."""
    p = model.params
    assert p.allreduce_ll_latency_us < p.by("allreduce_latency_us", "nvlink")
    g = model.gpu("H100")
    sizes = np.geomspace(1e3, 1e9, 200)
    times = np.array([model.allreduce_s(g, 8, b) for b in sizes])
    assert np.all(np.diff(times) > 0)
    assert times[0] == pytest.approx(p.allreduce_ll_latency_us * 1e-6, rel=0.05)
    ring = 2 * 7 / 8 * 1e9 / (g.link_bw * p.link_efficiency_of(g))
    assert times[-1] == pytest.approx(p.by("allreduce_latency_us", "nvlink") * 1e-6 + ring)
    assert np.max(np.diff(times) / times[:-1]) < 0.1  # no jump where the protocols cross


def test_decode_does_not_fall_like_one_over_tp(model, topo):
    """Each GPU more pays per-layer all-reduces and the step floor: 8 GPUs give far less than 8x."""
    spec = with_precision(default_catalog()[L70], "bf16", "bf16")
    for gpu in ("H100", "A100-80GB"):
        steps = {tp: model.decode_breakdown(spec, gpu, 1, 1024, tp=tp) for tp in (1, 2, 4, 8)}
        ms = {t: s.total_ms for t, s in steps.items()}
        assert ms[8] > 1.5 * ms[1] / 8, ms
        # Measured (gpt-fast, Llama-2-70B bf16, batch 1, A100): 46.9 / 26.3 / 16.0 ms at tp 2 / 4 / 8, i.e. 1.8x
        # from 2x the GPUs and 2.9x from 4x; ideal scaling would give 2x and 4x.
        assert ms[2] / ms[4] < 1.9 and ms[2] / ms[8] < 3.5, ms
        assert steps[8].comm_ms > steps[2].comm_ms > 0.0 == steps[1].comm_ms


@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "L40S", "L4"])
def test_more_gpus_never_add_work_only_communication(model, gpu):
    """Across tensor-parallel degrees, everything but the all-reduces never grows with more GPUs."""
    spec = default_catalog()[L8]
    for prompts, batch in (([2048], 0), ([], 16), ([512], 8)):
        busy = []
        for tp in (1, 2, 4, 8):
            b = model.mixed_breakdown(spec, gpu, prompts, batch, 1000, tp=tp)
            busy.append(b.total_ms - b.comm_ms - b.overhead_ms)
        assert all(b <= a + 1e-9 for a, b in zip(busy, busy[1:], strict=False)), busy


@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "L40S", "T4"])
def test_more_tokens_never_make_a_step_faster(model, gpu):
    spec = default_catalog()[L8]
    for tp in (1, 2, 4):
        pre = [model.prefill_ms(spec, gpu, t, tp=tp) for t in (1, 16, 128, 1024, 8192)]
        dec = [model.decode_step_ms(spec, gpu, b, 512, tp=tp) for b in (1, 4, 16, 64, 256)]
        batched = [model.prefill_batch_ms(spec, gpu, [256] * n, tp=tp) for n in (1, 2, 4, 8)]
        for seq in (pre, dec, batched):
            assert all(b >= a for a, b in zip(seq, seq[1:], strict=False)), seq


def test_mixed_step_costs_more_than_either_part_and_less_than_both(model):
    spec = default_catalog()[L8]
    for gpu in ("H100", "L4"):
        mixed = model.mixed_step_ms(spec, gpu, [512], 16, 1000)
        prefill, decode = model.prefill_ms(spec, gpu, 512), model.decode_step_ms(spec, gpu, 16, 1000)
        assert max(prefill, decode) <= mixed < prefill + decode
        assert model.mixed_step_ms(spec, gpu, [512], 0, 0) == pytest.approx(prefill)
        assert model.mixed_step_ms(spec, gpu, [], 16, 1000) == pytest.approx(decode)


def test_dense_attention_is_a_legacy_engine_property_following_the_pass_not_the_prompt(topo):
    """Only the legacy stack is fitted a dense whole-pass score matrix; its cost follows the pass's total tokens
    (8 x 512 costs what 1 x 4,096 does, as in its measurements) and does not shrink with more GPUs."""
    params = RooflineParams.load()
    assert all((p.dense_attention_bytes > 0) == (name in LEGACY_ENGINES) for name, p in params.engines.items())
    name = next(iter(LEGACY_ENGINES))
    legacy, modern = Roofline.from_topology(topo, engine=name), Roofline.from_topology(topo)
    spec = with_precision(default_catalog()[L70], "bf16", "bf16")

    def batch_over_single(model):
        return model.prefill_batch_ms(spec, "H100", [512] * 8, tp=8) / model.prefill_ms(spec, "H100", 4096, tp=8)

    assert 0.97 < batch_over_single(legacy) <= 1.0 and batch_over_single(modern) < batch_over_single(legacy)
    without = replace(params, engines={**params.engines, name: replace(params.engines[name], dense_attention_bytes=0)})
    plain = Roofline(legacy.gpus, without, name)

    def dense_ms(tp):  # what the dense term adds to an 8,192-token prompt
        return legacy.prefill_ms(spec, "H100", 8192, tp=tp) - plain.prefill_ms(spec, "H100", 8192, tp=tp)

    assert dense_ms(2) > 100 and dense_ms(8) == pytest.approx(dense_ms(2), rel=1e-6)


def test_straggler_factor_is_the_expected_maximum_of_normals():
    assert straggler_factor(1) == 0.0
    assert straggler_factor(2) == pytest.approx(1 / np.sqrt(np.pi), abs=1e-6)  # E max of two: 1/sqrt(pi)
    draws = np.random.default_rng(7).standard_normal((200_000, 8)).max(axis=1).mean()
    assert straggler_factor(8) == pytest.approx(draws, abs=0.01)
    assert all(straggler_factor(n) < straggler_factor(2 * n) for n in (1, 2, 4, 8))


def test_barrier_wait_is_a_legacy_engine_property_paid_at_every_all_reduce(topo):
    """Only the legacy stack, whose workers launch their own kernels, waits at each all-reduce for the last
    worker; the wait grows with the workers, is nothing on one GPU, and takes its decode rows' bias by tensor
    parallelism away (a constant overhead left them 11-18% too slow at tp 2 and 10% too fast at tp 8)."""
    from controlplane.perf_calibration import load_rows

    params = RooflineParams.load()
    assert all((p.barrier_jitter_us > 0) == (name in LEGACY_ENGINES) for name, p in params.engines.items())
    name = next(iter(LEGACY_ENGINES))
    legacy = Roofline.from_topology(topo, engine=name)
    plain = Roofline(legacy.gpus, replace(params, engines={**params.engines, name: replace(
        params.engines[name], barrier_jitter_us=0.0)}), name)
    spec = with_precision(default_catalog()[L70], "bf16", "bf16")
    wait = {tp: legacy.decode_step_ms(spec, "H100", 8, 512, tp=tp) - plain.decode_step_ms(spec, "H100", 8, 512, tp=tp)
            for tp in (1, 2, 4, 8)}
    layers_allreduces = 2 * spec.layers
    assert wait[1] == 0.0
    for tp in (2, 4, 8):
        expected = layers_allreduces * params.engines[name].barrier_jitter_us * 1e-3 * straggler_factor(tp)
        assert wait[tp] == pytest.approx(expected, rel=1e-9)
    rows = load_rows(("e2e",))
    mine = (rows.engine == name) & ~rows.prefill
    err = rows.predict(params)[mine] / rows.measured[mine] - 1.0
    for tp in (2, 4, 8):
        for gpu in ("A100-80GB", "H100"):
            at = (rows.tp[mine] == tp) & (rows.gpu_name[mine] == gpu)
            assert at.sum() >= 2 and abs(err[at].mean()) < 0.10, (tp, gpu, err[at])


def test_first_token_decode_engine_prefills_all_but_the_last_token_then_decodes_it(topo):
    """TurboMind 0.1 emits the first token from a decode step: a one-token prompt costs the prefill overhead and a
    batch-1 decode step, a longer one the other engines' prefill of one token fewer and that decode step."""
    params = RooflineParams.load()
    assert sorted(n for n, p in params.engines.items() if p.first_token_decode) == sorted(FIRST_TOKEN_DECODE)
    name = next(iter(FIRST_TOKEN_DECODE))
    prof = params.engines[name]
    turbo = Roofline.from_topology(topo, engine=name)
    plain = Roofline(turbo.gpus, replace(params, engines={**params.engines, name: replace(
        prof, first_token_decode=False)}), name)
    spec, gpu = default_catalog()[L8], "A100-80GB"
    assert turbo.prefill_ms(spec, gpu, 1) == pytest.approx(prof.prefill_overhead_ms + turbo.decode_step_ms(spec, gpu, 1, 0))
    for t in (128, 2048):
        expected = plain.prefill_ms(spec, gpu, t - 1) + turbo.decode_step_ms(spec, gpu, 1, t - 1)
        assert turbo.prefill_ms(spec, gpu, t) == pytest.approx(expected)


def test_external_check_rows_are_never_fitted_and_every_row_is_reported(report):
    from controlplane.perf_rows import load_reference
    from controlplane.perf_validation import OTHER_RELEASE

    checks = {h["file"]: h for h in report["service_time_holdouts"]}
    assert set(checks) == set(HOLDOUT_REACHED)
    assert {name: h["rows"] for name, h in checks.items()} == {"perf_holdout.csv": 40, "perf_holdout_nim.csv": 108,
                                                              "perf_holdout_static_decode.csv": 7,
                                                              "perf_holdout_edge.csv": 5,
                                                              "perf_holdout_mlperf_images.csv": 5}
    ref, params = load_reference(), RooflineParams.load()
    for name, h in checks.items():
        assert h["rows"] == len(h["points"]) == len(load_reference(ROOT / "controlplane" / "data" / name))
        for engine in h["engines"]:
            assert engine not in set(ref.engine) and engine not in params.engines  # no fit has seen it
            if engine in OTHER_RELEASE:
                assert OTHER_RELEASE[engine] in params.engines  # the other release is a fitted profile
            else:  # no release fitted: both readings are the default profile's
                assert all(p["other_release_ms"] == p["default_ms"] for p in h["points"] if p["engine"] == engine)
        for reading, bound in HOLDOUT_REACHED[name].items():
            r = h["readings"][reading]
            assert r["mape"] <= bound, (name, reading, r["mape"])
            for key in ("phase", "tp", "gpu", "batch"):
                assert sum(g["rows"] for g in r[f"by_{key}"].values()) == h["rows"]
        # The two readings differ only by the engines' fixed overheads: per row, its phase's overhead apart (but
        # for a profile with its own share of the peak, the image server's).
        default = params.engines["default"]
        for p in h["points"]:
            other = params.engines[OTHER_RELEASE.get(p["engine"], "default")]
            if other.gemm_efficiency is not None:
                continue
            field = "prefill_overhead_ms" if p["phase"] == "prefill" else "step_overhead_ms"
            gap = getattr(other, field) - getattr(default, field)
            assert p["other_release_ms"] - p["default_ms"] == pytest.approx(gap, abs=0.02)


def test_edge_check_rows_are_l40s_static_batch_decode_steps_rederived_from_their_notes(report):
    """``perf_holdout_edge.csv``: every row one L40S decode step of TensorRT-LLM 0.9.0's static-batch throughput
    table, its figure re-derived from the numbers its notes quote (the run less its one prefill, over 2,048 steps);
    ``edgepop validate`` reports it beside the other external checks, within the MAPE it reaches."""
    import csv

    from controlplane.perf_rows import HOLDOUT_EDGE_FILE, reference_specs

    rows, specs = list(csv.DictReader(HOLDOUT_EDGE_FILE.open())), reference_specs()
    assert len(rows) == 5 and len({(r["model"], r["tp"]) for r in rows}) == 5
    for r in rows:
        assert r["model"] in specs
        assert (r["gpu"], r["precision"], r["kv_precision"], r["phase"], r["engine"]) == (
            "L40S", "fp8", "fp8", "decode", "tensorrt-llm-0.9-static")
        assert r["source"] == "https://github.com/NVIDIA/TensorRT-LLM/blob/v0.9.0/docs/source/performance.md"
        tp, batch = int(r["tp"]), int(r["batch"])
        assert (int(r["prompt_tokens"]), int(r["context"])) == (128, 128 + 2048 // 2) and tp in (1, 4, 8)
        quoted = re.search(r"([\d,]+) output tokens/s(?: per GPU x (\d) GPUs)? at batch (\d+)", r["notes"])
        gpus = int(quoted[2] or 1)
        assert (gpus, int(quoted[3])) == (tp, batch)
        run_ms = batch * 2048 * 1000 / (float(quoted[1].replace(",", "")) * gpus)
        first_token = float(re.search(rf"at tp {tp}, ([\d.]+) ms", r["notes"])[1])
        prefill_ms = batch * 128 / 2048 * first_token
        assert prefill_ms / run_ms < 0.05
        assert float(r["measured_ms"]) == pytest.approx((run_ms - prefill_ms) / 2048, abs=0.006)
    check = next(h for h in report["service_time_holdouts"] if h["file"] == HOLDOUT_EDGE_FILE.name)
    assert check["engines"] == ["tensorrt-llm-0.9-static"] and check["other_release"] == {
        "tensorrt-llm-0.9-static": "tensorrt-llm-0.5"}
    default = check["readings"]["default"]
    assert default["by_gpu"]["L40S"]["rows"] == 5 and set(default["by_tp"]) == {"1", "4", "8"}
    assert default["mape"] <= HOLDOUT_REACHED[HOLDOUT_EDGE_FILE.name]["default"]
    assert "perf_holdout_edge.csv" in render_markdown(report, figure="fidelity-models.png")


def test_image_rows_are_mlperf_resnet50_results_rederived_from_their_notes(report):
    """``perf_reference_mlperf_images.csv`` (fitted: the image server's profile) and ``perf_holdout_mlperf_images.csv``
    (its check): every row one MLPerf Inference ResNet-50 result (NVIDIA's TensorRT harness, INT8) at the commit of
    its summary file; latency rows hold the median latency of a query (batch 1 or 8) and throughput rows the time per
    batch (batch x 1000 / samples/s per GPU), each re-derived from the figure its notes quote. The fitted rows are
    datacenter boards', the check the edge-class L4 and T4 at batch 1 and their largest batch, never fitted, and
    ``edgepop validate`` reports it read with the image server's profile."""
    import csv

    from controlplane.perf import IMAGE_ENGINE
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE, REFERENCE_IMAGE_FILE, load_rows

    fitted, held = (list(csv.DictReader(f.open())) for f in (REFERENCE_IMAGE_FILE, HOLDOUT_IMAGE_FILE))
    rows = fitted + held
    assert len(rows) == 10 and len({(r["gpu"], r["batch"]) for r in rows}) == 10
    assert {r["gpu"] for r in fitted} == {"A100-80GB", "H100", "H200"} and {r["gpu"] for r in held} == {"L4", "T4"}
    for r in rows:
        assert (r["model"], r["tp"], r["precision"], r["phase"], r["prompt_tokens"], r["engine"]) == (
            "@cf/microsoft/resnet-50", "1", "int8", "prefill", "1", "mlperf-tensorrt-lwis")
        assert re.fullmatch(r"https://github\.com/mlcommons/inference_results_v[\d.]+/blob/[0-9a-f]{40}/closed/"
                            r"NVIDIA/results/[^/]+/resnet50?/(SingleStream|MultiStream|Offline)/performance/run_1/"
                            r"mlperf_log_summary\.txt", r["source"])
        scenario, batch = r["source"].split("/")[-4], int(r["batch"])
        assert f", {scenario}: " in r["notes"]
        if scenario == "Offline":
            quoted = re.search(r"([\d,.]+) samples/s(?: on (\d) GPUs)? at gpu_batch_size (\d+)", r["notes"])
            assert int(quoted[3]) == batch >= 32
            per_gpu = float(quoted[1].replace(",", "")) / int(quoted[2] or 1)
            assert float(r["measured_ms"]) == pytest.approx(batch * 1000 / per_gpu, rel=1e-4)
        else:
            assert batch == (8 if scenario == "MultiStream" else 1)
            ns = int(re.search(r"median latency ([\d,]+) ns", r["notes"])[1].replace(",", ""))
            assert float(r["measured_ms"]) == pytest.approx(ns / 1e6, abs=1e-4)
    # The vectorised rows price an image pass as the roofline does (no attention term: it has no heads), with the
    # language-model default and with the image server's profile.
    params = RooflineParams.load()
    for path in (REFERENCE_IMAGE_FILE, HOLDOUT_IMAGE_FILE):
        image_rows = load_rows(("e2e",), reference=path)
        assert image_rows.check(params) < 1e-9
        assert image_rows.check(params, np.array([IMAGE_ENGINE] * len(image_rows.measured), dtype=object)) < 1e-9
    covered = {(r["gpu"], r["source"].split("/")[-4]) for r in held}
    assert covered == {("L4", "SingleStream"), ("L4", "MultiStream"), ("L4", "Offline"), ("T4", "SingleStream"),
                       ("T4", "Offline")}
    check = next(h for h in report["service_time_holdouts"] if h["file"] == HOLDOUT_IMAGE_FILE.name)
    assert check["engines"] == ["mlperf-tensorrt-lwis"] and check["other_release"] == {
        "mlperf-tensorrt-lwis": IMAGE_ENGINE}
    for reading, bound in HOLDOUT_REACHED[HOLDOUT_IMAGE_FILE.name].items():
        assert check["readings"][reading]["mape"] <= bound
    # the image server's profile is nearer the check than the language-model default that priced images before
    assert check["readings"]["other_release"]["mape"] < check["readings"]["default"]["mape"] - 0.15
    image = report["service_time_image"]
    assert image["rows"] == 5 and {p["gpu"] for p in image["points"]} == {"A100-80GB", "H100", "H200"}
    text = render_markdown(report, figure="fidelity-models.png")
    assert "perf_holdout_mlperf_images.csv" in text and "perf_reference_mlperf_images.csv" in text


def test_image_server_profile_is_the_fit_of_the_datacenter_rows_and_prices_image_models_only(model):
    """The shipped ``image-server`` profile is what ``fit_image_server`` gives on the shipped constants (its two
    constants identified: a fixed cost per pass near the batch-1 rows' latency, a share of the peak below the
    language models' GEMM efficiencies); the roofline prices image models' passes with it and every other model's
    with its own engine, as before."""
    from controlplane.perf import IMAGE_ENGINE
    from controlplane.perf_calibration import fit_image_server

    params = RooflineParams.load()
    shipped = params.engines[IMAGE_ENGINE]
    refit = fit_image_server(replace(params, engines={k: v for k, v in params.engines.items() if k != IMAGE_ENGINE}))
    got = refit.engines[IMAGE_ENGINE]
    assert got.prefill_overhead_ms == pytest.approx(shipped.prefill_overhead_ms, rel=1e-4)
    assert got.gemm_efficiency == pytest.approx(shipped.gemm_efficiency, rel=1e-4)
    assert 0.2 < shipped.prefill_overhead_ms < 0.5 and 0.2 < shipped.gemm_efficiency < min(
        v for v in params.gemm_efficiency.values())
    cat = default_catalog()
    resnet, llama = cat["@cf/microsoft/resnet-50"], cat[L8]
    assert model.profile_for(resnet) == shipped and model.profile_for(llama) == params.engines["default"]
    without = Roofline(model.gpus, replace(params, engines={k: v for k, v in params.engines.items()
                                                            if k != IMAGE_ENGINE}))
    assert without.profile_for(resnet) == params.engines["default"]  # constants without one: the engine's own
    for gpu in ("L4", "H100"):
        assert model.prefill_ms(llama, gpu, 512) == without.prefill_ms(llama, gpu, 512)
        assert model.prefill_ms(resnet, gpu, 1) < without.prefill_ms(resnet, gpu, 1)
        big = model.prefill_breakdown(resnet, gpu, [1] * 256)  # compute-bound: at the profile's share of the peak
        flops = 256 * resnet.gflops_per_unit * 1e9
        assert flops / (big.compute_ms / 1e3) == pytest.approx(
            model.gpu(gpu).peak(model.scheme(resnet, gpu).gemm_peak) * shipped.gemm_efficiency, rel=1e-9)


def _percentages(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+\.\d)%", text)]


def test_docs_page_is_generated_from_the_current_code(report):
    """docs/fidelity-models.md is ``edgepop validate --docs``'s output: same tables, same figures (to 0.2 points,
    as least squares may end a hair apart on another machine)."""
    page = (ROOT / "docs" / "fidelity-models.md").read_text()
    # The section on the simulated replica under load comes from the simulator (tests/sim/test_load_validation.py).
    page = re.sub(r"\n### The simulated replica under load\n.*?(?=\n## )", "", page, flags=re.S)
    fresh = render_markdown(report, figure="fidelity-models.png")
    assert (ROOT / "docs" / "fidelity-models.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the figure it shows
    assert re.sub(r"[\d.]+", "#", page) == re.sub(r"[\d.]+", "#", fresh)
    ours, theirs = _percentages(page), _percentages(fresh)
    assert len(ours) == len(theirs) > 100
    assert np.max(np.abs(np.array(ours) - np.array(theirs))) <= 0.2


def test_validate_cli_writes_json_and_refuses_docs_without_cross_validation(tmp_path, capsys):
    import json

    from edgepop.cli import main

    assert main(["validate", "--in-sample", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "fidelity.json").read_text())
    assert rep["service_time"]["in_sample"]["decode"]["mape"] < 0.10
    assert (tmp_path / "fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"in_sample", "sets", "goals"} <= set(rep["wan"]) and "leave_one_set_out" not in rep["wan"]
    assert "held-out rows" in (out := capsys.readouterr().out) and "WAN in sample" in out
    assert "tensorrt-llm-0.9-static" in out  # the edge check, beside the others (text and JSON)
    assert "perf_holdout_edge.csv" in {h["file"] for h in rep["service_time_holdouts"]}
    assert main(["validate", "--in-sample", "--docs", str(tmp_path / "x.md"), "--out", str(tmp_path)]) == 2
    assert "drop --in-sample" in capsys.readouterr().err and not (tmp_path / "x.md").exists()


def test_validate_docs_paths_are_checked_before_the_run(tmp_path, capsys):
    """A page named .png would be overwritten by its own figure; a folder where the figure goes failed after the
    whole cross-validation, leaving fidelity.json without its page. Both are refused at once."""
    from edgepop.cli import main

    assert main(["validate", "--docs", str(tmp_path / "page.png"), "--out", str(tmp_path / "o")]) == 2
    assert "name it .md" in capsys.readouterr().err
    (tmp_path / "page.png").mkdir()
    assert main(["validate", "--docs", str(tmp_path / "page.md"), "--out", str(tmp_path / "o")]) == 2
    assert "is a folder" in capsys.readouterr().err and not (tmp_path / "o").exists()
