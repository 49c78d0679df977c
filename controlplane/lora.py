"""LoRA adapters: catalog declarations, and per replica a small LRU set of loaded adapters.

A catalog entry may list adapters fine-tuned on it (Workers AI limits: rank at most 32, file under 300 MB)::

    [[models."@cf/meta/llama-3.1-8b-instruct".adapters]]
    name = "support-chat"
    rank = 16
    size_mb = 54.5        # optional: default from the rank and the base's attention shapes

A replica keeps up to ``slots`` adapters in GPU memory (S-LoRA-style unified pool, small next to the weights). A
request for an adapter that is not loaded waits ``size / load_gbs`` before its prefill while it is copied in; later
requests for it wait only for the copy still under way. Loaded adapters are evicted least recently used first, never
while a running request uses them: with every slot in use, a request for another adapter waits for a release (as
vLLM's ``max_loras`` holds requests back).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass

from controlplane.catalog import CatalogError
from edgepop.errors import UserError

MAX_RANK = 32
MAX_BYTES = 300e6
LORA_BYTES = 2.0  # adapters are shipped in fp16/bf16
_FIELDS = {"name", "rank", "size_mb"}


@dataclass(frozen=True, slots=True)
class Adapter:
    """One LoRA adapter of base model ``base``."""

    name: str
    base: str
    rank: int
    size_bytes: float


def attention_lora_bytes(rank: int, layers: int, hidden: int, kv_heads: int, head_dim: int) -> float:
    """Bytes of a rank-``rank`` adapter on the q, k, v and o projections (A and B matrices, fp16)."""
    kv_dim = kv_heads * head_dim
    per_layer = rank * ((hidden + hidden) * 2 + (hidden + kv_dim) * 2)  # q and o: d->d; k and v: d->kv_dim
    return float(per_layer * layers * LORA_BYTES)


def parse_adapters(source: str, model_id: str, raw, shape: dict) -> tuple[Adapter, ...]:
    """Validate a catalog entry's ``adapters`` list (one-line errors naming file, model, adapter and field)."""
    where = f"{source}: model {model_id!r}: adapters"
    if not isinstance(raw, list):
        raise CatalogError(f"{where}: expected a list of tables ([[models.\"...\".adapters]]), got {raw!r}")
    if shape.get("task") != "text-generation":
        raise CatalogError(f"{where}: only text-generation models take LoRA adapters")
    out, names = [], set()
    for i, a in enumerate(raw):
        if not isinstance(a, dict):
            raise CatalogError(f"{where}[{i}]: expected a table, got {a!r}")
        for k in a:
            if k not in _FIELDS:
                raise CatalogError(f"{where}[{i}]: unknown field {k!r} (known: {', '.join(sorted(_FIELDS))})")
        name = a.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
            raise CatalogError(f"{where}[{i}]: field 'name' must be a non-empty word like 'support-chat', got {name!r}")
        if name in names:
            raise CatalogError(f"{where}[{i}]: duplicate adapter name {name!r}")
        names.add(name)
        rank = a.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
            raise CatalogError(f"{where}[{i}] {name!r}: field 'rank' must be an integer in 1..{MAX_RANK}, got {rank!r}")
        if "size_mb" in a:
            mb = a["size_mb"]
            if isinstance(mb, bool) or not isinstance(mb, int | float) or not math.isfinite(mb) or mb <= 0:
                raise CatalogError(f"{where}[{i}] {name!r}: field 'size_mb' must be a positive number, got {mb!r}")
            size = float(mb) * 1e6
        else:
            size = attention_lora_bytes(rank, shape["layers"], shape["hidden"], shape["kv_heads"],
                                        shape.get("head_dim") or shape["hidden"] // shape["heads"])
        if size > MAX_BYTES:
            raise CatalogError(f"{where}[{i}] {name!r}: size {size / 1e6:.1f} MB is over the {MAX_BYTES / 1e6:.0f} MB "
                            "limit")
        out.append(Adapter(name, model_id, rank, size))
    return tuple(out)


class AdapterSlots:
    """The adapters loaded on one replica: name -> [ready_at, requests using it], least recently used first."""

    __slots__ = ("slots", "entries", "loads")

    def __init__(self, slots: int):
        self.slots = slots
        self.entries: OrderedDict = OrderedDict()
        self.loads = 0

    def loaded(self, name: str) -> bool:
        return name in self.entries

    def free_slot(self) -> bool:
        return len(self.entries) < self.slots

    def acquire(self, name: str, now: float, load_s: float) -> tuple[float, bool] | None:
        """A request for adapter ``name`` starts at ``now``: (time the adapter is ready, whether it was loaded);
        None when it is not loaded and every slot holds an adapter in use (the request waits for a release)."""
        e = self.entries.get(name)
        loaded = e is None
        if loaded:
            if not self._make_room():
                return None
            e = self.entries[name] = [now + load_s, 0]
            self.loads += 1
        self.entries.move_to_end(name)
        e[1] += 1
        return e[0], loaded

    def _make_room(self) -> bool:
        if len(self.entries) < self.slots:
            return True
        for name, (_, refs) in self.entries.items():
            if refs == 0:
                del self.entries[name]
                return True
        return False

    def release(self, name: str) -> bool:
        """A request using ``name`` ended; True when that freed its slot for another adapter."""
        e = self.entries.get(name)
        if e is not None and e[1] > 0:
            e[1] -= 1
            return e[1] == 0
        return False

    def clear(self) -> None:
        self.entries.clear()


class AdapterIndex:
    """The adapter sets of one deployment's replicas (created on first use). ``load_gbs``: copy bandwidth."""

    def __init__(self, slots: int = 8, load_gbs: float = 2.0):
        if slots < 1 or not load_gbs > 0:
            raise UserError(f"lora: slots must be at least 1 and load_gbs positive, got {slots!r} and {load_gbs!r}")
        self.slots, self.load_gbs = slots, load_gbs
        self.sets: dict[int, AdapterSlots] = {}

    def of(self, replica) -> AdapterSlots:
        s = self.sets.get(replica.id)
        if s is None:
            s = self.sets[replica.id] = AdapterSlots(self.slots)
        return s

    def adapter(self, replica, name: str) -> Adapter:
        for a in replica.spec.adapters:
            if a.name == name:
                return a
        raise UserError(f"model {replica.spec.id!r} has no LoRA adapter {name!r} in the catalog")

    def load_s(self, adapter: Adapter) -> float:
        return adapter.size_bytes / (self.load_gbs * 1e9)

    def loaded(self, replica, name: str) -> bool:
        s = self.sets.get(replica.id)
        return s is not None and s.loaded(name)

    def free_slot(self, replica) -> bool:
        s = self.sets.get(replica.id)
        return s is None or s.free_slot()

    def acquire(self, replica, name: str, now: float) -> tuple[float, bool] | None:
        """The request starts on ``replica`` at ``now``: (seconds it waits for the adapter, whether it loaded it),
        or None while every adapter slot there is in use."""
        got = self.of(replica).acquire(name, now, self.load_s(self.adapter(replica, name)))
        return None if got is None else (max(0.0, got[0] - now), got[1])

    def release(self, replica, name: str) -> bool:
        s = self.sets.get(replica.id)
        return s is not None and s.release(name)

    def drop_node(self, node: int, replicas) -> None:
        for r in replicas:
            if r.node == node and r.id in self.sets:
                self.sets[r.id].clear()

    def stats(self) -> dict:
        return {"slots": self.slots, "load_gbs": self.load_gbs,
                "adapter_loads": int(sum(s.loads for s in self.sets.values()))}
