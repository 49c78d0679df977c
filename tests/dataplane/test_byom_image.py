"""Bring-your-own image models: a [N,C,1,1] head (a 1x1 convolution, SqueezeNet-style) serves as [N,C]; other
output shapes, and files the installed onnxruntime cannot load, are refused at registration in one line."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dataplane import byom
from dataplane.errors import ManifestError
from dataplane.service import DataPlane


def _image_model(tmp_path, out_shape: list, ir_version: int = 8, **manifest) -> str:
    """Global average pool of a [N,3,8,8] image and a 1x1 convolution (identity weights), [N,3,1,1], then a node
    that makes ``out_shape`` of it (or of the image); returns the manifest's path."""
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1), "w")
    inits = [w]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w"], ["c"])]
    if out_shape == ["N", 3, 2, 2]:
        nodes.append(helper.make_node("MaxPool", ["x"], ["logits"], kernel_shape=[4, 4], strides=[4, 4]))
    elif out_shape == ["N"]:
        nodes.append(helper.make_node("ReduceMean", ["c"], ["logits"], axes=[1, 2, 3], keepdims=0))
    else:  # the same elements in another shape: [N,3,1,1] itself, [N,1,3]
        inits.append(numpy_helper.from_array(np.array([0, *out_shape[1:]], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["c", "shape"], ["logits"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    onnx.save(model, tmp_path / "img.onnx")
    path = tmp_path / "img.json"
    path.write_text(json.dumps({"name": "my-squeeze", "task": "image-classification", "model": "img.onnx",
                                "inputs": {"x": {}}, "outputs": {"logits": {}}, **manifest}))
    return str(path)


def _png(rgb) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), rgb).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("labels", [None, ["r", "g", "b"]])
def test_a_head_with_trailing_unit_axes_serves_as_n_by_c(tmp_path, labels):
    path = _image_model(tmp_path, ["N", 3, 1, 1], **({"labels": labels} if labels else {}))
    card = byom.register_manifest(path, replace=True)
    with DataPlane() as dp:
        model = dp.model(card.name)
        assert model.spec.num_classes == 3
        red = dp.run(card.name, {"image": _png((250, 10, 10))})
        assert red[0]["label"] == (labels[0] if labels else "class_000")  # the red channel's class wins
        assert abs(sum(r["score"] for r in red) - 1) < 1e-5
        batch = model.run([model.preprocess(_png((250, 10, 10))), model.preprocess(_png((10, 10, 250)))])
        assert [p.shape for p in batch] == [(3,), (3,)] and [int(np.argmax(p)) for p in batch] == [0, 2]


@pytest.mark.parametrize("shape", [["N", 3, 2, 2], ["N", 1, 3], ["N"]])
def test_an_output_that_is_not_n_by_c_is_refused_at_registration(tmp_path, shape):
    path = _image_model(tmp_path, shape)
    with pytest.raises(ManifestError, match=re.escape(f"{path}: an image model's output 'logits' must be [N,C] "
                                                      f"(trailing 1-sized axes are dropped), got {shape}")):
        byom.register_manifest(path, replace=True)


def test_a_file_onnxruntime_cannot_load_is_refused_at_registration(tmp_path):
    path = _image_model(tmp_path, ["N", 3, 1, 1], ir_version=99)  # newer than any onnxruntime reads
    with pytest.raises(ManifestError) as e:
        byom.register_manifest(path, replace=True)
    msg = str(e.value)
    assert msg.startswith(f"{path}: onnxruntime ") and "cannot load img.onnx (ONNX IR version 99" in msg
    assert "IR version" in msg.split("): ", 1)[1] and "\n" not in msg and len(msg) < 400
