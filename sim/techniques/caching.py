"""Prefix caching and LoRA adapters in the simulator: the state lives in the control plane; this module switches
it on and reports it.

- Prefix caching: each deployment's control plane gets a :class:`controlplane.prefix_index.PrefixIndex`. A request
  starting on a replica looks its ``hash_ids`` up there; the hit is reported as ``cached_tokens`` and skipped by
  prefill (at least one prompt token is always computed, as in vLLM, for the first token's logits). Its blocks are
  pinned there while it runs; when it ends they stay cached in the replica's free KV space (evicted when requests
  need it).
- LoRA: each control plane gets a :class:`controlplane.adapter_index.AdapterIndex`. A request naming an adapter
  takes it on its replica: if not loaded, it waits ``size / lora_load_gbs`` before joining the batch; with every
  adapter slot there in use by running requests, it first waits for one to free. Both waits are reported as
  ``adapter_load_ms`` (not in ``queue_ms``). With ``lora_routing`` the router is wrapped in ``adapter-aware``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from controlplane.adapter_index import AdapterIndex
from controlplane.prefix_index import PrefixIndex
from sim.techniques.base import TECHNIQUES, Technique


def _started_generation(frame: pd.DataFrame):
    return frame.ttft_ms.notna() & (frame.task == "text-generation")


@TECHNIQUES.register("prefix_cache", on=lambda t: t.prefix_cache)
class PrefixCaching(Technique):
    """``prefix_block_tokens`` per block; cached blocks may hold ``prefix_cache_fraction`` of a KV pool."""

    reported = False

    def __init__(self, t):
        super().__init__(t)
        self.indexes: dict[str, PrefixIndex] = {}

    def plane_options(self, name):
        self.indexes[name] = PrefixIndex(self.t.prefix_block_tokens, self.t.prefix_cache_fraction)
        return {"prefix": self.indexes[name]}

    def blocks(self, name, sim, requests):
        started = _started_generation(requests)
        prompt = int(requests.prompt_tokens[started].sum())
        hit = int(requests.cached_tokens[started].sum())
        return {"prefix_cache": {**self.indexes[name].stats(), "cached_tokens": hit, "prompt_tokens": prompt,
                                 "token_hit_ratio": round(hit / prompt, 6) if prompt else 0.0}}


@TECHNIQUES.register("lora", on=lambda t: t.lora)
class LoraAdapters(Technique):
    """``lora_slots`` adapters loaded per replica (LRU), copied in at ``lora_load_gbs``."""

    reported = False

    def __init__(self, t):
        super().__init__(t)
        self.indexes: dict[str, AdapterIndex] = {}

    def plane_options(self, name):
        self.indexes[name] = AdapterIndex(self.t.lora_slots, self.t.lora_load_gbs)
        return {"adapters": self.indexes[name], "adapter_routing": self.t.lora_routing}

    def amend(self, name, sim, frame):
        """``adapter`` and ``adapter_load_ms`` columns; the adapter wait is taken out of ``queue_ms``."""
        wait_ms = np.asarray(sim.adapter_wait_s) * 1e3
        frame["queue_ms"] = frame.queue_ms - wait_ms
        frame["adapter"] = sim.adapters if sim.adapters is not None else ""
        frame["adapter_load_ms"] = np.where(np.isnan(frame.ttft_ms.to_numpy()), np.nan, wait_ms)
        return frame

    def blocks(self, name, sim, requests):
        with_adapter = _started_generation(requests) & (requests.adapter != "")
        wait = requests.adapter_load_ms[with_adapter]
        return {"lora": {**self.indexes[name].stats(), "adapter_requests": int(with_adapter.sum()),
                         "adapter_load_ms": round(float(wait.mean()), 3) if len(wait) else None}}
