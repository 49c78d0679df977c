"""Prefix caching and LoRA adapters in the simulator: the hooks ``sim.simulator.Simulation`` calls when
``[techniques] prefix_cache`` or ``lora`` is on (both off: no hooks, the plain simulation runs unchanged).

- A request starting on a replica looks its ``hash_ids`` up in that replica's prefix cache
  (:mod:`controlplane.prefix_cache`); the hit is reported as ``cached_tokens`` and skipped by prefill (at least one
  prompt token is always computed, as in vLLM, for the first token's logits). Its blocks are then pinned there
  while it runs; when it ends they stay cached in the replica's free KV space (evicted when requests need it).
- A request naming an adapter takes it on its replica (:mod:`controlplane.lora`): if not loaded, it waits
  ``size / lora_load_gbs`` before joining the batch; with every adapter slot there in use by running requests, it
  first waits for one to free. Both waits are reported as ``adapter_load_ms`` (not in ``queue_ms``). The adapter
  is released when the request ends.
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
        self.pinned: dict[int, tuple] = {}  # request -> (replica, request) whose prefix blocks it pins
        self.waiting: dict[int, dict] = {}  # replica id -> {request: (req, seq)} waiting for an adapter slot (FIFO)
        self.arrived = np.zeros(n)  # when a LoRA request reached its replica
        self.sim = sim

    def on_request(self, req, k: int) -> None:
        """Attach the request's block hashes and adapter (routers read them)."""
        if self.hash_ids is not None:
            req.hash_ids = self.hash_ids[k]
        if self.adapters is not None:
            req.adapter = self.adapters[k]

    def on_start(self, req, seq, t: float) -> float | None:
        """``req`` starts on its replica, reaching it at ``t``: set its prefill skip and take its adapter.

        Returns when it joins the batch (``t`` plus any adapter copy), or None while it waits for an adapter slot
        (it joins when a request ending there frees one).
        """
        k, r = req.payload, req.replica
        self._forget(k)  # a retried request gives back what it held or waited for on its failed node
        if self.prefix is not None:
            self._unpin(k)
            hit = self.prefix.admit(r, req.hash_ids, req.prompt_tokens)
            if req.hash_ids:
                self.pinned[k] = (r, req)
            self.cached[k] = hit
            seq.cached = min(hit, max(0, seq.prompt - 1))
        if self.lora is None or not req.adapter:
            return t
        self.arrived[k] = t
        return self._take(req, seq, t)

    def _take(self, req, seq, t: float) -> float | None:
        k, r = req.payload, req.replica
        got = self.lora.acquire(r, req.adapter, t)
        if got is None:
            self.waiting.setdefault(r.id, {})[k] = (req, seq)
            return None
        wait, loaded = got
        self.held[k] = (r, req.adapter)
        self.adapter_wait_s[k] = t + wait - self.arrived[k]
        self.adapter_loaded[k] = loaded
        return t + wait

    def _unpin(self, k: int) -> None:
        """Request ``k`` no longer runs: its prefix blocks stay cached, unpinned (its KV reservation, if the
        replica still counts it, is about to be freed, so it counts as free space)."""
        got = self.pinned.pop(k, None)
        if got is not None:
            r, req = got
            self.prefix.release(r, req.hash_ids, req.kv_tokens if req in r.running else 0)

    def _forget(self, k: int) -> bool:
        """Drop what request ``k`` holds or waits for; True when that freed an adapter slot."""
        if self.lora is None:
            return False
        held = self.held.pop(k, None)
        for waiting in self.waiting.values():
            waiting.pop(k, None)
        return held is not None and self.lora.release(*held)

    def on_end(self, k: int) -> None:
        """Request ``k`` ended: release its adapter; requests waiting for a slot on that replica may now join."""
        if self.prefix is not None:
            self._unpin(k)
        held = self.held.get(k)
        if not self._forget(k):
            return
        waiting = self.waiting.get(held[0].id)
        now = self.sim.env.now
        while waiting:
            j, (req, seq) = next(iter(waiting.items()))
            at = self._take(req, seq, now)
            if at is None:
                break
            del waiting[j]
            self.sim._join(req, seq, at, now)

    def on_node_down(self, node: int, replicas) -> None:
        for r in replicas:  # requests waiting there are retried or failed by the simulator (they are running)
            if r.node == node:
                self.waiting.pop(r.id, None)
        for k in [k for k, (r, _) in self.pinned.items() if r.node == node]:
            del self.pinned[k]  # the node's caches are cleared below
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
