"""The router-side prefix index: which KV prefix blocks each replica holds, keyed by prefix-block hashes
(Mooncake's ``hash_ids``), held in the KV pool's free space and evicted LRU when running sequences need the room
(vLLM automatic prefix caching, SGLang RadixAttention). The engine-side cache that holds the KV tensors
themselves is :class:`dataplane.prefix_cache.PrefixCache`; :class:`controlplane.plane.ControlPlane` owns one
:class:`PrefixIndex` and changes it only through its pin/unpin calls as requests start and end.

A prompt of ``p`` tokens is cut into blocks of ``block_tokens``; each block's id names the block *and everything
before it* (a chained hash), so a replica can reuse the KV of a request's first ``k`` blocks exactly when it holds
those ``k`` ids. A request's cached tokens are the tokens of the longest leading run of its ids present in the
cache (the last, partial block counts only its remainder), as in vLLM's automatic prefix caching.

Memory: there is no reserved share. A running request's blocks are *pinned* (reference-counted, shared by every
running request that uses them, never evicted); they are part of its KV reservation in the control plane
(``Replica.kv_used``). When the last request using a block ends, the block stays cached *unpinned*, in the pool's
free space: unpinned blocks x ``block_tokens`` never exceed ``kv_capacity - kv_used``, so starting a request
evicts cached blocks when it needs their room, and cached blocks never make the replica's KV exceed its pool.
A hit on unpinned blocks turns them into the request's own KV, so the hit needs no new KV space. Simplification:
the control plane still reserves each running request's whole KV (``Request.kv_tokens``: prompt + output, or its
sliding-window footprint), so a prefix shared by two *concurrent* requests is budgeted twice (conservative), and a
sliding-window model's cached blocks are counted at full-layer size (conservative too). ``fraction`` optionally
caps the unpinned blocks at a share of the pool minus the pinned ones (``cap - pinned``, at least 0): pinned
blocks belong to running requests and cannot be evicted, so the held blocks (pinned + unpinned) can exceed the cap
whenever running requests pin more than it (at a 0.2 cap on one busy PoP, on 6,464 of 6,476 checks, up to 5.7x).

Computed blocks: a block pinned by a request whose prefill has not ended holds no KV yet. When the index's driver
reports prefill completions (``track_computing``; the simulator does, through :meth:`PrefixIndex.computed`), such a
block is *computing* until the first prefill that covers it ends, and hits count only computed blocks, as vLLM's
automatic prefix caching does: a request that looks its prefix up while another request is still computing it
recomputes it. The simulator makes that lookup when the request's prefill starts (:meth:`PrefixIndex.hit`). A
computing block whose last user leaves is dropped (nothing was cached). Routers still see computing blocks
(:meth:`PrefixIndex.match`), so requests sharing a prefix keep landing on the replica that will hold it.

Eviction is LRU over unpinned blocks. A request touches its blocks last-to-first (and unpins them last-to-first),
so a prefix's first block is always more recent than its descendants and leaves are evicted before the blocks
they depend on (vLLM frees blocks in reverse order for the same reason).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from edgepop.errors import UserError


def cached_tokens(n_blocks_hit: int, prompt_tokens: int, block_tokens: int) -> int:
    """Tokens covered by the first ``n_blocks_hit`` blocks of a prompt (the last block may be partial)."""
    return max(0, min(n_blocks_hit * block_tokens, prompt_tokens))


class ReplicaPrefixIndex:
    """One replica's prefix cache: pinned blocks (used by running requests) plus an LRU set of unpinned ones.

    ``capacity_bytes`` (None = no cap) bounds the unpinned blocks to the cap minus the pinned ones, which are never
    evicted (so held blocks can exceed it); the free KV space passed to :meth:`admit` and :meth:`release` (None =
    unlimited) bounds the unpinned ones too.
    """

    __slots__ = ("block_tokens", "block_bytes", "capacity_blocks", "blocks", "refs", "evictions", "hit_tokens",
                 "lookup_tokens", "computing", "track")

    def __init__(self, block_tokens: int, block_bytes: float, capacity_bytes: float | None, track: bool = False):
        if block_tokens < 1:
            raise UserError(f"prefix cache: block_tokens must be at least 1, got {block_tokens!r}")
        if capacity_bytes is not None and capacity_bytes < 0:
            raise UserError(f"prefix cache: capacity must be non-negative, got {capacity_bytes!r} bytes")
        self.block_tokens, self.block_bytes = block_tokens, float(block_bytes)
        self.capacity_blocks = (None if capacity_bytes is None
                                else int(capacity_bytes // block_bytes) if block_bytes > 0 else 0)
        self.blocks: OrderedDict = OrderedDict()  # unpinned block id -> None, least recently used first
        self.refs: dict = {}  # pinned block id -> running requests using it
        self.computing: set = set()  # pinned block ids no finished prefill has computed yet (``track`` only)
        self.track = track
        self.evictions = 0
        self.hit_tokens = self.lookup_tokens = 0

    def __len__(self) -> int:
        return len(self.blocks) + len(self.refs)

    def __contains__(self, h) -> bool:
        return h in self.refs or h in self.blocks

    @property
    def used_bytes(self) -> float:
        return len(self) * self.block_bytes

    @property
    def unpinned_tokens(self) -> int:
        """KV tokens the cache holds beyond the running requests' own (what lives in the pool's free space)."""
        return len(self.blocks) * self.block_tokens

    def match_blocks(self, hash_ids: Sequence[int], computed_only: bool = True) -> int:
        """Length of the leading run of ``hash_ids`` held here (no side effects: routers peek with it); with
        ``computed_only``, a block still being computed ends the run (it is no hit yet)."""
        blocks, refs, k = self.blocks, self.refs, 0
        computing = self.computing if computed_only else ()
        for h in hash_ids:
            if (h not in refs and h not in blocks) or h in computing:
                break
            k += 1
        return k

    def match(self, hash_ids: Sequence[int], prompt_tokens: int, computed_only: bool = True) -> int:
        """Tokens of a prompt this cache would serve (no side effects)."""
        return cached_tokens(self.match_blocks(hash_ids, computed_only), prompt_tokens, self.block_tokens)

    def admit(self, hash_ids: Sequence[int], prompt_tokens: int, free_tokens: float | None = None) -> int:
        """A request starts here: return its cached tokens, then pin all its blocks and evict unpinned LRU blocks
        until they fit ``free_tokens`` (the pool's KV not reserved by running requests, this one included)."""
        hit = self.match(hash_ids, prompt_tokens)
        self.hit_tokens += hit
        self.lookup_tokens += prompt_tokens
        if self.capacity_blocks == 0:
            return hit
        blocks, refs, track = self.blocks, self.refs, self.track
        for h in reversed(hash_ids):
            if track and h not in refs and h not in blocks:
                self.computing.add(h)  # its KV exists once this request's prefill (or another's) ends
            blocks.pop(h, None)
            refs[h] = refs.get(h, 0) + 1
        self.fit(free_tokens)
        return hit

    def computed(self, hash_ids: Sequence[int]) -> None:
        """A prefill covering ``hash_ids`` ended here: their KV exists, later lookups may hit them."""
        if self.computing:
            self.computing.difference_update(hash_ids)

    def release(self, hash_ids: Sequence[int], free_tokens: float | None = None) -> None:
        """A request admitted with ``hash_ids`` ended: blocks no running request uses become unpinned (most recent
        first for the head block), then unpinned blocks are fitted into ``free_tokens``."""
        if self.capacity_blocks == 0:
            return
        blocks, refs = self.blocks, self.refs
        for h in reversed(hash_ids):
            n = refs.get(h)
            if n is None:  # cleared meanwhile (node failure)
                continue
            if n > 1:
                refs[h] = n - 1
            else:
                del refs[h]
                if h in self.computing:  # never computed: there is no KV to keep
                    self.computing.discard(h)
                else:
                    blocks[h] = None
        self.fit(free_tokens)

    def fit(self, free_tokens: float | None) -> None:
        """Evict unpinned blocks, least recent first, until they fit ``free_tokens`` and the cap minus the pinned
        blocks (pinned ones are never evicted, so held blocks may stay over the cap)."""
        blocks = self.blocks
        room = None if free_tokens is None else max(0, int(free_tokens // self.block_tokens))
        if self.capacity_blocks is not None:
            cap_room = max(0, self.capacity_blocks - len(self.refs))
            room = cap_room if room is None else min(room, cap_room)
        if room is None:
            return
        while len(blocks) > room:
            blocks.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        """The replica lost its GPU memory (node failure, unload)."""
        self.blocks.clear()
        self.refs.clear()
        self.computing.clear()


class PrefixIndex:
    """The prefix index of one deployment, one :class:`ReplicaPrefixIndex` per replica, created on first use.

    ``fraction``: optional cap on the share of each replica's KV pool that unpinned cached blocks may hold beside
    the pinned ones (1.0: all of the pool's free space); ``None`` makes every cache unbounded (ignoring the pool).
    Routers read them through ``ClusterState.prefix`` (None when prefix caching is off). ``track_computing``: the driver reports prefill
    completions (:meth:`computed`), so blocks are hits only once computed (set before the first request starts).
    """

    def __init__(self, block_tokens: int = 512, fraction: float | None = 1.0):
        if fraction is not None and not 0 < fraction <= 1:
            raise UserError(f"prefix cache: fraction of the KV pool must be in (0, 1], got {fraction!r}")
        self.block_tokens, self.fraction = block_tokens, fraction
        self.caches: dict[int, ReplicaPrefixIndex] = {}
        self.track_computing = False

    def of(self, replica) -> ReplicaPrefixIndex:
        c = self.caches.get(replica.id)
        if c is None:
            spec = replica.spec
            block_bytes = spec.kv_bytes_per_token * self.block_tokens
            budget = None if self.fraction is None or self.fraction >= 1 else self.fraction * spec.kv_pool_bytes
            c = self.caches[replica.id] = ReplicaPrefixIndex(self.block_tokens, block_bytes, budget,
                                                             self.track_computing)
        return c

    def free_tokens(self, replica, leaving: int = 0) -> float | None:
        """KV tokens of ``replica``'s pool no running request reserves (``leaving``: a reservation about to go)."""
        if self.fraction is None:
            return None
        return replica.kv_capacity - replica.kv_used + leaving

    def match(self, replica, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """Cached tokens ``replica`` holds or is computing for this prompt (0 for replicas not seen yet): what
        routers peek at, so that requests sharing a prefix meet where it is (being) computed."""
        c = self.caches.get(replica.id)
        return 0 if c is None or not hash_ids else c.match(hash_ids, prompt_tokens, computed_only=False)

    def hit(self, replica, hash_ids: Sequence[int], prompt_tokens: int, before: int) -> int:
        """The cached tokens of a started request looked up again as its prefill starts (its blocks are pinned, so
        only blocks computed meanwhile can add to the ``before`` tokens counted at :meth:`admit`)."""
        c = self.caches.get(replica.id)
        if c is None or not hash_ids or not replica.spec.generative:
            return before
        hit = c.match(hash_ids, prompt_tokens)
        c.hit_tokens += hit - before
        return hit

    def computed(self, replica, hash_ids: Sequence[int]) -> None:
        """A started request's prefill ended on ``replica``: its blocks hold KV now."""
        c = self.caches.get(replica.id)
        if c is not None and hash_ids:
            c.computed(hash_ids)

    def admit(self, replica, hash_ids: Sequence[int], prompt_tokens: int) -> int:
        """The request starts on ``replica`` (its KV already reserved there): its cached tokens (it skips their
        prefill); its blocks are now pinned until :meth:`release`."""
        if not replica.spec.generative:
            return 0
        if not hash_ids:  # nothing to look up, but its KV reservation leaves the cached blocks less room
            c = self.caches.get(replica.id)
            if c is not None:
                c.fit(self.free_tokens(replica))
            return 0
        return self.of(replica).admit(hash_ids, prompt_tokens, self.free_tokens(replica))

    def release(self, replica, hash_ids: Sequence[int], leaving: int = 0) -> None:
        """A request admitted on ``replica`` ended; ``leaving``: its KV reservation if the replica still counts it."""
        c = self.caches.get(replica.id)
        if c is not None and hash_ids:
            c.release(hash_ids, self.free_tokens(replica, leaving))

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
