"""int8 quantization: file size, output drift against fp32 (bounds from measured figures with margin).

Measured on this code (benchmarks/bench_quant_lora.py): MiniLM cosine mean 0.993 / min 0.990 and size
ratio 3.96; gpt2-tiny top-1 agreement 0.968, relative L2 logit error 0.030; resnet-tiny (static QDQ)
relative L2 0.018. A per-tensor or reduced-range quantization already misses these bounds (MiniLM cosine
0.965 / 0.880), and a broken one misses them by far. Latency is reported, never asserted.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from dataplane import quantize
from dataplane.errors import InvalidInputError


def test_minilm_dynamic_int8_keeps_embeddings(tmp_path):
    fig = quantize.quantize_and_measure("minilm-l6-v2", tmp_path, repeats=2)
    assert fig["method"] == "dynamic" and fig["sentences"] == len(quantize.SENTENCES)
    assert fig["size_ratio"] >= 3.5  # fp32 90 MB -> int8 23 MB (weights and embeddings are int8)
    assert fig["cosine_mean"] >= 0.98 and fig["cosine_min"] >= 0.97
    assert fig["cosine_mean"] < 1.0 - 1e-5  # it really is a different (int8) graph, not the fp32 one
    assert fig["ms_int8"] > 0 and fig["ms_fp32"] > 0


def _matmul_integer_count(path) -> int:
    return sum(n.op_type == "MatMulInteger" for n in onnx.load(str(path)).graph.node)


def test_gpt2_dynamic_int8_keeps_next_token(tmp_path):
    fig = quantize.quantize_and_measure("gpt2-tiny", tmp_path, repeats=2)
    assert fig["size_ratio"] >= 3.5
    assert _matmul_integer_count(fig["int8_path"]) == 4 * 6 + 1  # 4 projections x 6 layers + the tied LM head
    assert fig["positions"] == len(quantize.SENTENCES) * 37  # 40 tokens, first prediction after 4
    assert fig["top1_agreement"] >= 0.93
    assert 1e-4 < fig["logit_rel_l2"] <= 0.06


def test_resnet_static_int8_with_seeded_calibration(tmp_path):
    fig = quantize.quantize_and_measure("resnet-tiny", tmp_path, repeats=2)
    assert fig["method"] == "static-qdq" and fig["size_ratio"] >= 3.0
    assert 1e-4 < fig["logit_rel_l2"] <= 0.05 and fig["top1_agreement"] >= 0.75
    again = quantize.quantize_and_measure("resnet-tiny", tmp_path / "again", repeats=1)
    assert again["logit_max_abs"] == fig["logit_max_abs"]  # seeded calibration: the same int8 model


def test_int8_lm_generation_path_runs_with_cache(tmp_path, lm):
    """The int8 file serves through the same LanguageModel class (prefill + cached steps agree)."""
    from dataplane.runtime import LanguageModel

    path = quantize.quantize_file(lm.session.path, tmp_path / "q.onnx", "gpt2")
    q = LanguageModel("gpt2-tiny-int8", lm.spec, path)
    kept = quantize.quantize_file(lm.session.path, tmp_path / "kept.onnx", "gpt2", fold_transposes=False)
    assert _matmul_integer_count(kept) == 4 * 6  # the head stays an fp32 MatMul on Transpose(wte)
    ids = np.array([q.tokenizer.encode("int8 at the edge, cached")], np.int64)
    steps = quantize.lm_position_logits(q, ids, n_prompt=4)
    full = q.prefill([list(ids[0])])[0]
    # Dynamic activation ranges differ between a 1-token step and a full prefill, so allow int8 noise.
    assert np.abs(steps[0, -1] - full[0]).max() < 0.1
    assert steps[0, -1].argmax() == full[0].argmax()


def test_quantize_cli_and_errors(tmp_path, capsys):
    from edgepop.cli import main

    assert main(["quantize", "resnet-tiny", "--out", str(tmp_path), "--repeats", "1"]) == 0
    fig = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert fig["model"] == "resnet-tiny" and (tmp_path / "resnet-tiny.int8.onnx").is_file()
    assert main(["quantize", "ctc-tiny", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "ctc-tiny" in err and "\n" not in err
    with pytest.raises(InvalidInputError, match="repeats"):
        quantize.quantize_and_measure("resnet-tiny", tmp_path, repeats=0)
    # a folder of the user's named like the output file: refused before the model is loaded, and left alone
    (tmp_path / "mine" / "resnet-tiny.int8.onnx").mkdir(parents=True)
    (tmp_path / "mine" / "resnet-tiny.int8.onnx" / "keep.txt").write_text("mine")
    assert main(["quantize", "resnet-tiny", "--out", str(tmp_path / "mine"), "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "resnet-tiny.int8.onnx is a folder" in err and "\n" not in err, err
    assert (tmp_path / "mine" / "resnet-tiny.int8.onnx" / "keep.txt").read_text() == "mine"


def test_int8_base_serves_lora_adapters(tmp_path, lm):
    """QLoRA-style serving: int8 base projections, fp32 low-rank side path fed per request."""
    from dataplane import lora

    fp32 = lora.LoraLanguageModel("gpt2-tiny", lm.spec, lm.session.path)
    int8 = quantize.int8_copy(fp32, tmp_path / "lora.int8.onnx", "gpt2")
    graph = onnx.load(str(int8.session.path)).graph
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 25  # base only; 48 LoRA MatMuls stay fp32
    ad = lora.random_adapter(lm.spec, 8, 16.0, np.random.default_rng(4))
    ids = np.array([fp32.tokenizer.encode(s)[:24] for s in quantize.SENTENCES[:8]], np.int64)
    out = {}
    for tag, model in (("f", fp32), ("q", int8)):
        for key, adapter in (("base", None), ("lora", ad)):
            model.adapters = adapter
            out[tag, key] = quantize.lm_position_logits(model, ids)
    f, q = out["f", "lora"], out["q", "lora"]
    assert np.linalg.norm(q - f) / np.linalg.norm(f) <= 0.06
    assert (q.argmax(-1) == f.argmax(-1)).mean() >= 0.9
    d_f, d_q = f - out["f", "base"], q - out["q", "base"]  # the adapter's effect survives quantization
    assert np.linalg.norm(d_f) / np.linalg.norm(f) > 0.2
    assert (d_f * d_q).sum() / (np.linalg.norm(d_f) * np.linalg.norm(d_q)) >= 0.99


def test_a_scoring_heads_drift_is_its_logits_change_not_a_cosine():
    """(The cosine of one logit is +-1 whatever the int8 model does.)"""
    from dataplane.quantize import head_drift

    class Head:
        def __init__(self, shift):
            self.shift = shift

        def encode(self, text):
            return text

        def run(self, encs):
            return [np.array([float(len(t)) + self.shift], np.float32) for t in encs]

    d = head_drift(Head(0.0), Head(0.05), sentences=["a", "bb", "ccc"])
    assert d["logit_max_abs"] == pytest.approx(0.05, abs=1e-6)
    assert d["logit_rel_l2"] == pytest.approx(0.05 * 3 ** 0.5 / 14 ** 0.5, rel=1e-5)
    assert d["top1_agreement"] is None  # one score per input: no class to agree on


def test_out_under_the_home_folder(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    fig = quantize.quantize_and_measure("resnet-tiny", "~/q", repeats=1)
    assert fig["int8_path"] == str(home / "q" / "resnet-tiny.int8.onnx") and not (cwd / "~").exists()


def test_a_failed_quantization_leaves_no_half_written_file(tmp_path, lm, monkeypatch):
    """The int8 file is written beside its name and renamed into place: a quantizer that fails part-way leaves
    neither a truncated model under the output's name nor its folded intermediate."""
    def broken(src, dst, **kw):
        with open(dst, "wb") as fh:
            fh.write(b"half a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quantize, "quantize_dynamic", broken)
    (tmp_path / "q.onnx").write_bytes(b"an earlier run's")
    with pytest.raises(OSError):
        quantize.quantize_file(lm.session.path, tmp_path / "q.onnx", "gpt2")
    assert (tmp_path / "q.onnx").read_bytes() == b"an earlier run's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]
