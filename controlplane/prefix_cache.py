"""KV prefix caches per replica, keyed by prefix-block hashes (Mooncake's ``hash_ids``), LRU within a byte budget.

A prompt of ``p`` tokens is cut into blocks of ``block_tokens``; each block's id names the block *and everything
before it* (a chained hash), so a replica can reuse the KV of a request's first ``k`` blocks exactly when it holds
those ``k`` ids. A request's cached tokens are the tokens of the longest leading run of its ids present in the
cache (the last, partial block counts only its remainder), as in vLLM's automatic prefix caching.

Budget: a share (``fraction``) of the replica's KV pool, ``kv_bytes_per_token x kv_pool_tokens`` from the catalog,
holds cached blocks of ``kv_bytes_per_token x block_tokens`` bytes each. The running requests' own KV lives in the
rest of the pool (the control plane's ``kv_capacity``), which this simplification leaves untouched.

Eviction is LRU over blocks. A request touches its blocks last-to-first, so a prefix's first block is always more
recent than its descendants and leaves are evicted before the blocks they depend on (vLLM frees blocks in reverse
order for the same reason).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from edgepop.errors import UserError


def cached_tokens(n_blocks_hit: int, prompt_tokens: int, block_tokens: int) -> int:
    """Tokens covered by the first ``n_blocks_hit`` blocks of a prompt (the last block may be partial)."""
    return max(0, min(n_blocks_hit * block_tokens, prompt_tokens))


class PrefixCache:
    """One replica's prefix cache: an LRU set of block ids holding at most ``capacity_blocks`` (None = unbounded)."""

    __slots__ = ("block_tokens", "block_bytes", "capacity_blocks", "blocks", "evictions", "hit_tokens",
                 "lookup_tokens")

    def __init__(self, block_tokens: int, block_bytes: float, capacity_bytes: float | None):
        if block_tokens < 1:
            raise UserError(f"prefix cache: block_tokens must be at least 1, got {block_tokens!r}")
        if capacity_bytes is not None and capacity_bytes < 0:
            raise UserError(f"prefix cache: capacity must be non-negative, got {capacity_bytes!r} bytes")
        self.block_tokens, self.block_bytes = block_tokens, float(block_bytes)
        self.capacity_blocks = (None if capacity_bytes is None
                                else int(capacity_bytes // block_bytes) if block_bytes > 0 else 0)
        self.blocks: OrderedDict = OrderedDict()  # block id -> None, least recently used first
        self.evictions = 0
        self.hit_tokens = self.lookup_tokens = 0

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def used_bytes(self) -> float:
        return len(self.blocks) * self.block_bytes

    def match_blocks(self, hash_ids: Sequence[int]) -> int:
        """Length of the leading run of ``hash_ids`` held here (no side effects: routers peek with it)."""
        blocks, k = self.blocks, 0
        for h in hash_ids:
            if h not in blocks:
                break
            k += 1
        return k

    def match(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of a prompt this cache would serve (no side effects)."""
        return cached_tokens(self.match_blocks(hash_ids), prompt_tokens, self.block_tokens)

    def admit(self, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """A request runs here: return its cached tokens, then hold all its blocks (most recent), evicting LRU."""
        hit = self.match(hash_ids, prompt_tokens)
        self.hit_tokens += hit
        self.lookup_tokens += prompt_tokens
        cap = self.capacity_blocks
        if cap == 0:
            return hit
        blocks = self.blocks
        for h in reversed(hash_ids[:cap] if cap is not None else hash_ids):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        if cap is not None:
            while len(blocks) > cap:
                blocks.popitem(last=False)
                self.evictions += 1
        return hit

    def clear(self) -> None:
        """The replica lost its GPU memory (node failure, unload)."""
        self.blocks.clear()


class PrefixCaches:
    """The prefix caches of one deployment, one per replica, created on first use.

    ``fraction``: share of each replica's KV pool given to cached blocks; ``None`` makes every cache unbounded.
    Routers read them through ``ClusterState.prefix_caches`` (None when prefix caching is off).
    """

    def __init__(self, block_tokens: int = 512, fraction: float | None = 0.5):
        if fraction is not None and not 0 < fraction <= 1:
            raise UserError(f"prefix cache: fraction of the KV pool must be in (0, 1], got {fraction!r}")
        self.block_tokens, self.fraction = block_tokens, fraction
        self.caches: dict[int, PrefixCache] = {}

    def of(self, replica) -> PrefixCache:
        c = self.caches.get(replica.id)
        if c is None:
            spec = replica.spec
            block_bytes = spec.kv_bytes_per_token * self.block_tokens
            budget = None if self.fraction is None else self.fraction * spec.kv_pool_bytes
            c = self.caches[replica.id] = PrefixCache(self.block_tokens, block_bytes, budget)
        return c

    def match(self, replica, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """Cached tokens ``replica`` holds for this prompt (0 for replicas not seen yet)."""
        c = self.caches.get(replica.id)
        return 0 if c is None or not hash_ids else c.match(hash_ids, prompt_tokens)

    def admit(self, replica, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """The request starts on ``replica``: its cached tokens (it skips their prefill); its blocks are now held."""
        if not hash_ids or not replica.spec.generative:
            return 0
        return self.of(replica).admit(hash_ids, prompt_tokens)

    def drop_node(self, node: int, replicas) -> None:
        """A node failed: the caches of its replicas are gone."""
        for r in replicas:
            if r.node == node and r.id in self.caches:
                self.caches[r.id].clear()

    def stats(self) -> dict:
        hit = sum(c.hit_tokens for c in self.caches.values())
        total = sum(c.lookup_tokens for c in self.caches.values())
        return {"block_tokens": self.block_tokens, "kv_fraction": self.fraction, "hit_tokens": int(hit),
                "lookup_tokens": int(total), "token_hit_ratio": round(hit / total, 6) if total else 0.0,
                "evicted_blocks": int(sum(c.evictions for c in self.caches.values()))}
