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
           onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BOOL: "bool", onnx.TensorProto.DOUBLE: "float64",
           onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8"}


@dataclass(frozen=True)
class ByomSpec:
    """The little that runtime classes need to know about a brought-in model."""

    head: str = "embed"
    vocab_size: int = 0
    num_classes: int = 0
    image_size: int = 224


def _graph_io(path: Path) -> tuple[dict, dict, int | None, int | None, int]:
    """The graph's inputs and outputs ({name: {dtype, shape}}), its vocabulary size and its position table's rows
    (each None where the graph does not show it), and the file's ONNX IR version."""
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

    return (io(model.graph.input), io(model.graph.output), _vocab_size(model.graph), _position_rows(model.graph),
            model.ir_version)


def _check_loadable(manifest: Path, onnx_path: Path, ir_version: int) -> None:
    """Load the file once with the installed onnxruntime (CPU, no graph optimisation), so that a file it cannot
    load (a newer IR version or opset, an unknown operator) is refused here, not at every request."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4  # the error is reported below, in one line
    try:
        ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        why = " ".join(str(exc).split())
        if ".cc:" in why:  # drop the "Load model from ... failed:<source file> <C++ signature>" prefix
            why = why.rsplit(") ", 1)[-1]
        raise ManifestError(f"{manifest}: onnxruntime {ort.__version__} cannot load {onnx_path.name} (ONNX IR "
                            f"version {ir_version}; tried at registration): {why[:200]}") from None


_PASS_THROUGH = ("Cast", "Identity", "DequantizeLinear")


def _stored_table(name: str, init: dict, producer: dict) -> str:
    """The initializer a Gather's table input comes from, through casts or int8 dequantization (``name`` itself
    where there is none)."""
    while name not in init and name in producer and producer[name].op_type in _PASS_THROUGH:
        name = producer[name].input[0]
    return name


def _vocab_size(graph) -> int | None:
    """Rows of the embedding table that ``input_ids`` indexes: a Gather whose indices come from input_ids and
    whose table is an initializer (through casts or int8 dequantization). None where the graph says otherwise
    (a table computed at run time, a custom op): then only the run can tell."""
    init = {i.name: list(i.dims) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    ids = {"input_ids"}
    for node in graph.node:  # nodes are topologically sorted in a valid ONNX file
        if node.op_type in ("Cast", "Identity") and node.input and node.input[0] in ids:
            ids.update(node.output)
    sizes = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] not in ids:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        dims = init.get(_stored_table(node.input[0], init, producer))
        if dims and -len(dims) <= axis < len(dims):
            sizes.append(dims[axis])
    return min(sizes) if sizes else None


TOKENIZER_MAX_LENGTH = 256  # the tokenizers' own default cut (dataplane.tokenization)
_POSITION_PATH = ("Cast", "Identity", "Unsqueeze", "Squeeze", "Expand", "Slice", "Reshape")


def _position_rows(graph) -> int | None:
    """Rows of the learned position table: a Gather from a 2-D initializer whose indices come from a Range (or a
    slice of a stored buffer named for positions, e.g. ``embeddings.position_ids``), as BERT-style exports build
    them. A text longer than that fails at run
    time, so the tokenizer is cut there. None where no such table shows."""
    init = {i.name: list(i.dims) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def from_positions(name: str) -> bool:
        for _ in range(32):  # (a short chain of reshapes at most)
            if name in init:  # a stored buffer: positions only by name (a token_type_ids buffer indexes types)
                return "position" in name.lower()
            node = producer.get(name)
            if node is None:
                return False  # a graph input: token ids or types, not positions
            if node.op_type == "Range":
                return True
            if node.op_type not in _POSITION_PATH or not node.input:
                return False
            name = node.input[0]
        return False

    rows = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        dims = init.get(_stored_table(node.input[0], init, producer))
        if dims and len(dims) == 2 and node.input[1] not in init and from_positions(node.input[1]):
            rows.append(dims[0])
    return min(rows) if rows else None


def _need_bool(path: Path, m: dict, key: str) -> bool:
    """An optional JSON boolean (a string such as "false" is truthy in Python, so it is refused)."""
    value = m.get(key, False)
    if not isinstance(value, bool):
        raise ManifestError(f"{path}: field '{key}' must be true or false (a JSON boolean), got {value!r}")
    return value


def load_manifest(path: str | Path) -> registry.ModelCard:
    """Read and check a manifest; returns the model card (not yet registered)."""
    path = Path(path)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
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
    synthetic = _need_bool(path, m, "synthetic")
    g_in, g_out, graph_vocab, positions, ir_version = _graph_io(onnx_path)
    _check_loadable(path, onnx_path, ir_version)
    if set(inputs) != set(g_in):
        raise ManifestError(f"{path}: inputs {sorted(inputs)} do not match the graph's {sorted(g_in)}")
    for key in outputs:
        if key not in g_out:
            raise ManifestError(f"{path}: output '{key}' is not an output of the graph ({sorted(g_out)})")
    for key, decl, graph in [*((k, d, g_in[k]) for k, d in inputs.items()),
                             *((k, d, g_out[k]) for k, d in outputs.items())]:
        if decl is not None and not isinstance(decl, dict):
            raise ManifestError(f"{path}: '{key}' must be described by an object ({{dtype, shape}}), got {decl!r}")
        decl = decl or {}
        if decl.get("dtype") not in (None, graph["dtype"]):
            raise ManifestError(f"{path}: '{key}' is {graph['dtype']} in the graph, not {decl['dtype']}")
        _check_shape(path, key, decl.get("shape"), graph["shape"])
    if len(outputs) != 1:
        raise ManifestError(f"{path}: name exactly one output")
    output = next(iter(outputs))
    labels = m.get("labels") or ()
    if not isinstance(labels, list | tuple) or not all(isinstance(x, str) for x in labels):
        raise ManifestError(f"{path}: field 'labels' must be a list of strings")
    labels = tuple(labels)
    out_shape = g_out[output]["shape"]
    if not out_shape:
        raise ManifestError(f"{path}: the graph's output '{output}' has no shape; give it one in the ONNX file")

    if task == "image-classification":
        if len(inputs) != 1:
            raise ManifestError(f"{path}: an image model takes exactly one input")
        in_name = next(iter(inputs))
        shape = g_in[in_name]["shape"]
        if g_in[in_name]["dtype"] != "float32":
            raise ManifestError(f"{path}: the image input must be float32, got {g_in[in_name]['dtype']}")
        if len(shape) != 4 or shape[1] != 3 or not isinstance(shape[-1], int) or shape[2] != shape[3]:
            raise ManifestError(f"{path}: image input must be [N,3,S,S] with a fixed S, got {shape}")
        squeezed = list(out_shape)
        while len(squeezed) > 2 and squeezed[-1] == 1:  # [N,C,1,1] (a 1x1-conv head, SqueezeNet-style) is [N,C]
            squeezed.pop()
        if len(squeezed) != 2:
            raise ManifestError(f"{path}: an image model's output '{output}' must be [N,C] (trailing 1-sized axes "
                                f"are dropped), got {out_shape}")
        n_cls = squeezed[-1]
        if not isinstance(n_cls, int):
            raise ManifestError(f"{path}: the output's class dimension must be fixed")
        if labels and len(labels) != n_cls:
            raise ManifestError(f"{path}: {len(labels)} labels for {n_cls} classes")
        spec = ByomSpec(num_classes=n_cls, image_size=shape[-1])

        def loader(config):
            return runtime.ImageClassifier(name, spec, onnx_path, config, input_name=in_name, labels=labels,
                                           synthetic=synthetic)
    else:
        if not set(inputs) <= TEXT_INPUTS or "input_ids" not in inputs:
            raise ManifestError(f"{path}: text inputs must be input_ids and optionally attention_mask, "
                                "token_type_ids")
        wrong = {k: g_in[k]["dtype"] for k in inputs if g_in[k]["dtype"] != "int64"}
        if wrong:  # the tokenizers' ids are fed as int64
            raise ManifestError(f"{path}: text inputs must be int64 in the graph, got {wrong}")
        for key, decl in inputs.items():  # texts are padded to their batch's longest: any length must fit
            for where, shape in (("in the graph", g_in[key]["shape"]), ("in the manifest", (decl or {}).get("shape"))):
                if shape and (len(shape) != 2 or isinstance(shape[1], int)):
                    raise ManifestError(f"{path}: text input '{key}' has shape {shape} {where}; it must be "
                                        "[batch, sequence] with a free sequence axis (axis 1), e.g. "
                                        "[\"batch\", \"sequence\"]")
        tok_decl = m.get("tokenizer", "bytes")
        if not isinstance(tok_decl, str) or (tok_decl != "bytes" and (not tok_decl.strip()
                                                                       or not (path.parent / tok_decl).is_file())):
            raise ManifestError(f"{path}: tokenizer {tok_decl!r} is neither 'bytes' nor an existing file")
        if tok_decl != "bytes":
            try:
                tokenizer = WordPieceTokenizer(path.parent / tok_decl)
            except Exception as exc:  # the tokenizers library raises its own Exception type
                raise ManifestError(f"{path}: tokenizer '{tok_decl}' is not a Hugging Face tokenizer.json "
                                    f"({' '.join(str(exc).split())})") from None
        tok_vocab = ByteEncoderTokenizer.vocab_size if tok_decl == "bytes" else tokenizer.vocab_size
        if graph_vocab is not None and graph_vocab < tok_vocab:
            raise ManifestError(f"{path}: tokenizer {tok_decl!r} has {tok_vocab} token ids but the graph's "
                                f"embedding table for 'input_ids' has {graph_vocab} rows")
        head = {"text-embeddings": "embed", "text-classification": "classify", "text-reranking": "rerank"}[task]
        if task == "text-classification":
            if not labels:
                raise ManifestError(f"{path}: text-classification needs 'labels'")
            if len(out_shape) != 2 or out_shape[-1] != len(labels):
                raise ManifestError(f"{path}: {len(labels)} labels, but the output '{output}' has shape {out_shape} "
                                    f"(need [N,{len(labels)}])")
        if task == "text-reranking" and (len(out_shape) != 2 or out_shape[-1] != 1):
            raise ManifestError(f"{path}: a reranker's output must be [N,1] (one score per pair), got {out_shape}")
        if task == "text-embeddings" and len(out_shape) not in (2, 3):
            raise ManifestError(f"{path}: an embedding output must be [N,C] or [N,T,C], got {out_shape}")

        # texts are cut at the tokenizer's length, and at the position table's rows where the graph has one
        max_length = min(TOKENIZER_MAX_LENGTH, positions) if positions else TOKENIZER_MAX_LENGTH
        if max_length < 8:  # (room for a pair's three special tokens and a few of each text)
            raise ManifestError(f"{path}: the graph's position table has {max_length} rows; texts need at least 8")

        def loader(config):
            tok = (ByteEncoderTokenizer(max_length=max_length) if tok_decl == "bytes"
                   else WordPieceTokenizer(path.parent / tok_decl, max_length=max_length))
            spec = ByomSpec(head=head, vocab_size=tok.vocab_size)
            return runtime.TextEncoder(name, spec, onnx_path, tok, config, labels=labels,
                                       synthetic=synthetic, output=output)

    return registry.ModelCard(name, task, "onnx", synthetic,
                              str(m.get("description", f"brought-in ONNX model {onnx_path.name}")), loader)


def _check_shape(path: Path, key: str, declared, graph: list) -> None:
    """A declared shape must match the graph's: same rank; a fixed size where the graph fixes one (named or
    free dimensions, such as the batch, match anything)."""
    if declared is None:
        return
    if not isinstance(declared, list) or not all(isinstance(d, int | str) and not isinstance(d, bool)
                                                  for d in declared):
        raise ManifestError(f"{path}: '{key}' shape must be a list of sizes or names, got {declared!r}")
    fixed = [d if isinstance(d, int) else None for d in graph]
    if len(declared) != len(graph) or any(isinstance(d, int) and g is not None and d != g
                                          for d, g in zip(declared, fixed, strict=True)):
        raise ManifestError(f"{path}: '{key}' is declared {declared} but the graph has {graph}")


def register_manifest(path: str | Path, replace: bool = False) -> registry.ModelCard:
    """Check a manifest and register its model under its name."""
    card = load_manifest(path)
    try:
        return registry.register(card, replace=replace)
    except ValueError as exc:
        raise ManifestError(f"{path}: {exc}") from exc
