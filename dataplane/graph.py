"""A small helper for building ONNX graphs from code (names generated, initializers collected).

All zoo models are written with it, so the IR/opset settings that onnxruntime accepts live in one place:
onnx>=1.23 writes IR version 14 by default, which onnxruntime 1.31 rejects, so we pin IR 10 / opset 18.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 18

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


NORMAL_BLOCK = 1 << 20  # values drawn per call of normal_f32: a float64 block of 8 MB, reused by the allocator


def normal_f32(rng: np.random.Generator, std: float, shape: tuple[int, ...]) -> np.ndarray:
    """Bit for bit ``rng.normal(0, std, shape).astype(np.float32)``, leaving ``rng`` in the same state: the
    generator draws its values one after another, so drawing them a block at a time into the float32 array gives
    the same values without the full-size float64 temporary (for GPT-2 small's embedding, 0.3 GB of fresh pages,
    which cost more than drawing the numbers: 1.4 s against 3.5 s for its 124M weights)."""
    out = np.empty(shape, dtype=np.float32)
    flat = out.reshape(-1)
    for s in range(0, flat.size, NORMAL_BLOCK):
        flat[s:s + NORMAL_BLOCK] = rng.normal(0, std, min(NORMAL_BLOCK, flat.size - s))
    return out


class GraphBuilder:
    """Accumulates nodes, initializers, inputs and outputs; ``op`` returns the output name(s)."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._ids = itertools.count()
        self._consts: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        """A new unique tensor name."""
        return f"{hint}_{next(self._ids)}"

    def input(self, name: str, dtype: np.dtype | type, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, _NP_TO_ONNX[np.dtype(dtype)], shape))
        return name

    def output(self, name: str, dtype: np.dtype | type, shape: list) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, _NP_TO_ONNX[np.dtype(dtype)], shape))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        """Add an initializer (weights are stored as float32 unless they are integer tensors)."""
        arr = np.asarray(array)
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32, copy=False)
        # from_array copies the values (C order, whatever the array's layout) into the tensor: no copy before it,
        # which for GPT-2 small's 124M weights was two more passes over 0.5 GB (~4 s of a 14 s build)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        """A small constant (deduplicated), e.g. shapes, axes, scalars."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(self.fresh("const"), arr)
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, out: str | list[str] | None = None, **attrs):
        """Append a node; returns its single output name, or a list when ``n_out`` > 1."""
        if out is None:
            outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        else:
            outs = [out] if isinstance(out, str) else list(out)
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(f"n_{op_type}"), **attrs))
        return outs[0] if len(outs) == 1 else outs

    # ----- common layers -------------------------------------------------------------------------------
    def linear(self, x: str, w: np.ndarray, b: np.ndarray | None, name: str) -> str:
        """x @ w (+ b), with ``w`` in [in, out] layout."""
        y = self.op("MatMul", [x, self.weight(f"{name}.w", w)])
        if b is not None:
            y = self.op("Add", [y, self.weight(f"{name}.b", b)])
        return y

    def layer_norm(self, x: str, g: np.ndarray, b: np.ndarray, name: str, eps: float) -> str:
        return self.op(
            "LayerNormalization", [x, self.weight(f"{name}.g", g), self.weight(f"{name}.b", b)], axis=-1, epsilon=eps
        )

    def gelu_erf(self, x: str) -> str:
        """Exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (BERT); onnxruntime fuses this pattern."""
        e = self.op("Erf", [self.op("Div", [x, self.const(np.sqrt(2.0), np.float32)])])
        return self.op("Mul", [self.op("Mul", [x, self.const(0.5, np.float32)]), self.op("Add", [e, self.const(1.0, np.float32)])])

    def gelu_tanh(self, x: str) -> str:
        """GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        x3 = self.op("Mul", [self.op("Mul", [x, x]), x])
        inner = self.op("Add", [x, self.op("Mul", [x3, self.const(0.044715, np.float32)])])
        t = self.op("Tanh", [self.op("Mul", [inner, self.const(np.sqrt(2.0 / np.pi), np.float32)])])
        return self.op("Mul", [self.op("Mul", [x, self.const(0.5, np.float32)]), self.op("Add", [t, self.const(1.0, np.float32)])])

    def build(self, doc: str = "") -> onnx.ModelProto:
        """The finished, checked model with the pinned IR version and opset."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgepop")
        model.ir_version = IR_VERSION
        model.doc_string = doc
        onnx.checker.check_model(model, full_check=False)
        return model
