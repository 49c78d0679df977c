"""Prefix KV reuse: the KV of recent prompts, kept per block of token ids, LRU under a byte budget.

A prompt is cut into blocks of ``block_size`` token ids; block ``i`` is keyed by a hash chained over blocks
``0..i`` (so equal keys mean equal *prefixes*, as in vLLM's automatic prefix caching). Each cached block holds
the per-layer key/value tensors ``[H, block_size, D]`` of its tokens. A new prompt walks its chain while the
blocks are cached and starts from their KV, so only the rest of the prompt is prefilled.

KV of a position depends only on the tokens up to it (causal attention, absolute positions from 0), so reusing
it is exact up to floating-point summation order. At least one prompt token is always left to prefill, because
the next-token logits come from that call.

Eviction is LRU over blocks. A lookup touches the matched chain from its last block to its first, so a child
block is always older than its parent and is evicted first: no block outlives the prefix that reaches it for
long. The cache belongs to one engine thread and is not thread-safe.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixCacheConfig:
    """``block_size`` tokens per block; ``max_bytes`` of KV kept over all blocks (0 disables the cache)."""

    block_size: int = 16
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self):
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {self.max_bytes!r}")


@dataclass
class PrefixCacheStats:
    """Counters of a prefix KV cache: lookups, hits, tokens served from cache, blocks inserted and
    evicted."""
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0


def block_hashes(tokens: list[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """Chained digests of the full blocks of ``tokens`` (a trailing partial block gets none).

    ``salt`` starts the chain: KV computed under different weights (e.g. LoRA adapters) never collides."""
    out, parent = [], salt
    arr = np.asarray(tokens, dtype=np.int64)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.blake2b(parent + arr[start:start + block_size].tobytes(), digest_size=16).digest()
        out.append(parent)
    return out


class PrefixCache:
    """Block-level KV store (see the module docstring)."""

    def __init__(self, config: PrefixCacheConfig | None = None):
        self.config = config or PrefixCacheConfig()
        self.stats = PrefixCacheStats()
        self._blocks: OrderedDict[bytes, list[np.ndarray]] = OrderedDict()  # oldest first
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, tokens: list[int], salt: bytes = b"") -> tuple[int, list[np.ndarray] | None]:
        """(n cached tokens, per-layer KV ``[1,H,n,D]``) of the longest cached prefix of full blocks, leaving
        at least one token of ``tokens`` uncached; ``(0, None)`` on a miss. ``salt``: see :func:`block_hashes`."""
        bs = self.config.block_size
        self.stats.lookups += 1
        usable = block_hashes(tokens[:len(tokens) - 1], bs, salt)
        chain = []
        for h in usable:
            if h not in self._blocks:
                break
            chain.append(h)
        if not chain:
            return 0, None
        for h in reversed(chain):  # parents end up more recent than children
            self._blocks.move_to_end(h)
        n = len(chain) * bs
        blocks = [self._blocks[h] for h in chain]
        kv = [np.concatenate([b[j] for b in blocks], axis=1)[None] for j in range(len(blocks[0]))]
        self.stats.hits += 1
        self.stats.hit_tokens += n
        return n, kv

    def insert(self, tokens: list[int], kv: list[np.ndarray], salt: bytes = b"") -> int:
        """Store the full blocks of ``tokens`` whose KV ``kv`` (per layer ``[H, >=len(tokens), D]``, position
        ``j`` of the tensors is token ``j``) is not cached yet; returns how many blocks were added.

        Only the longest leading run of blocks that fits in ``max_bytes`` is kept (a block is useless without
        its parents), and room is made before anything is copied, so the cache never holds more than
        ``max_bytes``, not even while inserting."""
        if self.config.max_bytes == 0:
            return 0
        bs = self.config.block_size
        hashes = block_hashes(tokens, bs, salt)
        keep, total, new_bytes = 0, 0, 0
        for i, h in enumerate(hashes):  # slicing makes views: nothing is copied to size a block
            cached = h in self._blocks
            size = self._blocks_nbytes(self._blocks[h]) if cached else sum(a[:, i * bs:(i + 1) * bs].nbytes
                                                                               for a in kv)
            if total + size > self.config.max_bytes:
                break
            keep, total, new_bytes = keep + 1, total + size, new_bytes + (0 if cached else size)
        chain = hashes[:keep]
        for h in reversed(chain):  # most recent now, so the eviction below takes other blocks first
            if h in self._blocks:
                self._blocks.move_to_end(h)
        self._evict(self.config.max_bytes - new_bytes)  # the chain fits in max_bytes: it is never evicted
        added = 0
        for i in reversed(range(keep)):  # parents inserted last, so they are the most recent
            h = chain[i]
            if h in self._blocks:
                self._blocks.move_to_end(h)
                continue
            block = [np.ascontiguousarray(a[:, i * bs:(i + 1) * bs]) for a in kv]
            self._blocks[h] = block
            self.nbytes += self._blocks_nbytes(block)
            added += 1
        self.stats.inserted_blocks += added
        return added

    @staticmethod
    def _blocks_nbytes(block: list[np.ndarray]) -> int:
        return sum(b.nbytes for b in block)

    def _evict(self, limit: int) -> None:
        """Drop least recently used blocks until at most ``limit`` bytes are held."""
        while self.nbytes > limit and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.nbytes -= self._blocks_nbytes(block)
            self.stats.evicted_blocks += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.nbytes = 0
