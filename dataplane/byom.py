"""Bring your own model: register any ONNX file described by a small JSON manifest.

Example manifest (paths are relative to the manifest)::

    {
      "name": "my-resnet",
      "task": "image-classification",
      "model": "resnet.onnx",
      "inputs": {"pixel_values": {"dtype": "float32", "shape": ["batch", 3, 224, 224]}},
      "outputs": {"logits": {"dtype": "float32"}},
      "labels": ["cat", "dog"]
    }

Supported tasks: ``image-classification`` (one float input ``[N,3,S,S]``, logits output),
``text-embeddings`` (an ``[N,C]`` embedding output, or an ``[N,T,C]`` hidden state that is mean-pooled),
``text-classification`` and ``text-reranking`` (logits). Text models take some of ``input_ids``,
``attention_mask``, ``token_type_ids`` and name a ``tokenizer``: ``"bytes"`` or a Hugging Face
``tokenizer.json``. The manifest is checked against the ONNX file's real inputs and outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

from dataplane import registry, runtime
from dataplane.errors import ManifestError
from dataplane.tokenization import ByteEncoderTokenizer, WordPieceTokenizer

BYOM_TASKS = ("image-classification", "text-embeddings", "text-classification", "text-reranking")
TEXT_INPUTS = {"input_ids", "attention_mask", "token_type_ids"}
_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
           onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BOOL: "bool"}


@dataclass(frozen=True)
class ByomSpec:
    """The little that runtime classes need to know about a brought-in model."""

    head: str = "embed"
    vocab_size: int = 0
    num_classes: int = 0
    image_size: int = 224


def _graph_io(path: Path) -> tuple[dict, dict]:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises several types for unreadable files
        raise ManifestError(f"{path}: not a readable ONNX file ({exc})") from exc
    init = {i.name for i in model.graph.initializer}

    def io(values):
        out = {}
        for v in values:
            if v.name in init:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
            out[v.name] = {"dtype": _DTYPES.get(t.elem_type, str(t.elem_type)), "shape": dims}
        return out

    return io(model.graph.input), io(model.graph.output)


def load_manifest(path: str | Path) -> registry.ModelCard:
    """Read and check a manifest; returns the model card (not yet registered)."""
    path = Path(path)
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc})") from exc

    def need(key, types):
        if not isinstance(m, dict) or not isinstance(m.get(key), types):
            raise ManifestError(f"{path}: field '{key}' is missing or has the wrong type")
        return m[key]

    name, task = need("name", str), need("task", str)
    onnx_path = (path.parent / need("model", str)).resolve()
    inputs, outputs = need("inputs", dict), need("outputs", dict)
    if task not in BYOM_TASKS:
        raise ManifestError(f"{path}: task '{task}' is not supported; use one of {', '.join(BYOM_TASKS)}")
    if not onnx_path.exists():
        raise ManifestError(f"{path}: model file {onnx_path} does not exist")
    g_in, g_out = _graph_io(onnx_path)
    if set(inputs) != set(g_in):
        raise ManifestError(f"{path}: inputs {sorted(inputs)} do not match the graph's {sorted(g_in)}")
    for key, decl in [*inputs.items(), *outputs.items()]:
        graph = g_in.get(key) or g_out.get(key)
        if graph is None:
            raise ManifestError(f"{path}: output '{key}' is not an output of the graph ({sorted(g_out)})")
        if isinstance(decl, dict) and decl.get("dtype") not in (None, graph["dtype"]):
            raise ManifestError(f"{path}: '{key}' is {graph['dtype']} in the graph, not {decl['dtype']}")
    if len(outputs) != 1:
        raise ManifestError(f"{path}: name exactly one output")
    output = next(iter(outputs))
    labels = tuple(m.get("labels") or ())

    if task == "image-classification":
        if len(inputs) != 1:
            raise ManifestError(f"{path}: an image model takes exactly one input")
        in_name = next(iter(inputs))
        shape = g_in[in_name]["shape"]
        if len(shape) != 4 or shape[1] != 3 or not isinstance(shape[-1], int):
            raise ManifestError(f"{path}: image input must be [N,3,S,S] with a fixed S, got {shape}")
        n_cls = g_out[output]["shape"][-1]
        if not isinstance(n_cls, int):
            raise ManifestError(f"{path}: the output's class dimension must be fixed")
        if labels and len(labels) != n_cls:
            raise ManifestError(f"{path}: {len(labels)} labels for {n_cls} classes")
        spec = ByomSpec(num_classes=n_cls, image_size=shape[-1])

        def loader(config):
            return runtime.ImageClassifier(name, spec, onnx_path, config, input_name=in_name, labels=labels,
                                           synthetic=bool(m.get("synthetic", False)))
    else:
        if not set(inputs) <= TEXT_INPUTS or "input_ids" not in inputs:
            raise ManifestError(f"{path}: text inputs must be input_ids and optionally attention_mask, "
                                "token_type_ids")
        tok_decl = m.get("tokenizer", "bytes")
        if tok_decl != "bytes" and not (path.parent / str(tok_decl)).exists():
            raise ManifestError(f"{path}: tokenizer '{tok_decl}' is neither 'bytes' nor an existing file")
        head = {"text-embeddings": "embed", "text-classification": "classify", "text-reranking": "rerank"}[task]
        if task == "text-classification" and not labels:
            raise ManifestError(f"{path}: text-classification needs 'labels'")

        def loader(config):
            tok = ByteEncoderTokenizer() if tok_decl == "bytes" else WordPieceTokenizer(path.parent / tok_decl)
            spec = ByomSpec(head=head, vocab_size=tok.vocab_size)
            return runtime.TextEncoder(name, spec, onnx_path, tok, config, labels=labels,
                                       synthetic=bool(m.get("synthetic", False)), output=output)

    return registry.ModelCard(name, task, "onnx", bool(m.get("synthetic", False)),
                              str(m.get("description", f"brought-in ONNX model {onnx_path.name}")), loader)


def register_manifest(path: str | Path, replace: bool = False) -> registry.ModelCard:
    """Check a manifest and register its model under its name."""
    card = load_manifest(path)
    try:
        return registry.register(card, replace=replace)
    except ValueError as exc:
        raise ManifestError(f"{path}: {exc}") from exc
