"""Encoder with the BERT/MiniLM architecture (post-LayerNorm, exact GELU) and three heads.

Weights use Hugging Face names and PyTorch ``[out, in]`` layout, so a real checkpoint's tensors (see
:mod:`dataplane.models.minilm`) load into exactly the graph that synthetic weights use.

Graph inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (all ``[B,T] int64``, right padded).
Outputs by head: ``embed`` -> ``embeddings [B,C]`` (masked mean pooling, L2-normalised, as
sentence-transformers does); ``classify`` -> ``logits [B,L]`` (pooler over [CLS], then a linear layer);
``rerank`` -> ``logits [B,1]`` (a cross-encoder: query and passage in one sequence).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from dataplane.graph import GraphBuilder, normal_f32

BUILDER_VERSION = 1
HEADS = ("embed", "classify", "rerank")


@dataclass(frozen=True)
class BertSpec:
    """Shape of a BERT encoder and its head."""

    n_layer: int
    hidden: int
    n_head: int
    intermediate: int
    vocab_size: int
    max_position: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12
    head: str = "embed"
    num_labels: int = 2
    seed: int = 0

    def with_head(self, head: str, num_labels: int | None = None) -> BertSpec:
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}")
        labels = 1 if head == "rerank" else (num_labels or self.num_labels)
        return replace(self, head=head, num_labels=labels)

    def key(self) -> dict:
        return {"family": "bert", "builder": BUILDER_VERSION, **asdict(self)}


PRESETS: dict[str, BertSpec] = {
    # ~3.3M parameters with the byte vocabulary: fast enough for tests.
    "tiny": BertSpec(n_layer=4, hidden=256, n_head=4, intermediate=1024, vocab_size=259),
    # The all-MiniLM-L6-v2 shape (22.7M parameters, WordPiece vocabulary size).
    "small": BertSpec(n_layer=6, hidden=384, n_head=12, intermediate=1536, vocab_size=30522),
}


def random_weights(spec: BertSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Deterministic BERT-style initialisation (normal 0.02, LayerNorm at identity)."""
    c, f32 = spec.hidden, np.float32

    def n(*shape):
        return normal_f32(rng, 0.02, shape)

    w = {
        "embeddings.word_embeddings.weight": n(spec.vocab_size, c),
        "embeddings.position_embeddings.weight": n(spec.max_position, c),
        "embeddings.token_type_embeddings.weight": n(spec.type_vocab, c),
        "embeddings.LayerNorm.weight": np.ones(c, f32),
        "embeddings.LayerNorm.bias": np.zeros(c, f32),
    }
    for i in range(spec.n_layer):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            w[p + f"attention.self.{name}.weight"] = n(c, c)
            w[p + f"attention.self.{name}.bias"] = np.zeros(c, f32)
        w[p + "attention.output.dense.weight"] = n(c, c)
        w[p + "attention.output.dense.bias"] = np.zeros(c, f32)
        w[p + "attention.output.LayerNorm.weight"] = np.ones(c, f32)
        w[p + "attention.output.LayerNorm.bias"] = np.zeros(c, f32)
        w[p + "intermediate.dense.weight"] = n(spec.intermediate, c)
        w[p + "intermediate.dense.bias"] = np.zeros(spec.intermediate, f32)
        w[p + "output.dense.weight"] = n(c, spec.intermediate)
        w[p + "output.dense.bias"] = np.zeros(c, f32)
        w[p + "output.LayerNorm.weight"] = np.ones(c, f32)
        w[p + "output.LayerNorm.bias"] = np.zeros(c, f32)
    if spec.head != "embed":
        w["pooler.dense.weight"], w["pooler.dense.bias"] = n(c, c), np.zeros(c, f32)
        w["classifier.weight"] = normal_f32(rng, 0.5, (spec.num_labels, c))
        w["classifier.bias"] = np.zeros(spec.num_labels, f32)
    return w


def build_graph(spec: BertSpec, w: dict[str, np.ndarray]):
    """The ONNX model for ``spec`` with Hugging-Face-named weights ``w``."""
    g = GraphBuilder(f"bert_{spec.head}")
    ids = g.input("input_ids", np.int64, ["batch", "seq"])
    mask = g.input("attention_mask", np.int64, ["batch", "seq"])
    types = g.input("token_type_ids", np.int64, ["batch", "seq"])
    c, h_ = spec.hidden, spec.n_head
    d_ = c // h_

    def lin(x, name):
        return g.linear(x, w[name + ".weight"].T, w[name + ".bias"], name)

    def ln(x, name):
        return g.layer_norm(x, w[name + ".weight"], w[name + ".bias"], name, spec.layer_norm_eps)

    t_len = g.op("Gather", [g.op("Shape", [ids]), g.const(1)], axis=0)
    pos = g.op("Unsqueeze", [g.op("Range", [g.const(0), t_len, g.const(1)]), g.const([0])])
    x = g.op("Add", [g.op("Gather", [g.weight("word", w["embeddings.word_embeddings.weight"]), ids]),
                     g.op("Gather", [g.weight("pos", w["embeddings.position_embeddings.weight"]), pos])])
    x = g.op("Add", [x, g.op("Gather", [g.weight("type", w["embeddings.token_type_embeddings.weight"]), types])])
    x = ln(x, "embeddings.LayerNorm")

    maskf = g.op("Cast", [mask], to=1)  # float [B,T]
    bias = g.op("Mul", [g.op("Sub", [g.const(1.0, np.float32), maskf]), g.const(-1e9, np.float32)])
    bias = g.op("Unsqueeze", [bias, g.const([1, 2])])  # [B,1,1,T]: padded keys are invisible
    split_shape, merge_shape = g.const([0, 0, h_, d_]), g.const([0, 0, c])
    scale = g.const(1.0 / np.sqrt(d_), np.float32)
    for i in range(spec.n_layer):
        p = f"encoder.layer.{i}."
        q, k, v = (
            g.op("Transpose", [g.op("Reshape", [lin(x, p + f"attention.self.{n}"), split_shape])], perm=[0, 2, 1, 3])
            for n in ("query", "key", "value")
        )
        s = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
        ctx = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        x = ln(g.op("Add", [x, lin(ctx, p + "attention.output.dense")]), p + "attention.output.LayerNorm")
        f = lin(g.gelu_erf(lin(x, p + "intermediate.dense")), p + "output.dense")
        x = ln(g.op("Add", [x, f]), p + "output.LayerNorm")

    if spec.head == "embed":
        m3 = g.op("Unsqueeze", [maskf, g.const([2])])
        summed = g.op("ReduceSum", [g.op("Mul", [x, m3]), g.const([1])], keepdims=0)
        count = g.op("Max", [g.op("ReduceSum", [m3, g.const([1])], keepdims=0), g.const(1e-9, np.float32)])
        mean = g.op("Div", [summed, count])
        norm = g.op("Max", [g.op("ReduceL2", [mean, g.const([1])], keepdims=1), g.const(1e-12, np.float32)])
        g.op("Div", [mean, norm], out="embeddings")
        g.output("embeddings", np.float32, ["batch", c])
    else:
        cls = g.op("Gather", [x, g.const(0)], axis=1)
        pooled = g.op("Tanh", [lin(cls, "pooler.dense")])
        g.op("Identity", [lin(pooled, "classifier")], out="logits")
        g.output("logits", np.float32, ["batch", spec.num_labels])
    return g.build(doc=f"edgepop BERT {spec}")


def forward_numpy(spec: BertSpec, w: dict[str, np.ndarray], ids, mask, types) -> np.ndarray:
    """Pure-numpy reference forward pass (float64) of the same network; returns the head's output."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    b_, t_ = ids.shape
    c, h_ = spec.hidden, spec.n_head
    d_ = c // h_

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + spec.layer_norm_eps) * w[name + ".weight"] + w[name + ".bias"]

    from scipy.special import erf  # scipy is a project dependency; only the reference needs it

    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][np.arange(t_)]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :]) * -1e9
    for i in range(spec.n_layer):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{n}").reshape(b_, t_, h_, d_).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b_, t_, c)
        x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        hmid = lin(x, p + "intermediate.dense")
        x = ln(x + lin(0.5 * hmid * (1 + erf(hmid / np.sqrt(2))), p + "output.dense"), p + "output.LayerNorm")
    if spec.head == "embed":
        m = mask[:, :, None].astype(np.float64)
        mean = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return lin(np.tanh(lin(x[:, 0], "pooler.dense")), "classifier")
