"""A draft/target GPT-2 pair that really agree, for speculative decoding with synthetic weights.

Why: speculative decoding only pays when the draft guesses the target's next token often. Two independently
initialised random models agree on essentially nothing (acceptance ~1/vocab), which would measure the
mechanism's overhead only. Real pairs (e.g. a 1B draft for an 8B target of the same family) agree because they
were trained on the same data. We get the same property *by construction*, with Net2Net (Chen et al., 2016):

* **widen** every hidden dimension ``widen`` times by duplicating units: the residual stream becomes
  ``[x, x, ...]``; each linear layer's rows are split (divided by ``widen``) because its input is duplicated,
  and its columns duplicated because its output must be. LayerNorm of ``[x, x]`` equals ``[ln(x), ln(x)]``
  (same mean and variance), attention heads are duplicated whole (head size unchanged), and the final
  LayerNorm's gain/bias are divided by ``widen`` so the tied LM head gives the draft's logits exactly;
* **deepen** by inserting ``depth - 1`` identity blocks after every block (output projections zero, so the
  residual passes through unchanged);
* add small seeded Gaussian noise (``noise`` x 0.02, the init scale) to every weight, so the target is a
  *different* function that mostly, not always, agrees with the draft.

Before the noise the target computes exactly the draft's function at ``widen**2 * depth`` times its
per-layer compute; ``noise`` tunes the greedy agreement (acceptance) between them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dataplane.cache import cached_model
from dataplane.models import gpt2
from dataplane.models.gpt2 import GPT2Spec


def _rows(w: np.ndarray, n: int) -> np.ndarray:
    """The input of this linear map is duplicated ``n`` times: split its rows."""
    return np.concatenate([w / n] * n, axis=0)


def _cols(w: np.ndarray, n: int) -> np.ndarray:
    """Its output must be duplicated ``n`` times: duplicate its columns (or a bias)."""
    return np.concatenate([w] * n, axis=-1)


def widen_deepen(spec: GPT2Spec, w: dict[str, np.ndarray], widen: int = 2, depth: int = 2,
                 noise: float = 0.0, rng: np.random.Generator | None = None) -> tuple[GPT2Spec, dict]:
    """The Net2Net target of ``(spec, w)`` (see the module docstring); exact when ``noise == 0``."""
    c, n = spec.n_embd, widen
    t_spec = replace(spec, n_layer=spec.n_layer * depth, n_embd=c * n, n_head=spec.n_head * n)
    out = {"wte": _cols(w["wte"], n), "wpe": _cols(w["wpe"], n),
           "ln_f.g": _cols(w["ln_f.g"], n) / n, "ln_f.b": _cols(w["ln_f.b"], n) / n}
    for i in range(spec.n_layer):
        src = f"h{i}."
        for j in range(depth):
            p = f"h{i * depth + j}."
            for ln in ("ln_1", "ln_2"):
                out[p + ln + ".g"], out[p + ln + ".b"] = _cols(w[src + ln + ".g"], n), _cols(w[src + ln + ".b"], n)
            qkv_w = np.split(w[src + "attn.w"], 3, axis=1)
            out[p + "attn.w"] = np.concatenate([_cols(_rows(m, n), n) for m in qkv_w], axis=1)
            out[p + "attn.b"] = np.concatenate([_cols(b, n) for b in np.split(w[src + "attn.b"], 3)])
            out[p + "fc.w"], out[p + "fc.b"] = _cols(_rows(w[src + "fc.w"], n), n), _cols(w[src + "fc.b"], n)
            for proj in ("proj", "fc_proj"):
                keep = 1.0 if j == 0 else 0.0  # extra blocks: zero output projections = identity
                out[p + proj + ".w"] = _cols(_rows(w[src + proj + ".w"], n), n) * keep
                out[p + proj + ".b"] = _cols(w[src + proj + ".b"], n) * keep
    if noise > 0:
        rng = rng if rng is not None else np.random.default_rng(0)
        for k in sorted(out):
            if not k.endswith(("ln_1.g", "ln_2.g", "ln_f.g")):  # keep LayerNorm gains at their scale
                out[k] = out[k] + rng.normal(0, noise * 0.02, out[k].shape)
    return t_spec, {k: v.astype(np.float32) for k, v in out.items()}


def pair_paths(draft: str = "tiny", widen: int = 2, depth: int = 2, noise: float = 0.2, seed: int = 0):
    """ONNX files (built once, cached on disk) of ``(target, draft, target_spec, draft_spec)``.

    The draft is the ``draft`` preset with its usual weights; the target is its Net2Net widening/deepening plus
    noise from ``np.random.default_rng(seed)``, built with per-position logits for one-call verification."""
    d_spec = gpt2.PRESETS[draft]

    def d_weights():
        return gpt2.random_weights(d_spec, np.random.default_rng(d_spec.seed))

    d_path = cached_model(f"gpt2-{draft}", d_spec.key(), lambda: gpt2.build_graph(d_spec, d_weights()))
    t_spec = replace(d_spec, n_layer=d_spec.n_layer * depth, n_embd=d_spec.n_embd * widen,
                     n_head=d_spec.n_head * widen)
    key = {**d_spec.key(), "net2net": {"widen": widen, "depth": depth, "noise": noise, "seed": seed},
           "all_logits": True}

    def build_target():
        spec, w = widen_deepen(d_spec, d_weights(), widen, depth, noise, np.random.default_rng(seed))
        return gpt2.build_graph(spec, w, all_logits=True)

    t_path = cached_model(f"gpt2-{draft}-net2net", key, build_target)
    return t_path, d_path, t_spec, d_spec
