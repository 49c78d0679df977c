"""The service-time model's interfaces: extrapolation warnings (estimate, measured profile), the GPU table's
architecture column and the validation of roofline overrides."""

from __future__ import annotations

import json
import math
import warnings

import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline, gpu_table
from controlplane.perf_profile import MeasuredProfile
from edgepop.cli import main as edgepop_main
from edgepop.errors import DataFileError, UserError
from topology.gpus import load_gpus

L8 = "@cf/meta/llama-3.1-8b-instruct"
HEADER = "gpu,memory_gb,mem_bw_gbps,bf16_tflops,fp8_int8_tflops,interconnect_gbps,tdp_w,price_usd_hr,notes"


def _estimate(capsys, *args):
    assert edgepop_main(["estimate", "--model", L8, *args]) == 0
    return capsys.readouterr()


# ---------------------------------------------------------------- estimate: extrapolation warnings
def test_estimate_names_every_dimension_outside_the_calibration(capsys):
    args = ("--gpu", "T4", "--tp", "4", "--batch", "256", "--prompt-tokens", "7000")
    est = json.loads(_estimate(capsys, *args, "--json").out)
    text = " | ".join(est["warnings"])
    for part in ("GPU T4: no measured rows", "bf16 on T4", "tensor parallelism 4 over pcie",
                 "decode batch 256 is outside the fitted rows' 1-64", "prefill batch 256"):
        assert part in text, (part, text)
    int8 = json.loads(_estimate(capsys, *args, "--precision", "int8", "--json").out)
    assert any(w.startswith("precision int8 W8A8: no reference row runs it") and "int8 weight-only" in w
               for w in int8["warnings"])
    # the terminal table says it too, on stderr
    assert "warning: extrapolation: GPU T4" in _estimate(capsys, *args).err


def test_estimate_inside_the_calibration_has_no_warning_and_the_same_figures(capsys):
    est = json.loads(_estimate(capsys, "--gpu", "H100", "--json").out)
    assert est["warnings"] == []
    outside = json.loads(_estimate(capsys, "--gpu", "H100", "--batch", "256", "--json").out)
    assert outside["warnings"] and outside["prefill_ms"] == est["prefill_ms"]  # a warning changes no number


def test_image_estimate_says_what_its_profile_was_fitted_on_and_how_far_its_check_is(capsys):
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE
    from controlplane.perf_validation import holdout_report

    assert edgepop_main(["estimate", "--model", "@cf/microsoft/resnet-50", "--gpu", "L4", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    lines = est["warnings"]
    assert est["engine"] == "image-server"
    assert lines[0] == ("GPU L4: no fitted image row (the image server's profile is fitted on A100-80GB, H100, "
                        "H200); its dense peak times the profile's share of it")
    assert lines[1].startswith("precision fp16: the fitted image rows run int8")
    check = next(w for w in lines if w.startswith("image passes (image-server profile"))
    mape = holdout_report(path=HOLDOUT_IMAGE_FILE)["readings"]["other_release"]["mape"]
    assert f"MAPE {mape:.1%} over 5 rows" in check and "on L4, T4 (INT8" in check
    # on a fitted board at the fitted precision only the check's line is left
    assert edgepop_main(["estimate", "--model", "@cf/microsoft/resnet-50", "--gpu", "A100-80GB", "--precision",
                         "int8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [check]
    # a language model's estimate names no image check
    assert not any("MLPerf" in w for w in json.loads(_estimate(capsys, "--gpu", "L4", "--json").out)["warnings"])


# ---------------------------------------------------------------- measured profile
@pytest.fixture()
def profile():
    rows = [("gpt2-tiny", "prefill", b, t, 0, 10.0 * b * t / 16) for b in (1, 4) for t in (16, 128)]
    rows += [("gpt2-tiny", "decode", b, 0, c, 5.0 + b + c / 100) for b in (1, 4) for c in (16, 128)]
    table = pd.DataFrame([(*r, "CPU", "vm") for r in rows],
                         columns=["model", "phase", "batch_size", "tokens", "context", "ms", "provider", "host"])
    return MeasuredProfile(table)


def test_profile_warns_past_the_measured_table_once_per_axis(profile):
    spec = default_catalog()["@cf/meta/llama-3.2-1b-instruct"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        inside = profile.prefill_ms(spec, "L4", 100)
        assert not seen
        far = profile.prefill_ms(spec, "L4", 8000)
        profile.prefill_ms(spec, "L4", 9000)
        profile.decode_step_ms(spec, "L4", 64, 50)
    lines = [str(w.message) for w in seen]
    assert len(lines) == 2, lines
    assert "prefill tokens 8000" in lines[0] and "16-128" in lines[0] and "62.5x" in lines[0]
    assert "decode batch_size 64" in lines[1] and "1-4" in lines[1]
    assert far > inside  # (the figure is still the extrapolated one)


def test_a_profile_measuring_one_point_twice_is_refused_naming_the_file_rows(profile, tmp_path):
    table = profile.table
    twice = pd.concat([table, table.iloc[[5]].assign(ms=99.0)], ignore_index=True)
    twice.to_csv(tmp_path / "p.csv", index=False)
    with pytest.raises(DataFileError, match=r"p\.csv: rows 7, 10 measure the same point twice \(model gpt2-tiny, "
                                            r"phase decode, batch_size 1, tokens 0, context 128\)"):
        MeasuredProfile.load(tmp_path / "p.csv")
    other_host = pd.concat([table, table.assign(host="vm2")], ignore_index=True)  # two machines: no repeat
    assert len(MeasuredProfile(other_host, host="vm2").table) == len(table)


def test_profile_refuses_a_prompt_past_the_catalog_window(profile):
    spec = default_catalog()["@cf/meta/llama-3.2-1b-instruct"]
    with pytest.raises(UserError, match="exceeds the context window"):
        profile.prefill_ms(spec, "L4", spec.context_window + 1)


# ---------------------------------------------------------------- GPU table architectures
def test_shipped_gpu_tables_map_every_gpu_as_before():
    from controlplane.perf_rows import reference_gpus

    got = {name: (g.arch, g.has_fp8) for name, g in reference_gpus().items()}
    assert got == {"H100": ("hopper", True), "H200": ("hopper", True), "A100-80GB": ("ampere", False),
                   "L40S": ("ada", True), "L4": ("ada", True), "T4": ("turing", False), "A40": ("ampere", False)}


def test_custom_gpu_rows_take_the_architecture_their_notes_name(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text(f"{HEADER}\nL40,48,864,181,362,64,300,0.9,Ada Lovelace PCIe Gen4; FP8 tensor cores\n"
                    "T4G,16,320,65,130,32,70,0.3,Turing PCIe Gen3 (fp16 only)\n")
    gpus = gpu_table(load_gpus(path))
    assert gpus["L40"].arch == "ada" and gpus["L40"].has_fp8
    assert gpus["T4G"].arch == "turing" and gpus["T4G"].peak("flops32") == pytest.approx(65e12 / 8)


@pytest.mark.parametrize("notes", ["Blackwell; FP8", "Ampere successor like Hopper", ""])
def test_a_custom_gpu_without_one_known_architecture_is_refused(tmp_path, notes):
    path = tmp_path / "g.csv"
    path.write_text(f"{HEADER}\nX1,48,864,181,362,64,300,0.9,{notes}\n")
    with pytest.raises(DataFileError, match=r"g\.csv, row 2, field 'arch'.*'X1'.*hopper") as err:
        load_gpus(path)
    assert "\n" not in str(err.value)


def test_the_arch_column_is_used_and_validated(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text(f"{HEADER},arch\nX1,48,864,181,362,64,300,0.9,FP8 tensor cores,Ada\n")
    assert gpu_table(load_gpus(path))["X1"].arch == "ada"
    path.write_text(f"{HEADER},arch\nX1,48,864,181,362,64,300,0.9,,blackwell\n")
    with pytest.raises(DataFileError, match="row 2, field 'arch': unknown architecture 'blackwell'"):
        load_gpus(path)


# ---------------------------------------------------------------- Roofline.from_topology overrides
def test_a_plain_gemm_efficiency_applies_to_every_gpu(topo):
    plain = Roofline.from_topology(topo, gemm_efficiency=0.7)
    table = Roofline.from_topology(topo, gemm_efficiency={"ampere": 0.7, "hopper": 0.7, "ada": 0.7, "turing": 0.7})
    spec = default_catalog()[L8]
    for gpu in ("H100", "L4", "T4"):
        assert plain.prefill_ms(spec, gpu, 2048) == table.prefill_ms(spec, gpu, 2048)


@pytest.mark.parametrize(("name", "value"), [("bw_efficiency", 2.0), ("gemm_efficiency", 0.0),
                                             ("link_efficiency", {"nvlink": 1.5}), ("overlap_exponent", 0),
                                             ("gemm_half_tokens", math.nan), ("layer_floor_us", -1.0),
                                             ("allreduce_ll_latency_us", math.inf), ("fp8_gemm_factor", True)])
def test_an_override_out_of_range_is_refused(topo, name, value):
    with pytest.raises(UserError, match=rf"roofline parameter {name}\S* must be a finite number") as err:
        Roofline.from_topology(topo, **{name: value})
    assert "\n" not in str(err.value)


def test_an_empty_arch_cell_in_a_frame_built_in_code_is_not_an_architecture():
    """A frame's empty ``arch`` cell reads as NaN (truthy): the known type's architecture still applies."""
    import numpy as np

    table = load_gpus()
    table["arch"] = table["arch"].astype(object)
    table.loc[table.gpu == "H100", "arch"] = np.nan
    h100 = gpu_table(table)["H100"]
    assert h100.arch == "hopper" and h100.has_fp8
