"""LoRA adapter slots per replica: which adapters each replica holds, as the router and the drivers see it.

Adapters are declared in the catalog (:class:`controlplane.catalog.AdapterSpec`, Workers AI limits: rank at most 32,
file under 300 MB). A replica keeps up to ``slots`` adapters in GPU memory (S-LoRA-style unified pool, small next
to the weights). A request for an adapter that is not loaded waits ``size / load_gbs`` before its prefill while it
is copied in; later requests for it wait only for the copy still under way. Loaded adapters are evicted least
recently used first, never while a running request uses them: with every slot in use, a request for another
adapter waits for a release (as vLLM's ``max_loras`` holds requests back); the waiting requests are kept here, in
FIFO order per replica. :class:`controlplane.plane.ControlPlane` owns one :class:`AdapterIndex` and changes it only
through ``acquire_adapter`` / ``release_adapter``.
"""

from __future__ import annotations

from collections import OrderedDict

from controlplane.catalog import AdapterSpec
from edgepop.errors import UserError


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
        self.holders: dict = {}  # request -> (replica, adapter) it holds
        self.waiting: dict[int, dict] = {}  # replica id -> requests waiting there for a slot, FIFO

    def of(self, replica) -> AdapterSlots:
        s = self.sets.get(replica.id)
        if s is None:
            s = self.sets[replica.id] = AdapterSlots(self.slots)
        return s

    def adapter(self, replica, name: str) -> AdapterSpec:
        for a in replica.spec.adapters:
            if a.name == name:
                return a
        raise UserError(f"model {replica.spec.id!r} has no LoRA adapter {name!r} in the catalog")

    def load_s(self, adapter: AdapterSpec) -> float:
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

    def take(self, replica, req, t: float) -> tuple[float, bool] | None:
        """``req`` reaches ``replica`` at ``t`` needing ``req.adapter``: (when it can join its batch, whether its
        adapter was loaded for it), or None: it waits, FIFO, for a slot there."""
        got = self.acquire(replica, req.adapter, t)
        if got is None:
            self.waiting.setdefault(replica.id, {})[req] = t  # (when it is there: its adapter cannot load before)
            return None
        wait, loaded = got
        self.holders[req] = (replica, req.adapter)
        return t + wait, loaded

    def forget(self, req) -> bool:
        """Drop what ``req`` holds or waits for; True when that freed an adapter slot."""
        held = self.holders.pop(req, None)
        for waiting in self.waiting.values():
            waiting.pop(req, None)
        return held is not None and self.release(*held)

    def give_back(self, req, now: float) -> list[tuple[object, float, bool]]:
        """``req`` ended: release its adapter; the requests waiting on its replica that now get theirs, in FIFO
        order, as (request, join time, loaded)."""
        held = self.holders.get(req)
        if not self.forget(req):
            return []
        waiting = self.waiting.get(held[0].id)
        out = []
        while waiting:
            nxt = next(iter(waiting))
            got = self.take(nxt.replica, nxt, max(now, waiting[nxt]))  # a slot freed before it got there
            if got is None:
                break
            del waiting[nxt]
            out.append((nxt, *got))
        return out

    def drop_node(self, node: int, replicas) -> None:
        """A node failed: its replicas' adapters are gone (their requests were given back by the plane)."""
        for r in replicas:
            if r.node == node:
                self.waiting.pop(r.id, None)
                if r.id in self.sets:
                    self.sets[r.id].clear()

    def stats(self) -> dict:
        return {"slots": self.slots, "load_gbs": self.load_gbs,
                "adapter_loads": int(sum(s.loads for s in self.sets.values()))}
