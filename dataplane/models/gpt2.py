"""Decoder-only language model with the GPT-2 architecture, as an ONNX graph with a KV cache.

Graph interface (B = batch, T = new tokens, P = past length, S = P + T):

* inputs ``input_ids [B,T] int64``, ``attention_mask [B,S] int64`` (0 marks left padding),
  ``position_ids [B,T] int64``, and per layer ``past_key.i`` / ``past_value.i`` ``[B,H,P,D] float32``;
* outputs ``logits [B,V]`` for the last position only (what generation needs; the LM head is the single
  largest matmul, so computing it for every prompt position would overstate prefill cost), and per layer
  ``present_key.i`` / ``present_value.i`` ``[B,H,S,D]``.

Prefill is a call with P = 0 (empty past tensors); each decode step is a call with T = 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dataplane.graph import GraphBuilder, normal_f32

BUILDER_VERSION = 1


@dataclass(frozen=True)
class GPT2Spec:
    """Shape of a GPT-2 model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_ctx: int
    vocab_size: int
    seed: int = 0
    layer_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def n_params(self) -> int:
        c, v = self.n_embd, self.vocab_size
        per_layer = 4 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c)
        return v * c + self.n_ctx * c + self.n_layer * per_layer + 2 * c

    def key(self) -> dict:
        return {"family": "gpt2", "builder": BUILDER_VERSION, **asdict(self)}


PRESETS: dict[str, GPT2Spec] = {
    # ~10.9M parameters: 6 layers of width 384, a byte-level vocabulary.
    "tiny": GPT2Spec(n_layer=6, n_embd=384, n_head=6, n_ctx=512, vocab_size=512),
    # GPT-2 small: 124M parameters, the real vocabulary size so the LM head costs what it really costs.
    "small": GPT2Spec(n_layer=12, n_embd=768, n_head=12, n_ctx=1024, vocab_size=50257),
}


def random_weights(spec: GPT2Spec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Deterministic GPT-2-style initialisation (normal 0.02; residual projections scaled by depth)."""
    c, f32 = spec.n_embd, np.float32
    std, proj_std = 0.02, 0.02 / np.sqrt(2 * spec.n_layer)
    w: dict[str, np.ndarray] = {
        "wte": normal_f32(rng, std, (spec.vocab_size, c)),
        "wpe": normal_f32(rng, 0.01, (spec.n_ctx, c)),
        "ln_f.g": np.ones(c, f32),
        "ln_f.b": np.zeros(c, f32),
    }
    for i in range(spec.n_layer):
        p = f"h{i}."
        w[p + "ln_1.g"], w[p + "ln_1.b"] = np.ones(c, f32), np.zeros(c, f32)
        w[p + "ln_2.g"], w[p + "ln_2.b"] = np.ones(c, f32), np.zeros(c, f32)
        w[p + "attn.w"] = normal_f32(rng, std, (c, 3 * c))
        w[p + "attn.b"] = np.zeros(3 * c, f32)
        w[p + "proj.w"] = normal_f32(rng, proj_std, (c, c))
        w[p + "proj.b"] = np.zeros(c, f32)
        w[p + "fc.w"] = normal_f32(rng, std, (c, 4 * c))
        w[p + "fc.b"] = np.zeros(4 * c, f32)
        w[p + "fc_proj.w"] = normal_f32(rng, proj_std, (4 * c, c))
        w[p + "fc_proj.b"] = np.zeros(c, f32)
    return w


def build_graph(spec: GPT2Spec, w: dict[str, np.ndarray], all_logits: bool = False):
    """The ONNX model for ``spec`` with weights ``w`` (see the module docstring for the interface).

    ``all_logits``: output ``logits [B,T,V]`` for every new position (a speculative-decoding target verifies
    all drafted tokens in one call) instead of the last position's ``[B,V]``."""
    g = GraphBuilder("gpt2")
    h_, d_ = spec.n_head, spec.head_dim
    ids = g.input("input_ids", np.int64, ["batch", "new"])
    mask = g.input("attention_mask", np.int64, ["batch", "total"])
    pos = g.input("position_ids", np.int64, ["batch", "new"])
    pasts = []
    for i in range(spec.n_layer):
        pk = g.input(f"past_key.{i}", np.float32, ["batch", h_, "past", d_])
        pv = g.input(f"past_value.{i}", np.float32, ["batch", h_, "past", d_])
        pasts.append((pk, pv))
    g.output("logits", np.float32, ["batch", "new", spec.vocab_size] if all_logits else ["batch", spec.vocab_size])

    wte = g.weight("wte", w["wte"])
    x = g.op("Add", [g.op("Gather", [wte, ids]), g.op("Gather", [g.weight("wpe", w["wpe"]), pos])])

    # Additive attention bias [B,1,T,S]: key j is visible to query i iff j <= P + i and mask[b, j] == 1.
    s_len = g.op("Gather", [g.op("Shape", [mask]), g.const(1)], axis=0)
    t_len = g.op("Gather", [g.op("Shape", [ids]), g.const(1)], axis=0)
    key_idx = g.op("Range", [g.const(0), s_len, g.const(1)])
    q_idx = g.op("Range", [g.op("Sub", [s_len, t_len]), s_len, g.const(1)])
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [key_idx, g.const([0])]), g.op("Unsqueeze", [q_idx, g.const([1])])])
    padok = g.op("Cast", [g.op("Unsqueeze", [mask, g.const([1, 2])])], to=9)  # bool [B,1,1,S]
    visible = g.op("And", [g.op("Unsqueeze", [causal, g.const([0, 1])]), padok])
    bias = g.op("Where", [visible, g.const(0.0, np.float32), g.const(-1e9, np.float32)])

    split_shape = g.const([0, 0, h_, d_])
    merge_shape = g.const([0, 0, spec.n_embd])
    scale = g.const(1.0 / np.sqrt(d_), np.float32)
    for i in range(spec.n_layer):
        p = f"h{i}."
        a = g.layer_norm(x, w[p + "ln_1.g"], w[p + "ln_1.b"], p + "ln_1", spec.layer_norm_eps)
        qkv = g.linear(a, w[p + "attn.w"], w[p + "attn.b"], p + "attn")
        q, k, v = g.op("Split", [qkv, g.const([spec.n_embd] * 3)], n_out=3, axis=-1)
        q, k, v = (g.op("Transpose", [g.op("Reshape", [t, split_shape])], perm=[0, 2, 1, 3]) for t in (q, k, v))
        k = g.op("Concat", [pasts[i][0], k], axis=2, out=f"present_key.{i}")
        v = g.op("Concat", [pasts[i][1], v], axis=2, out=f"present_value.{i}")
        g.output(f"present_key.{i}", np.float32, ["batch", h_, "total", d_])
        g.output(f"present_value.{i}", np.float32, ["batch", h_, "total", d_])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        x = g.op("Add", [x, g.linear(ctx, w[p + "proj.w"], w[p + "proj.b"], p + "proj")])
        m = g.layer_norm(x, w[p + "ln_2.g"], w[p + "ln_2.b"], p + "ln_2", spec.layer_norm_eps)
        m = g.gelu_tanh(g.linear(m, w[p + "fc.w"], w[p + "fc.b"], p + "fc"))
        x = g.op("Add", [x, g.linear(m, w[p + "fc_proj.w"], w[p + "fc_proj.b"], p + "fc_proj")])

    last = x if all_logits else g.op("Gather", [x, g.op("Sub", [t_len, g.const(1)])], axis=1)  # [B,C]: last only
    last = g.layer_norm(last, w["ln_f.g"], w["ln_f.b"], "ln_f", spec.layer_norm_eps)
    g.op("MatMul", [last, g.op("Transpose", [wte], perm=[1, 0])], out="logits")  # tied LM head
    return g.build(doc=f"edgepop GPT-2 {spec}")
