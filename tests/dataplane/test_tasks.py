"""Workers-AI-shaped tasks, typed input errors, bring-your-own-model, sessions and the profile command."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from dataplane import byom, registry, tasks
from dataplane.audio import encode_wav
from dataplane.errors import InvalidInputError, ManifestError, ModelNotFoundError
from dataplane.profiler import COLUMNS
from dataplane.session import MAX_THREADS, SessionConfig, resolve_provider
from edgepop.cli import main


def _png(h=300, w=400) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_text_generation_shapes_and_streaming(dp):
    out = dp.run("gpt2-tiny", {"prompt": "Hi", "max_tokens": 7, "seed": 3})
    assert set(out) == {"response", "usage"} and isinstance(out["response"], str)
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}
    msgs = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "max_tokens": 5, "seed": 3, "stream": True}
    events = list(dp.run("gpt2-tiny", msgs))
    assert events[-1]["usage"]["completion_tokens"] == 5
    again = dp.run("gpt2-tiny", {**msgs, "stream": False})
    assert "".join(e["response"] for e in events) == again["response"]  # same seed, same text
    with pytest.raises(InvalidInputError, match="field 'lora'"):  # never silently the base model
        dp.run("gpt2-tiny", {"prompt": "Hi", "lora": "legal"})


def test_embeddings_classification_reranking(dp):
    emb = dp.run("bert-tiny-embed", {"text": "one"})
    assert emb["shape"] == [1, 256] and abs(np.linalg.norm(emb["data"][0]) - 1) < 1e-5
    cls = dp.run("bert-tiny-classify", {"text": "great movie"})
    assert [d["label"] for d in cls] in (["POSITIVE", "NEGATIVE"], ["NEGATIVE", "POSITIVE"])
    assert abs(sum(d["score"] for d in cls) - 1) < 1e-5 and cls[0]["score"] >= cls[1]["score"]
    rr = dp.run("bert-tiny-rerank", {"query": "q", "contexts": [{"text": "a"}, {"text": "b b"}, {"text": "c"}],
                                     "top_k": 2})
    scores = [r["score"] for r in rr["response"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert {r["id"] for r in rr["response"]} <= {0, 1, 2}


def test_image_and_speech(dp):
    top = dp.run("resnet-tiny", {"image": _png()})
    assert len(top) == 5 and all(set(d) == {"label", "score"} for d in top)
    assert top == dp.run("resnet-tiny", {"image": list(_png())})  # a byte array works too
    t = np.arange(16000) / 16000
    out = dp.run("ctc-tiny", {"audio": encode_wav(0.3 * np.sin(2 * np.pi * 440 * t))})
    assert set(out) == {"text", "word_count"} and isinstance(out["text"], str)
    assert set(out["text"]) <= set("abcdefghijklmnopqrstuvwxyz' ")


def test_envelope_says_when_weights_are_synthetic(dp):
    env = dp.envelope("gpt2-tiny", {"response": "x"})
    assert env["meta"]["synthetic_weights"] and "synthetic" in env["messages"][0]
    assert env["meta"]["provider"] == resolve_provider("auto")  # the machine's: CUDA where it loads
    assert dp.envelope("minilm-l6-v2", {})["messages"] == []


@pytest.mark.parametrize("model,inputs", [
    ("gpt2-tiny", {}),
    ("gpt2-tiny", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
    ("gpt2-tiny", {"prompt": 5}),
    ("gpt2-tiny", {"messages": [{"role": "robot", "content": "x"}]}),
    ("gpt2-tiny", {"messages": []}),
    ("gpt2-tiny", {"prompt": "x", "max_tokens": -1}),
    ("gpt2-tiny", {"prompt": "x", "stream": "yes"}),
    ("gpt2-tiny", "not a dict"),
    ("bert-tiny-embed", {"text": []}),
    ("bert-tiny-embed", {"text": ["ok", 3]}),
    ("bert-tiny-embed", {"text": ["x"] * 101}),
    ("bert-tiny-classify", {"text": None}),
    ("bert-tiny-rerank", {"query": "q", "contexts": ["not an object"]}),
    ("bert-tiny-rerank", {"query": "q", "contexts": []}),
    ("resnet-tiny", {"image": b"definitely not an image"}),
    ("resnet-tiny", {"image": [1, 2, 300]}),
    ("resnet-tiny", {"image": b""}),
    ("ctc-tiny", {"audio": b"RIFF....WAVEjunk"}),
    ("ctc-tiny", {"audio": encode_wav(np.zeros(100))}),
    # not Unicode (a lone surrogate), in every kind of text field
    ("gpt2-tiny", {"prompt": "a\ud800b"}),
    ("gpt2-tiny", {"messages": [{"role": "user", "content": "\udfff"}]}),
    ("bert-tiny-embed", {"text": ["fine", "a\ud800"]}),
    ("bert-tiny-rerank", {"query": "q", "contexts": [{"text": "\ud800"}]}),
    # a header with no sample rate; 2,000 samples at 1 sample/s (33 minutes, refused before it is resampled)
    ("ctc-tiny", {"audio": encode_wav(np.zeros(2000), rate=16_000)[:24] + b"\x00\x00\x00\x00"
                  + encode_wav(np.zeros(2000), rate=16_000)[28:]}),
    ("ctc-tiny", {"audio": encode_wav(np.zeros(2000), rate=1)}),
])
def test_malformed_inputs_raise_typed_errors(dp, model, inputs):
    with pytest.raises(InvalidInputError):
        dp.run(model, inputs)


def test_wrong_task_and_unknown_model(dp):
    with pytest.raises(InvalidInputError, match="serves text-generation"):
        tasks.text_embeddings(dp, "gpt2-tiny", {"text": "x"})
    with pytest.raises(ModelNotFoundError):
        dp.run("no-such-model", {})


def test_provider_resolution_is_quiet_cpu_here(capfd):
    assert resolve_provider("cpu") == "CPUExecutionProvider"
    assert resolve_provider("auto") in ("CPUExecutionProvider", "CUDAExecutionProvider")
    with pytest.raises(InvalidInputError):
        resolve_provider("tpu")
    assert "CUDA" not in capfd.readouterr().err


def test_an_empty_provider_variable_means_auto(monkeypatch):
    monkeypatch.setenv("EDGEPOP_PROVIDER", "")
    assert resolve_provider("auto") in ("CPUExecutionProvider", "CUDAExecutionProvider")


def test_a_bad_provider_variable_is_named_as_the_source(monkeypatch):
    monkeypatch.setenv("EDGEPOP_PROVIDER", "GPU")
    want = "unknown provider 'gpu' (from $EDGEPOP_PROVIDER='GPU'); expected one of auto, cpu, cuda"
    with pytest.raises(InvalidInputError, match=re.escape(want)):
        resolve_provider("auto")
    assert resolve_provider("cpu") == "CPUExecutionProvider"  # an explicit choice wins over the variable
    # a fresh process: this one may hold sessions already opened, which the variable no longer affects
    proc = subprocess.run([sys.executable, "-m", "edgepop", "profile", "--models", "bert-tiny-embed", "--quick"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, f"edgepop: error: {want}\n")
    monkeypatch.delenv("EDGEPOP_PROVIDER")
    with pytest.raises(InvalidInputError) as exc:
        resolve_provider("tpu")
    assert "EDGEPOP_PROVIDER" not in str(exc.value)


@pytest.mark.parametrize("field,value,want", [
    ("optimization", "max", "SessionConfig.optimization must be one of basic, extended, all, got 'max'"),  # KeyError
    ("intra_op_threads", -2, f"SessionConfig.intra_op_threads: -2 is not an integer from 0 (one per core) to "
                             f"{MAX_THREADS}"),
    ("inter_op_threads", 10**6, "SessionConfig.inter_op_threads: 1000000 is not an integer"),
    ("intra_op_threads", True, "SessionConfig.intra_op_threads: True is not an integer"),
    ("provider", "gpu", "SessionConfig.provider must be one of auto, cpu, cuda, got 'gpu'"),
    ("allow_spinning", "no", "SessionConfig.allow_spinning must be true or false, got 'no'"),
])
def test_session_config_refuses_bad_fields_when_built(field, value, want):
    with pytest.raises(ValueError, match="^" + re.escape(want)):
        SessionConfig(**{field: value})


def test_session_config_accepts_its_edges():
    cfg = SessionConfig(provider="CPU", intra_op_threads=MAX_THREADS, inter_op_threads=0, optimization="basic")
    assert cfg.intra_op_threads == MAX_THREADS and SessionConfig(provider=None).provider is None


def _byom_dir(tmp_path, manifest: dict) -> str:
    src = registry.load("resnet-tiny").session.path
    shutil.copy(src, tmp_path / "net.onnx")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return str(path)


def test_bring_your_own_image_model(dp, tmp_path):
    manifest = {"name": "my-resnet", "task": "image-classification", "model": "net.onnx",
                "inputs": {"pixel_values": {"dtype": "float32", "shape": ["batch", 3, 224, 224]}},
                "outputs": {"logits": {"dtype": "float32"}},
                "labels": [f"thing {i}" for i in range(1000)]}
    byom.register_manifest(_byom_dir(tmp_path, manifest), replace=True)
    out = dp.run("my-resnet", {"image": _png()})
    assert out[0]["label"].startswith("thing ")
    assert [d["score"] for d in out] == [d["score"] for d in dp.run("resnet-tiny", {"image": _png()})]


@pytest.mark.parametrize("change", [
    {"inputs": {"images": {"dtype": "float32"}}},
    {"inputs": {"pixel_values": {"dtype": "int64"}}},
    {"outputs": {"probs": {}}},
    {"task": "telepathy"},
    {"model": "missing.onnx"},
    {"labels": ["only", "three", "labels"]},
    {"name": 42},
    {"outputs": {"pixel_values": {}}},  # an input named as the output
    {"inputs": {"pixel_values": {"dtype": "float32", "shape": ["batch", 3, 64, 64]}}},  # not the graph's shape
    {"inputs": {"pixel_values": 5}},
    {"labels": "abc"},
])
def test_bad_manifests_raise_manifest_errors(tmp_path, change):
    manifest = {"name": "bad", "task": "image-classification", "model": "net.onnx",
                "inputs": {"pixel_values": {"dtype": "float32"}}, "outputs": {"logits": {}}, **change}
    with pytest.raises(ManifestError):
        byom.load_manifest(_byom_dir(tmp_path, manifest))


def test_bring_your_own_text_classifier(dp, tmp_path):
    src = registry.load("bert-tiny-classify").session.path
    shutil.copy(src, tmp_path / "enc.onnx")
    manifest = {"name": "my-classifier", "task": "text-classification", "model": "enc.onnx",
                "inputs": {k: {"dtype": "int64"} for k in ("input_ids", "attention_mask", "token_type_ids")},
                "outputs": {"logits": {}}, "labels": ["NEGATIVE", "POSITIVE"], "tokenizer": "bytes"}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    byom.register_manifest(tmp_path / "m.json", replace=True)
    assert dp.run("my-classifier", {"text": "fine"}) == dp.run("bert-tiny-classify", {"text": "fine"})


def test_profile_command_writes_the_simulator_table(tmp_path, capsys):
    out = tmp_path / "profile.csv"
    assert main(["profile", "--models", "gpt2-tiny,bert-tiny-embed,resnet-tiny,ctc-tiny", "--quick",
                 "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == COLUMNS
    assert set(table.phase) == {"prefill", "decode", "encode", "image", "audio"}
    assert (table.ms > 0).all() and set(table.provider) == {resolve_provider("auto")}
    dec = table[(table.phase == "decode") & (table.context == 256)].set_index("batch_size").ms
    # both batch sizes measured; no timing comparison here (shared CI cores make it flaky): benchmarks/ do that
    assert {1, 8} <= set(dec.index) and dec.notna().all()
    pq = tmp_path / "p.parquet"
    assert main(["profile", "--models", "bert-tiny-embed", "--quick", "--out", str(pq)]) == 0
    assert list(pd.read_parquet(pq).columns) == COLUMNS


def test_profile_command_user_errors_exit_2(capsys):
    assert main(["profile", "--models", "gpt9-huge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgepop: error: no model named 'gpt9-huge'") and "Traceback" not in err
    assert main(["profile", "--models", ","]) == 2
    capsys.readouterr()
    assert main(["profile", "--models", "resnet-tiny, resnet-tiny", "--quick"]) == 2  # (measured twice, written twice)
    assert capsys.readouterr().err.strip() == "edgepop: error: --models names resnet-tiny more than once"
    assert main(["profile", "--list-models"]) == 0
    assert "minilm-l6-v2" in capsys.readouterr().out


def test_text_manifests_are_checked_against_the_graph(tmp_path):
    src = registry.load("bert-tiny-classify").session.path
    shutil.copy(src, tmp_path / "enc.onnx")
    base = {"name": "c", "task": "text-classification", "model": "enc.onnx",
            "inputs": {k: {"dtype": "int64"} for k in ("input_ids", "attention_mask", "token_type_ids")},
            "outputs": {"logits": {}}, "labels": ["NEGATIVE", "POSITIVE"], "tokenizer": "bytes"}
    (tmp_path / "bogus.json").write_text("{}")
    for change, needle in (({"labels": ["a", "b", "c"]}, "3 labels, but the output"),
                           ({"task": "text-reranking"}, "reranker's output must be [N,1]"),
                           ({"tokenizer": ""}, "neither 'bytes' nor an existing file"),
                           ({"tokenizer": "."}, "neither 'bytes' nor an existing file"),
                           ({"tokenizer": "bogus.json"}, "not a Hugging Face tokenizer.json")):
        (tmp_path / "m.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(ManifestError, match=re.escape(needle)):
            byom.load_manifest(tmp_path / "m.json")
    (tmp_path / "m.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        byom.load_manifest(tmp_path / "m.json")


def test_profile_out_under_the_home_folder(tmp_path, monkeypatch):
    from dataplane import profiler

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(profiler, "profile", lambda *a, **k: pd.DataFrame({"ms": [1.0]}))  # (not what is tested)
    assert main(["profile", "--models", "bert-tiny-embed", "--out", "~/p.csv"]) == 0
    assert (home / "p.csv").is_file() and not (cwd / "~").exists()
