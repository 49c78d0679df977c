"""Bring-your-own text models: manifests whose graph cannot serve every tokenized text are refused up front."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dataplane import byom
from dataplane.errors import ManifestError
from dataplane.service import DataPlane


def _embedder(tmp_path, seq, vocab: int, quantized: bool = False, **manifest) -> str:
    """A tiny embedding graph (Gather from a [vocab, 4] table, mean over tokens) and its manifest."""
    table = np.random.default_rng(0).standard_normal((vocab, 4)).astype(np.float32)
    nodes, inits = [], []
    if quantized:  # the table as int8 quantization leaves it: DequantizeLinear in front of the Gather
        inits += [numpy_helper.from_array(np.clip(table * 40, -127, 127).astype(np.int8), "table_q"),
                  numpy_helper.from_array(np.array(1 / 40, np.float32), "scale")]
        nodes.append(helper.make_node("DequantizeLinear", ["table_q", "scale"], ["table"]))
    else:
        inits.append(numpy_helper.from_array(table, "table"))
    nodes += [helper.make_node("Gather", ["table", "input_ids"], ["h"]),
              helper.make_node("ReduceMean", ["h"], ["emb"], axes=[1], keepdims=0)]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq])
    emb = helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph(nodes, "g", [ids], [emb], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / "emb.onnx")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "my-embedder", "task": "text-embeddings", "model": "emb.onnx",
                                "inputs": {"input_ids": {}}, "outputs": {"emb": {}}, **manifest}))
    return str(path)


def test_a_fixed_sequence_length_is_refused_at_registration(tmp_path):
    path = _embedder(tmp_path, 8, 300)
    with pytest.raises(ManifestError, match=re.escape(f"{path}: text input 'input_ids' has shape ['batch', 8] "
                                                      "in the graph; it must be [batch, sequence] with a free "
                                                      "sequence axis (axis 1)")):
        byom.register_manifest(path, replace=True)
    path = _embedder(tmp_path, "seq", 300, inputs={"input_ids": {"shape": ["batch", 8]}})
    with pytest.raises(ManifestError, match=re.escape("has shape ['batch', 8] in the manifest")):
        byom.load_manifest(path)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_vocabulary_smaller_than_the_tokenizers_is_refused(tmp_path, quantized):
    path = _embedder(tmp_path, "seq", 100, quantized)
    with pytest.raises(ManifestError, match=re.escape(f"{path}: tokenizer 'bytes' has 259 token ids but the "
                                                      "graph's embedding table for 'input_ids' has 100 rows")):
        byom.register_manifest(path, replace=True)


def test_a_free_sequence_axis_and_a_large_enough_vocabulary_serve_any_text(tmp_path):
    byom.register_manifest(_embedder(tmp_path, "seq", 259, quantized=True), replace=True)
    with DataPlane() as dp:
        out = dp.run("my-embedder", {"text": ["hello world", "a much longer text than that one, with ÿ in it"]})
    assert out["shape"] == [2, 4] and np.isfinite(out["data"]).all()


def test_a_text_without_attention_mask_gets_the_same_vector_alone_and_batched(tmp_path):
    """The graph has no attention_mask: padding a text to a longer batch-mate made it average over [PAD] too, so
    its vector depended on what it was batched with. An [N,C] embedding is a unit vector, as the docs say."""
    byom.register_manifest(_embedder(tmp_path, "seq", 259), replace=True)
    with DataPlane() as dp:
        alone = dp.run("my-embedder", {"text": "hello world"})["data"][0]
        batched = dp.run("my-embedder", {"text": ["hello world", "hello world, friend", "hello world"]})["data"]
    # (equal up to float rounding: onnxruntime may sum a batch of rows in another order than one row)
    np.testing.assert_allclose(batched[0], alone, rtol=0, atol=1e-6)
    np.testing.assert_allclose(batched[2], alone, rtol=0, atol=1e-6)
    assert np.linalg.norm(alone) == pytest.approx(1.0, abs=1e-6)
    assert np.linalg.norm(batched[1]) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("value", ["false", 0, None, [False]])
def test_synthetic_must_be_a_json_boolean(tmp_path, value):
    path = _embedder(tmp_path, "seq", 300, synthetic=value)
    with pytest.raises(ManifestError, match=re.escape(f"{path}: field 'synthetic' must be true or false "
                                                      f"(a JSON boolean), got {value!r}")):
        byom.load_manifest(path)
    assert byom.load_manifest(_embedder(tmp_path, "seq", 300, synthetic=False)).synthetic is False
    assert byom.load_manifest(_embedder(tmp_path, "seq", 300, synthetic=True)).synthetic is True


def test_a_position_table_shorter_than_the_tokenizer_cuts_texts_at_its_rows(tmp_path):
    """A BERT-style graph adds a 16-row learned position table (Gather over Range(0, seq)): a 47-byte text failed
    in onnxruntime's Add; the tokenizer now cuts texts at the table's rows."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((300, 4)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "pos"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("Shape", ["input_ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["ids"]), helper.make_node("Gather", ["pos", "ids"], ["p"]),
             helper.make_node("Gather", ["table", "input_ids"], ["h"]), helper.make_node("Add", ["h", "p"], ["hp"]),
             helper.make_node("ReduceMean", ["hp"], ["emb"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                         ["batch", "seq"])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "pos.onnx")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "my-positions", "task": "text-embeddings", "model": "pos.onnx",
                                "inputs": {"input_ids": {}}, "outputs": {"emb": {}}}))
    byom.register_manifest(path, replace=True)
    with DataPlane() as dp:
        out = dp.run("my-positions", {"text": ["a much longer text than sixteen bytes, surely", "hi"]})
    assert out["shape"] == [2, 4] and np.isfinite(out["data"]).all()


def test_a_token_type_buffer_is_no_position_table():
    """Hugging Face BERT exports without a token_type_ids input slice a stored zero buffer for it: its 2-row table
    is no position table (it was read as one, and the manifest refused as too short); the stored position_ids
    buffer's 128-row table is."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((300, 4)).astype(np.float32), "word"),
             numpy_helper.from_array(rng.standard_normal((128, 4)).astype(np.float32), "pos"),
             numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "tok_type"),
             numpy_helper.from_array(np.arange(128, dtype=np.int64)[None, :], "embeddings.position_ids"),
             numpy_helper.from_array(np.zeros((1, 128), np.int64), "embeddings.token_type_ids"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([1], np.int64), "one1"), numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("Shape", ["input_ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Slice", ["embeddings.position_ids", "zero1", "n1", "one1"], ["pids"]),
             helper.make_node("Slice", ["embeddings.token_type_ids", "zero1", "n1", "one1"], ["tt"]),
             helper.make_node("Expand", ["tt", "shape"], ["tte"]),
             helper.make_node("Gather", ["word", "input_ids"], ["w"]), helper.make_node("Gather", ["pos", "pids"], ["p"]),
             helper.make_node("Gather", ["tok_type", "tte"], ["t"]),
             helper.make_node("Add", ["w", "p"], ["wp"]), helper.make_node("Add", ["wp", "t"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["emb"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                         ["batch", "seq"])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", 4])], inits)
    assert byom._position_rows(graph) == 128
