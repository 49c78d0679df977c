"""Pure-numpy reference forward pass of :mod:`dataplane.models.gpt2` (float64), with optional LoRA deltas.

It recomputes the whole sequence (no KV cache), so it checks the ONNX graph's attention, cache and
low-rank paths independently: LayerNorm, causal multi-head attention, tanh-GELU MLP, tied LM head.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dataplane.models.gpt2 import GPT2Spec

# The four projections of a block, by the weight-name stem gpt2.build_graph gives them.
PROJECTIONS = ("attn", "proj", "fc", "fc_proj")


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's ``gelu_new``)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def forward_numpy(spec: GPT2Spec, w: Mapping[str, np.ndarray], ids: np.ndarray,
                  deltas: Mapping[str, tuple[np.ndarray, np.ndarray, float]] | None = None) -> np.ndarray:
    """Last-position logits ``[B,V]`` for unpadded ``ids [B,T]``.

    ``deltas`` maps a projection name such as ``"h0.attn"`` to ``(A [in,r], B [r,out], scale)``; that
    projection then computes ``x @ W + b + scale * (x @ A) @ B`` (LoRA, unmerged).
    """
    f64 = {k: np.asarray(v, np.float64) for k, v in w.items()}
    deltas = deltas or {}
    b_, t_ = ids.shape
    c, h_, d_ = spec.n_embd, spec.n_head, spec.head_dim

    def lin(x, name):
        y = x @ f64[name + ".w"] + f64[name + ".b"]
        if name in deltas:
            a, b, scale = deltas[name]
            y = y + scale * ((x @ np.asarray(a, np.float64)) @ np.asarray(b, np.float64))
        return y

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + spec.layer_norm_eps) * f64[name + ".g"] + f64[name + ".b"]

    x = f64["wte"][ids] + f64["wpe"][np.arange(t_)][None]
    causal = np.where(np.tril(np.ones((t_, t_), bool)), 0.0, -1e9)
    for i in range(spec.n_layer):
        p = f"h{i}."
        qkv = lin(ln(x, p + "ln_1"), p + "attn")
        q, k, v = (t.reshape(b_, t_, h_, d_).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b_, t_, c)
        x = x + lin(ctx, p + "proj")
        x = x + lin(gelu_tanh(lin(ln(x, p + "ln_2"), p + "fc")), p + "fc_proj")
    last = ln(x[:, -1], "ln_f")
    return last @ f64["wte"].T
