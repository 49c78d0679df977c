"""Live cluster state the control plane keeps: replicas with their slots, KV budget, queue and load status.

State changes only through explicit method calls, the time passed in where it matters (no clocks, no threads),
so the simulator and the live gateway drive the very same objects.

Invariants (tested):
- a replica never runs more than ``slots`` sequences nor reserves more than ``kv_capacity`` KV tokens (full-layer
  token equivalents: ``ModelSpec.kv_charge``);
- per GPU, the resident replicas' ``bytes_per_gpu`` never exceed the GPU's memory;
- a request is in at most one place: one site queue or one replica's running set.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from controlplane.candidates import CandidateLists
from controlplane.catalog import Catalog, ModelSpec
from edgepop.errors import UserError

READY, LOADING, COLD = "ready", "loading", "cold"


@dataclass(slots=True, eq=False)
class Request:
    """What routing needs to know about one request, plus where it went (filled in by the control plane)."""

    id: int
    model: str
    ingress: int  # row of the topology's PoP table (the anycast ingress)
    prompt_tokens: int
    output_tokens: int = 0  # expected / maximum new tokens: reserved in the KV budget
    arrival: float = 0.0
    session: object = None
    reject_if_busy: bool = False
    account: str = "default"
    hash_ids: tuple = ()
    adapter: str = ""  # LoRA adapter name ("" = the base model alone)
    cached_tokens: int = 0  # prompt tokens the replica's prefix index held when it started (set by the plane)
    payload: object = None  # the caller's own data (the simulator's or gateway's request object)
    replica: Replica | None = None
    rtt_ms: float = 0.0
    enqueued_at: float = -1.0
    started_at: float = -1.0
    # KV pool tokens it reserves, set by ControlPlane.check from its model's spec (ModelSpec.kv_charge: less than
    # prompt + output where local layers keep a sliding window only); -1: not set, prompt + output.
    kv_charge: int = -1

    @property
    def kv_tokens(self) -> int:
        return self.kv_charge if self.kv_charge >= 0 else self.prompt_tokens + self.output_tokens


INF = float("inf")


def is_row_index(x) -> bool:
    """Whether ``x`` can index a row: an integer (numpy's and ``int`` subclasses such as an ``IntEnum`` included),
    not a bool or a float that compares equal to one (3.0 and True hash like rows 3 and 1)."""
    return type(x) is int or (isinstance(x, int | np.integer) and not isinstance(x, bool))


def bad_request(req: Request, ingresses: int) -> UserError | None:
    """The error of a request ``ControlPlane.check``'s quick test did not pass, naming its first bad field; None
    when every field is fine after all (an ingress of another integer type: numpy's, an ``IntEnum``)."""
    def number(x, low, high=None):  # low <= x (< high); False for NaN and for what is not a number
        try:
            return low <= x and (high is None or x < high)
        except TypeError:
            return False

    if not (is_row_index(req.ingress) and number(req.ingress, 0, ingresses)):
        problem = f"ingress must be an integer row of the RTT matrix (0 to {ingresses - 1}), got {req.ingress!r}"
    elif not number(req.prompt_tokens, 0, INF):
        problem = f"prompt_tokens must be a finite non-negative number, got {req.prompt_tokens!r}"
    elif not number(req.output_tokens, 0):
        problem = f"output_tokens must be a non-negative number, got {req.output_tokens!r}"
    else:
        return None
    return UserError(f"request {req.id}: {problem}")


class SiteQueue(deque):
    """The FIFO queue shared by all replicas of one model at one site (a PoP-local load balancer's queue).

    Whichever of them frees a slot first takes the head, so a site with c replicas of one slot each is an M/M/c
    queue. Its length limit is ``queue_limit`` per sharing replica.
    """

    def __init__(self, stats: ModelStats | None = None):
        super().__init__()
        self.replicas: list = []
        self.stats = stats  # its model's totals: a request leaving may give room where a router found none

    def room(self, queue_limit: int) -> bool:
        return len(self) < queue_limit * len(self.replicas)

    # Every way a request leaves the queue says so to the model's totals (ModelStats.room_epoch).
    def popleft(self):
        item = super().popleft()
        self._left()
        return item

    def pop(self):
        item = super().pop()
        self._left()
        return item

    def remove(self, value) -> None:
        super().remove(value)
        self._left()

    def clear(self) -> None:
        super().clear()
        self._left()

    def __delitem__(self, index) -> None:
        super().__delitem__(index)
        self._left()

    def _left(self) -> None:
        if self.stats is not None:
            self.stats.room_epoch += 1


class ModelStats:
    """Running totals per model so a router can skip scans that cannot succeed (a saturated fleet).

    ``free``: free slots over READY, up replicas; ``free_set``: those replicas (at least one free slot each);
    ``cold``: COLD or LOADING replicas that are up; ``slots``: all slots of the READY, up replicas; ``running``:
    sequences running on its replicas. Kept exact by Replica._start/_release and by :meth:`ClusterState.refresh`
    after any status, health or slot-count change (the fleet samples read them, not thousands of replicas).

    ``room_epoch`` counts the events that can give a site queue room again (a request leaving a queue, any
    :meth:`ClusterState.refresh`: a status, health, slot or replica change); ``full_at``: the epoch at which a
    router's scan of every replica found no READY, up one with queue room. While the two are equal no queue has
    room, and a saturated model's requests are rejected without scanning its replicas again."""

    __slots__ = ("free", "cold", "free_set", "slots", "running", "room_epoch", "full_at")

    def __init__(self):
        self.free = self.cold = self.slots = self.running = self.room_epoch = 0
        self.full_at = -1
        self.free_set: set = set()


@dataclass(slots=True, eq=False)
class Replica:
    """One model replica on ``tp`` GPUs of one node."""

    id: int
    spec: ModelSpec
    node: int
    site: int
    gpu: str
    gpu_index: tuple
    slots: int
    kv_capacity: int  # tokens; for models without a KV cache this is effectively unbounded
    queue_limit: int
    status: str = READY
    ready_at: float = 0.0
    up: bool = True
    active: int = 0
    kv_used: int = 0
    last_busy: float = 0.0
    queue: deque = field(default_factory=deque)
    # Insertion-ordered (a dict used as a set): requests hash by identity, so a set's order would follow memory
    # addresses, and a node fault resubmits its running requests in this order.
    running: dict = field(default_factory=dict)
    est_prefill_a: float = 0.0  # prefill_ms ~ a + b * tokens (for routing predictions)
    est_prefill_b: float = 0.0
    est_request_ms: float = 0.0  # typical busy time of one request on this replica
    stats: ModelStats | None = None

    @property
    def model(self) -> str:
        return self.spec.id

    def can_start(self, kv_tokens: int) -> bool:
        return (self.up and self.status == READY and self.active < self.slots
                and self.kv_used + kv_tokens <= self.kv_capacity)

    def has_queue_room(self) -> bool:
        return self.up and self.queue.room(self.queue_limit)

    @property
    def load(self) -> float:
        """Running sequences plus this replica's share of the site queue, per slot (1.0 = full, none waiting)."""
        return (self.active + len(self.queue) / len(self.queue.replicas)) / self.slots

    def _start(self, req: Request, now: float) -> None:
        stats = self.stats
        stats.free -= 1
        stats.running += 1
        self.active += 1
        if self.active >= self.slots:
            stats.free_set.discard(self)
        kv = req.kv_charge  # req.kv_tokens, inlined (once per request)
        self.kv_used += kv if kv >= 0 else req.prompt_tokens + req.output_tokens
        self.running[req] = None
        self.last_busy = now
        req.replica, req.started_at = self, now

    def _release(self, req: Request, now: float) -> None:
        stats = self.stats
        del self.running[req]
        self.active -= 1
        stats.running -= 1
        # (slots may have been lowered below the running count: a slot is free only below the limit)
        if self.up and self.status == READY and self.active < self.slots:
            stats.free += 1
            stats.free_set.add(self)
        kv = req.kv_charge  # req.kv_tokens, inlined (once per request)
        self.kv_used -= kv if kv >= 0 else req.prompt_tokens + req.output_tokens
        self.last_busy = now


class ClusterState:
    """All replicas of a deployment, indexed per model, with cached per-ingress candidate lists. ``rtt`` is the
    ingress-PoP x site RTT matrix (ms) of the fleet (``controlplane.fleet.ingress_site_rtt``)."""

    def __init__(self, catalog: Catalog, fleet, placement: pd.DataFrame, rtt: np.ndarray, queue_limit: int = 64,
                 kv_pool_scale: float = 1.0, max_candidates: int | None = 64, one_llm_per_gpu: bool = False):
        self.catalog, self.fleet, self.rtt = catalog, fleet, np.asarray(rtt, dtype=np.float64)
        # Replicas loaded at run time (autoscaling) keep placement's rule: a GPU computes for at most one language
        # model (the simulator runs co-located replicas as if each had the GPU alone). The placement's own rows are
        # taken as given.
        self.one_llm_per_gpu = one_llm_per_gpu
        self.queue_limit = queue_limit
        self.max_candidates = max_candidates
        self.kv_pool_scale = kv_pool_scale
        nodes = fleet.nodes
        self.node_gpu = nodes.gpu.to_numpy()
        self.node_site = nodes.site.to_numpy()
        self.node_up = np.ones(len(nodes), dtype=bool)
        self.gpu_capacity = [np.full(int(g), m * 1e9) for g, m in zip(nodes.gpus, nodes.gpu_memory_gb, strict=True)]
        self.gpu_used = [np.zeros(int(g)) for g in nodes.gpus]
        self.gpu_llms = [np.zeros(int(g), dtype=np.int64) for g in nodes.gpus]  # resident language-model replicas
        self.replicas: list[Replica] = []
        self.by_model: dict[str, list[Replica]] = {}
        self.candidate_lists = CandidateLists(self)
        self._cand = self.candidate_lists.cache  # (ingress, model, full) -> (replicas, RTTs)
        self._near = self.candidate_lists.near  # model -> [the not full list of each ingress row, or None]
        self.site_queues: dict[tuple[int, str], SiteQueue] = {}
        self.queued = 0  # requests in all site queues (kept by the ControlPlane, which alone queues and dequeues)
        self.stats: dict[str, ModelStats] = {}
        self._bulk = False
        self.loading: set[Replica] = set()  # replicas whose weights are loading (polled by the control plane)
        # Technique state routers read (None = technique off): a controlplane.prefix_index.PrefixIndex and a
        # controlplane.adapter_index.AdapterIndex. Owned and changed by the ControlPlane (and emptied for a replica
        # that :meth:`unload` scales to zero).
        self.prefix = None
        self.adapters = None
        self._bulk = True  # per-model totals are computed once below, not after every replica
        for i, row in enumerate(placement.itertuples()):
            gpu_index = tuple(row.gpu_index) if hasattr(row, "gpu_index") else None
            try:
                self.add_replica(catalog[row.model], int(row.node), gpu_index, status=READY)
            except (ValueError, IndexError) as exc:
                raise UserError(f"placement row {i}: {exc}") from None
        self._bulk = False
        self.refresh()

    # ---------------------------------------------------------------- replicas and memory
    def fits(self, spec: ModelSpec, node: int) -> tuple | None:
        """GPU indices on ``node`` with room for one replica of ``spec`` (most free first), or None."""
        free = self.gpu_capacity[node] - self.gpu_used[node]
        if len(free) < spec.tensor_parallel:
            return None
        if self.one_llm_per_gpu and spec.generative:
            free = np.where(self.gpu_llms[node] > 0, -np.inf, free)
        order = np.argsort(-free, kind="stable")[: spec.tensor_parallel]
        return tuple(int(i) for i in sorted(order)) if free[order].min() >= spec.bytes_per_gpu else None

    def add_replica(self, spec: ModelSpec, node: int, gpu_index: tuple | None = None, status: str = READY,
                    ready_at: float = 0.0) -> Replica:
        """Reserve GPU memory on ``node`` and register a replica (raises ValueError when it does not fit)."""
        if gpu_index is None:
            gpu_index = self.fits(spec, node)
            if gpu_index is None:
                raise ValueError(f"{spec.id} ({spec.bytes_per_gpu / 1e9:.1f} GB per GPU x {spec.tensor_parallel}) "
                                 f"does not fit on node {self.fleet.nodes.node_id.iloc[node]}")
        self._reserve(spec, node, gpu_index, +1)
        kv = int(spec.kv_pool_tokens * self.kv_pool_scale) if spec.generative else 1 << 62
        r = Replica(len(self.replicas), spec, node, int(self.node_site[node]), str(self.node_gpu[node]),
                    tuple(gpu_index), spec.max_batch, kv, self.queue_limit, status=status, ready_at=ready_at,
                    up=bool(self.node_up[node]), last_busy=ready_at)
        r.stats = self.stats.setdefault(spec.id, ModelStats())
        key = (r.site, spec.id)
        if key not in self.site_queues:
            self.site_queues[key] = SiteQueue(r.stats)
        r.queue = self.site_queues[key]
        r.queue.replicas.append(r)
        self.replicas.append(r)
        if status == LOADING:
            self.loading.add(r)
        self.by_model.setdefault(spec.id, []).append(r)
        self.candidate_lists.replica_added(spec.id)
        if not self._bulk:
            self.refresh(spec.id)
        return r

    def _reserve(self, spec: ModelSpec, node: int, gpu_index: tuple, sign: int) -> None:
        used = self.gpu_used[node]
        for g in gpu_index:
            used[g] += sign * spec.bytes_per_gpu
        if sign > 0 and np.any(used > self.gpu_capacity[node] + 1.0):
            for g in gpu_index:
                used[g] -= spec.bytes_per_gpu
            raise ValueError(f"{spec.id} would over-commit GPU memory on node {self.fleet.nodes.node_id.iloc[node]}")
        if spec.generative:
            llms = self.gpu_llms[node]
            for g in gpu_index:
                llms[g] += sign

    def unload(self, r: Replica) -> None:
        """Scale a replica to zero: free its GPU memory; it stays known (COLD) and can be loaded again."""
        if r.status != COLD:
            self._reserve(r.spec, r.node, r.gpu_index, -1)
            r.status = COLD
            for part in (self.prefix, self.adapters):  # its cached prefix blocks and adapters left with its memory
                if part is not None:
                    part.drop_node(r.node, [r])
            self.refresh(r.model)

    def fits_back(self, r: Replica) -> bool:
        """Whether a COLD replica's GPUs still have room to load it again."""
        free = self.gpu_capacity[r.node] - self.gpu_used[r.node]
        if self.one_llm_per_gpu and r.spec.generative and any(self.gpu_llms[r.node][g] for g in r.gpu_index):
            return False  # another language model loaded on its GPUs meanwhile
        return min(free[g] for g in r.gpu_index) >= r.spec.bytes_per_gpu

    def begin_load(self, r: Replica, now: float, load_s: float) -> bool:
        """Start loading a COLD replica's weights; False when its GPUs no longer have room."""
        if r.status != COLD:
            return True
        if not self.fits_back(r):
            return False
        self._reserve(r.spec, r.node, r.gpu_index, +1)
        self.reload(r, now, load_s)
        return True

    # ---------------------------------------------------------------- health
    def set_node_up(self, node: int, up: bool) -> list[Replica]:
        """Mark a GPU node up or down; returns its replicas."""
        self.node_up[node] = up
        hit = [r for r in self.replicas if r.node == node]
        for r in hit:
            r.up = up
        for model in {r.model for r in hit}:
            self.refresh(model)
        return hit

    def reload(self, r: Replica, now: float, load_s: float) -> None:
        """A replica with its GPU memory reserved loads its weights (from COLD, or again after its node failed and
        came back)."""
        r.status, r.ready_at = LOADING, now + load_s
        self.loading.add(r)
        self.refresh(r.model)

    def set_ready(self, r: Replica) -> None:
        """A LOADING replica finished loading its weights (its idle time counts from then, not from its last use)."""
        self.loading.discard(r)
        r.status, r.last_busy = READY, max(r.last_busy, r.ready_at)
        self.refresh(r.model)

    @contextmanager
    def withheld(self, replicas):
        """Inside the block, ``replicas`` count as down: routing decisions made there neither start nor queue a
        request on them. Restored (totals included) on exit. The live gateway withholds replicas whose engine's
        estimated wait is over its bound, so spillover finds the ones that can still take work."""
        hit = [r for r in replicas if r.up]
        for r in hit:
            r.up = False
        for model in {r.model for r in hit}:
            self.refresh(model)
        try:
            yield
        finally:
            for r in hit:
                r.up = True
            for model in {r.model for r in hit}:
                self.refresh(model)

    def refresh(self, model: str | None = None) -> None:
        """Recompute the per-model totals (after status or health changes; cheap, they are rare)."""
        for m in ([model] if model is not None else list(self.by_model)):
            st = self.stats.setdefault(m, ModelStats())
            st.room_epoch += 1  # a status, health or replica change may give a queue room
            reps = self.by_model.get(m, [])
            st.free = sum(max(0, r.slots - r.active) for r in reps if r.up and r.status == READY)
            st.free_set = {r for r in reps if r.up and r.status == READY and r.active < r.slots}
            st.cold = sum(1 for r in reps if r.up and r.status != READY)
            st.slots = sum(r.slots for r in reps if r.up and r.status == READY)
            st.running = sum(r.active for r in reps)

    def totals(self) -> tuple[int, int, int]:
        """(sequences running, requests queued, slots of READY, up replicas) of the fleet, from running totals."""
        stats = self.stats.values()
        return sum([st.running for st in stats]), self.queued, sum([st.slots for st in stats])

    def recount(self) -> tuple[int, int, int]:
        """:meth:`totals` counted over every replica and queue (what the running totals must equal)."""
        reps = self.replicas
        return (sum(r.active for r in reps), sum(map(len, self.site_queues.values())),
                sum(r.slots for r in reps if r.status == READY and r.up))

    def set_rtt(self, rtt: np.ndarray) -> None:
        """Swap the ingress x site RTT matrix (after a backbone link fault or repair)."""
        self.rtt = np.asarray(rtt, dtype=np.float64)
        self.candidate_lists.rtt_changed()

    # ---------------------------------------------------------------- candidates
    def candidates(self, ingress: int, model: str, full: bool = False) -> tuple[list[Replica], list[float]]:
        """Replicas of ``model`` sorted by RTT from ``ingress`` (ties: lower site index, then replica id).

        Only the nearest ``max_candidates`` unless ``full``: routers look at the first few, and the
        nearest-with-capacity rule asks for the full list when none of those can start the request.
        """
        hit = self._cand.get((ingress, model, full))  # (the cache hit inlined: every routing decision asks)
        return hit if hit is not None else self.candidate_lists.build(ingress, model, full)

    def precompute(self, ingresses=None, models=None) -> None:
        """Build the candidate lists of ``ingresses`` x ``models`` (default: all) up front, so that every routing
        decision is a cached lookup (:meth:`controlplane.candidates.CandidateLists.precompute`)."""
        self.candidate_lists.precompute(ingresses, models)

    def precompute_pairs(self, ingresses, codes, names) -> None:
        """Build the candidate lists of the pairs ``(ingresses[i], names[codes[i]])`` up front
        (:meth:`controlplane.candidates.CandidateLists.precompute_pairs`)."""
        self.candidate_lists.precompute_pairs(ingresses, codes, names)

    def memory_report(self) -> pd.DataFrame:
        """Per node: used and total GPU memory (GB) of resident replicas."""
        return pd.DataFrame({"node_id": self.fleet.nodes.node_id.to_numpy(),
                             "used_gb": [u.sum() / 1e9 for u in self.gpu_used],
                             "total_gb": [c.sum() / 1e9 for c in self.gpu_capacity]})
