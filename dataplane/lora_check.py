"""``edgepop lora-check``: run a seeded adapter through the in-graph LoRA LM and compare with numpy.

Checks, on one base GPT-2 built from code: (1) prefill and KV-cached decode logits with the adapter
against the float64 numpy reference forward with the same deltas; (2) how far the adapter moves the
logits from the base model; (3) a mixed batch (base row + adapter row in one call); (4) the baked
(initializer) and merged-weights variants against the same reference.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from dataplane import lora
from dataplane.models import gpt2
from dataplane.models.gpt2_ref import forward_numpy
from dataplane.runtime import LanguageModel
from dataplane.session import SessionConfig


def _decode(model: lora.LoraLanguageModel, ids: np.ndarray, n_prompt: int, adapters) -> np.ndarray:
    """Logits after each prefix length n_prompt..T: one prefill, then teacher-forced cached steps."""
    model.adapters = adapters
    logits, past, mask = model.prefill([list(r) for r in ids[:, :n_prompt]])
    out = [logits]
    for t in range(n_prompt, ids.shape[1]):
        mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], axis=1)
        pos = np.full((len(ids), 1), t, np.int64)
        logits, past = model.step(ids[:, t : t + 1], mask, pos, past)
        out.append(logits)
    return np.stack(out, axis=1)  # [B, steps, V]


def _reference(spec, w, ids, n_prompt, deltas=None) -> np.ndarray:
    return np.stack([forward_numpy(spec, w, ids[:, :t], deltas) for t in range(n_prompt, ids.shape[1] + 1)], 1)


def _prefill_logits(spec, path: Path, ids: np.ndarray) -> np.ndarray:
    return LanguageModel("check", spec, path, SessionConfig(provider="cpu")).prefill([list(r) for r in ids])[0]


def run_check(preset: str = "tiny", rank: int = 8, alpha: float = 16.0, seed: int = 0,
              adapter_path: str | None = None, prompt_len: int = 12, decode_steps: int = 4) -> dict:
    """Build base + adapter, run every comparison, return the figures (max-abs logit differences)."""
    spec = gpt2.PRESETS[preset]
    rng = np.random.default_rng(seed)
    w = gpt2.random_weights(spec, rng)
    with tempfile.TemporaryDirectory(prefix="edgepop-lora-") as tmp:
        tmp = Path(tmp)
        base_path = tmp / "base.onnx"
        base = gpt2.build_graph(spec, w)
        onnx.save(base, str(base_path))
        if adapter_path is None:
            adapter_path = str(lora.save_adapter(lora.random_adapter(spec, rank, alpha, rng, name="seeded"),
                                                 tmp / "adapter.npz"))
        adapter = lora.load_adapter(adapter_path, spec)  # the validated file, as a server would load it
        model = lora.LoraLanguageModel(f"gpt2-{preset}", spec, base_path, SessionConfig(provider="cpu"))
        ids = rng.integers(0, spec.vocab_size, (2, prompt_len + decode_steps))

        t0 = time.perf_counter()
        got = _decode(model, ids, prompt_len, adapter)
        lora_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got_base = _decode(model, ids, prompt_len, None)
        base_s = time.perf_counter() - t0
        mixed = _decode(model, ids, prompt_len, [None, adapter])
        ref = _reference(spec, w, ids, prompt_len, adapter.deltas())
        ref_base = _reference(spec, w, ids, prompt_len)

        onnx.save(lora.bake_adapter(base, adapter), str(tmp / "baked.onnx"))
        onnx.save(gpt2.build_graph(spec, lora.merge_weights(w, adapter)), str(tmp / "merged.onnx"))
        full = ids[:, : prompt_len + decode_steps]
        baked = _prefill_logits(spec, tmp / "baked.onnx", full)
        merged = _prefill_logits(spec, tmp / "merged.onnx", full)
        adapter_bytes = Path(adapter_path).stat().st_size
    return {
        "preset": preset, "rank": adapter.rank, "alpha": adapter.alpha, "adapter_bytes": adapter_bytes,
        "projections": len(adapter.tensors),
        "lora_vs_numpy_max_abs": float(np.abs(got - ref).max()),
        "base_vs_numpy_max_abs": float(np.abs(got_base - ref_base).max()),
        "lora_vs_base_max_abs": float(np.abs(got - got_base).max()),
        "logit_max_abs": float(np.abs(ref).max()),
        "top1_changed_frac": float((got.argmax(-1) != got_base.argmax(-1)).mean()),
        # (np.maximum, not max(): a NaN in either row must show, not be dropped by a comparison)
        "mixed_batch_max_abs": float(np.maximum(np.abs(mixed[0] - ref_base[0]).max(), np.abs(mixed[1] - ref[1]).max())),
        "baked_vs_numpy_max_abs": float(np.abs(baked - ref[:, -1]).max()),
        "merged_vs_numpy_max_abs": float(np.abs(merged - ref[:, -1]).max()),
        "decode_overhead": lora_s / base_s,
    }
