"""Prefix caching and LoRA adapters in the simulator: the hooks ``sim.simulator.Simulation`` calls when
``[techniques] prefix_cache`` or ``lora`` is on (both off: no hooks, the plain simulation runs unchanged).

- A request starting on a replica looks its ``hash_ids`` up in that replica's prefix cache
  (:mod:`controlplane.prefix_cache`); the hit is reported as ``cached_tokens`` and skipped by prefill (at least one
  prompt token is always computed, as in vLLM, for the first token's logits). Its blocks are then cached there.
- A request naming an adapter takes it on its replica (:mod:`controlplane.lora`): if not loaded, it waits
  ``size / lora_load_gbs`` before joining the batch (``adapter_load_ms``); the adapter is released when it ends.
- With ``lora_routing`` the deployment's router is wrapped in ``adapter-aware``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from controlplane.lora import AdapterIndex
from controlplane.prefix_cache import PrefixCaches
from controlplane.routing.lora import AdapterAware
from edgepop.errors import UserError


def check_block_tokens(techniques, workload_config) -> None:
    """The cache must cut prompts into the blocks the workload's ``hash_ids`` were made of."""
    if not techniques.prefix_cache:
        return
    kind = getattr(workload_config, "kind", "poisson")
    want = 512 if kind == "mooncake" else getattr(workload_config, "block_tokens", 512) if kind == "poisson" else None
    if want is not None and techniques.prefix_block_tokens != want:
        raise UserError(f"[techniques] prefix_block_tokens = {techniques.prefix_block_tokens} but the workload's "
                        f"hash_ids use {want}-token blocks (set [workload] block_tokens to match)")


class CacheHooks:
    """Per-simulation state of the two techniques; ``make_hooks`` returns None when both are off."""

    def __init__(self, sim, techniques):
        n, w, state, plane = sim.n, sim.w, sim.plane.state, sim.plane
        self.prefix = (PrefixCaches(techniques.prefix_block_tokens, techniques.prefix_cache_fraction)
                       if techniques.prefix_cache else None)
        self.lora = AdapterIndex(techniques.lora_slots, techniques.lora_load_gbs) if techniques.lora else None
        state.prefix_caches, state.adapters = self.prefix, self.lora
        if self.lora is not None and techniques.lora_routing and not isinstance(plane.router, AdapterAware):
            plane.router = AdapterAware(state, base=plane.router)
        self.hash_ids = w.hash_ids.tolist() if self.prefix is not None and "hash_ids" in w else None
        self.adapters = (w.adapter.fillna("").astype(str).tolist() if self.lora is not None and "adapter" in w
                         else None)
        self.cached = np.zeros(n, np.int64)
        self.adapter_wait_s = np.zeros(n)
        self.adapter_loaded = np.zeros(n, bool)
        self.held: dict[int, tuple] = {}  # request -> (replica, adapter) it holds

    def on_request(self, req, k: int) -> None:
        """Attach the request's block hashes and adapter (routers read them)."""
        if self.hash_ids is not None:
            req.hash_ids = self.hash_ids[k]
        if self.adapters is not None:
            req.adapter = self.adapters[k]

    def on_start(self, req, seq, t: float) -> float:
        """``req`` starts on its replica, reaching it at ``t``: set the prefill skip; return the adapter wait (s)."""
        k, r = req.payload, req.replica
        if self.prefix is not None:
            hit = self.prefix.admit(r, req.hash_ids, req.prompt_tokens)
            self.cached[k] = hit
            seq.cached = min(hit, max(0, seq.prompt - 1))
        wait = 0.0
        if self.lora is not None and req.adapter:
            self.on_end(k)  # a retried request gives back what it held on its failed node
            wait, loaded = self.lora.acquire(r, req.adapter, t)
            self.held[k] = (r, req.adapter)
            self.adapter_wait_s[k], self.adapter_loaded[k] = wait, loaded
        return wait

    def on_end(self, k: int) -> None:
        held = self.held.pop(k, None)
        if held is not None:
            self.lora.release(*held)

    def on_node_down(self, node: int, replicas) -> None:
        for part in (self.prefix, self.lora):
            if part is not None:
                part.drop_node(node, replicas)

    def amend(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Fill ``cached_tokens``; with LoRA add ``adapter`` and ``adapter_load_ms`` (taken out of ``queue_ms``)."""
        frame["cached_tokens"] = self.cached
        if self.lora is not None:
            wait_ms = self.adapter_wait_s * 1e3
            frame["queue_ms"] = frame.queue_ms - wait_ms
            frame["adapter"] = self.adapters if self.adapters is not None else ""
            frame["adapter_load_ms"] = np.where(np.isnan(frame.ttft_ms.to_numpy()), np.nan, wait_ms)
        return frame

    def summary(self, frame: pd.DataFrame) -> dict:
        """The techniques' block of a deployment summary: token hit ratio, adapter loads."""
        out = {}
        started = frame.ttft_ms.notna() & (frame.task == "text-generation")
        if self.prefix is not None:
            prompt = int(frame.prompt_tokens[started].sum())
            hit = int(frame.cached_tokens[started].sum())
            out["prefix_cache"] = {**self.prefix.stats(), "cached_tokens": hit, "prompt_tokens": prompt,
                                   "token_hit_ratio": round(hit / prompt, 6) if prompt else 0.0}
        if self.lora is not None:
            with_adapter = started & (frame.adapter != "")
            out["lora"] = {**self.lora.stats(), "adapter_requests": int(with_adapter.sum()),
                           "adapter_load_ms": _mean(frame.adapter_load_ms[with_adapter])}
        return out


def _mean(x) -> float | None:
    return round(float(x.mean()), 3) if len(x) else None


def make_hooks(sim, techniques) -> CacheHooks | None:
    if techniques is None or not (techniques.prefix_cache or techniques.lora):
        return None
    return CacheHooks(sim, techniques)
