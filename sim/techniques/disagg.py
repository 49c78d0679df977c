"""Prefill/decode disaggregation inside a site (DistServe / Splitwise / Mooncake style).

The replicas of one model at one site are split into a prefill pool (``prefill_fraction`` of them, at least one)
and a decode pool (the rest, at least one). A request prefills on a prefill replica, its KV cache (prompt tokens x
the catalog's KV bytes per token) then crosses the site's link at ``kv_link_gbps``, and it decodes on a decode
replica that never runs a prefill, so decoding sequences are no longer stalled by other requests' prefills. The
link is one per site, shared by every model's pool there: transfers take it one at a time in the order their
prefills end (FIFO), each for ``bytes / bandwidth``.

The split takes every GPU type in proportion (:func:`split_pools`), so neither pool gets all of a site's slow
boards. Admission is token-aware per pool: a prefill replica takes a request while its queued prompt tokens stay
under ``max_prefill_tokens`` (or it is idle); a decode replica takes a sequence while it runs fewer than the
model's ``max_batch`` sequences and the KV it will hold at the end of every resident sequence fits the catalog's
KV pool (or it is empty). Among the replicas that can take it, a request prefills where its prompt would be done
soonest and decodes where a step with it would be shortest (a fast board with a batch beats an idle slow one until
its batch makes it slower). The rest wait in FIFO order per pool; the control plane does not see those waits (its
slots are per replica), so under overload they are reported apart (``decode_wait_ms_*``).

The client sees its first token when the KV has landed on the decode replica (TTFT = prefill + queueing + link
wait + transfer); a site with a single replica of the model stays colocated (there is nothing to split). A
sequence that then waits for room in the decode pool has that wait as one stall of its first gap (``stall_ms``,
``stalls``), as the client sees it.
"""

from __future__ import annotations

from collections import deque

from sim.engine import ReplicaEngine, Seq
from sim.techniques.base import TECHNIQUES, Technique


def kv_transfer_s(spec, prompt_tokens: float, gbps: float) -> float:
    """Seconds to move the KV cache of ``prompt_tokens`` tokens over a ``gbps`` Gbit/s link (a sliding window's
    local layers send the window only: the prompt's full-layer footprint)."""
    return spec.kv_footprint(prompt_tokens) * spec.kv_bytes_per_token * 8.0 / (gbps * 1e9)


class KvLink:
    """A site's KV-transfer link: one transfer at a time, FIFO, at ``gbps``.

    A transfer is booked when its prefill ends (its slot on the link) and counted when it lands: one still
    waiting for the link or on it when the run ends (the drain horizon) never happened, nor did its wait."""

    def __init__(self, gbps: float):
        self.gbps, self.free_at = gbps, 0.0
        self.transfers, self.queued, self.wait_s, self.max_wait_s, self.busy_s = 0, 0, 0.0, 0.0, 0.0

    def send(self, spec, prompt_tokens: float, now: float) -> tuple[float, float]:
        """Book a transfer ready at ``now``: (seconds it waits for the link, seconds it takes on it)."""
        dt = kv_transfer_s(spec, prompt_tokens, self.gbps)
        wait = max(0.0, self.free_at - now)
        self.free_at = now + wait + dt
        return wait, dt

    def landed(self, wait: float, dt: float) -> None:
        """Count a transfer :meth:`send` booked, once its KV has landed."""
        self.transfers += 1
        self.queued += wait > 0
        self.wait_s += wait
        self.max_wait_s = max(self.max_wait_s, wait)
        self.busy_s += dt


class DisaggPool:
    """One (site, model): the simulator's engine for every replica of it (same interface as ReplicaEngine)."""

    def __init__(self, sim, replicas: list, prefill_fraction: float, kv_link_gbps: float,
                 max_prefill_tokens: int = 8192, link: KvLink | None = None):
        self.sim, self.spec, self.gbps = sim, replicas[0].spec, kv_link_gbps
        self.link = link if link is not None else KvLink(kv_link_gbps)
        self.max_prefill_tokens = max_prefill_tokens
        self.n_replicas = len(replicas)
        perf, arm = sim.perf, sim._arm
        self.perf = perf
        pre, dec = split_pools(replicas, prefill_fraction)
        self.prefill = [ReplicaEngine(r.spec, r.gpu, perf, arm, _ignore, self._prefilled) for r in pre]
        self.decode = [ReplicaEngine(r.spec, r.gpu, perf, arm, _ignore, self._decoded) for r in dec]
        for e, r in zip(self.prefill + self.decode, pre + dec, strict=True):  # each pool replica on its own GPUs
            sim.gpu_meter.bind(e, r)
        self.meter = sim.gpu_meter
        self.p_tokens = [0.0] * len(self.prefill)  # queued + running prompt tokens per prefill replica
        self.kv = [0.0] * len(self.decode)  # KV tokens reserved per decode replica
        self.n_dec = [0] * len(self.decode)  # sequences placed per decode replica
        self.wait_p: deque = deque()
        self.wait_d: deque = deque()
        self.where: dict = {}  # id(seq) -> (decode replica index, KV tokens reserved, s waited for admission)
        self.kv_transfers, self.kv_transfer_s = 0, 0.0
        self.d_queued, self.d_wait_s, self.d_wait_max = 0, 0.0, 0.0  # waits for decode room (slots or KV)
        self.dead = False

    # ------------------------------------------------------------ engine interface used by the simulator
    @property
    def busy_since(self) -> float:
        return 0.0 if any(e.busy_since >= 0 for e in self.prefill + self.decode) else -1.0

    def join(self, seq: Seq, t: float) -> None:
        if self.dead or seq.done:
            return
        seq.joined_at = t
        self.wait_p.append(seq)
        self._admit_prefill(t)

    def seq_stalls(self, seq: Seq) -> tuple[float, int]:
        i, _, wait = self.where.pop(id(seq), (None, 0, 0.0))
        if i is None:
            return 0.0, 0
        stall_s, stalls = self.decode[i].seq_stalls(seq)
        # its wait for decode room fell between its first and second token: one long gap, not a slower TPOT
        return (stall_s + wait, stalls + 1) if wait > 0 else (stall_s, stalls)

    def kill(self, t: float) -> list:
        # the simulator learns which requests were lost from the control plane; here only the state is dropped
        lost = list(self.wait_p) + list(self.wait_d)
        for e in self.prefill + self.decode:
            e.kill(t)
        self.wait_p.clear()
        self.wait_d.clear()
        self.p_tokens = [0.0] * len(self.prefill)
        self.kv = [0.0] * len(self.decode)
        self.n_dec = [0] * len(self.decode)
        return lost

    def busy_until(self, t: float) -> float:
        """Busy seconds per replica of the pool (its GPU time is counted by the engines' meter)."""
        return sum(e.busy_until(t) for e in self.prefill + self.decode) / self.n_replicas

    # ------------------------------------------------------------ pools
    def _later(self, dt: float, fn, *args) -> None:
        # engine callbacks run inside an engine's own loop: act on a fresh event, never re-entrantly
        ev = self.sim.env.timeout(max(0.0, dt))
        ev.callbacks.append(lambda _e: (fn(*args), self.sim._flush()))

    def _admit_prefill(self, t: float) -> None:
        while self.wait_p:
            seq = self.wait_p[0]
            if seq.done:
                self.wait_p.popleft()
                continue
            cached = getattr(seq, "cached", 0)  # prefix-cache hit, when that technique is in the build
            new = seq.prompt - cached
            open_ = [j for j, q in enumerate(self.p_tokens) if q == 0 or q + new <= self.max_prefill_tokens]
            if not open_:
                return
            # where this prompt would be done soonest: the replica's queued tokens and its own, at its speed
            i = min(open_, key=lambda j: self.perf.prefill_ms(self.spec, self.prefill[j].gpu,
                                                               int(self.p_tokens[j] + max(new, 1))))
            self.wait_p.popleft()
            self.p_tokens[i] += seq.prompt - cached
            proxy = Seq((seq, i), seq.prompt, 1)  # prefill only: it "finishes" with its first token
            if cached:
                proxy.cached = cached
            self.prefill[i].join(proxy, t)

    def _prefilled(self, proxy: Seq, t: float) -> None:
        seq, i = proxy.rec
        self.p_tokens[i] -= seq.prompt - getattr(seq, "cached", 0)
        wait, dt = self.link.send(self.spec, seq.prompt, self.sim.env.now)
        self._later(wait + dt, self._kv_arrived, seq, wait, dt)
        if self.wait_p:
            self._later(0.0, lambda: self._admit_prefill(self.sim.env.now))

    def _kv_arrived(self, seq: Seq, wait: float, dt: float) -> None:
        # counted here, not when booked: a transfer the run's end cuts off (its slot past the horizon) never landed
        self.link.landed(wait, dt)
        self.kv_transfers += 1
        self.kv_transfer_s += dt
        if seq.done or self.dead:
            return
        t = self.sim.env.now
        seq.first_token_at = t
        self.sim._first_token(seq, t)
        if seq.output <= 1:
            seq.done = True
            self.sim._finish(seq, t)
            return
        self.wait_d.append(seq)
        self._admit_decode(t)

    def _admit_decode(self, t: float) -> None:
        cap = self.spec.kv_pool_tokens or float("inf")
        slots = self.spec.max_batch
        while self.wait_d:
            seq = self.wait_d[0]
            need = self.spec.kv_charge(seq.prompt + seq.output)  # (a sliding window's local layers hold less)
            open_ = [j for j, kv in enumerate(self.kv)
                     if self.n_dec[j] < slots and (kv == 0 or kv + need <= cap)]
            if not open_:
                return
            ctx = seq.prompt + seq.output / 2.0  # its mean context while decoding
            i = min(open_, key=lambda j: self.perf.decode_step_ms(self.spec, self.decode[j].gpu,
                                                                   self.n_dec[j] + 1, ctx))
            self.wait_d.popleft()
            self.kv[i] += need
            self.n_dec[i] += 1
            wait = t - seq.first_token_at
            self.d_queued += wait > 0
            self.d_wait_s += wait
            self.d_wait_max = max(self.d_wait_max, wait)
            self.where[id(seq)] = (i, need, wait)
            self.decode[i].join_decode(seq, t)

    def _decoded(self, seq: Seq, t: float) -> None:
        i, need, _ = self.where.get(id(seq), (None, 0, 0.0))
        if i is not None:
            self.kv[i] -= need
            self.n_dec[i] -= 1
        self.sim._finish(seq, t)
        if self.wait_d:
            self._later(0.0, lambda: self._admit_decode(self.sim.env.now))


def split_pools(replicas: list, prefill_fraction: float) -> tuple[list, list]:
    """(prefill, decode) replicas: ``prefill_fraction`` of them (at least one each side) prefill, taken from every
    GPU type in proportion (largest remainder; ties to the type listed first), in the order given."""
    n = len(replicas)
    n_p = min(n - 1, max(1, round(n * prefill_fraction)))
    by_gpu: dict[str, list] = {}
    for r in replicas:
        by_gpu.setdefault(r.gpu, []).append(r)
    quota = {g: len(rs) * n_p / n for g, rs in by_gpu.items()}
    take = {g: int(q) for g, q in quota.items()}
    order = sorted(by_gpu, key=lambda g: take[g] - quota[g])  # stable: equal remainders keep the listed order
    for g in order[: n_p - sum(take.values())]:
        take[g] += 1
    prefill = [r for g, rs in by_gpu.items() for r in rs[: take[g]]]
    return prefill, [r for g, rs in by_gpu.items() for r in rs[take[g]:]]


def _ignore(seq, t) -> None:
    """First tokens of pool-internal sequences are reported by the pool itself."""


class DisaggFactory:
    """Engines for one simulation: one :class:`DisaggPool` per (site, model) with at least two replicas."""

    def __init__(self, prefill_fraction: float, kv_link_gbps: float, max_prefill_tokens: int = 8192):
        self.prefill_fraction, self.kv_link_gbps = prefill_fraction, kv_link_gbps
        self.max_prefill_tokens = max_prefill_tokens
        self.pools: dict = {}
        self.links: dict = {}  # site -> its KvLink, shared by the site's pools
        self.colocated_sites = 0

    def __call__(self, sim, replica):
        if not replica.spec.generative:
            return None
        key = (replica.site, replica.spec.id)
        pool = self.pools.get(key)
        if pool is None:
            group = [r for r in sim.plane.state.replicas if r.site == replica.site and r.spec.id == replica.spec.id]
            if len(group) < 2:
                self.colocated_sites += 1
                return None
            link = self.links.setdefault(replica.site, KvLink(self.kv_link_gbps))
            pool = self.pools[key] = DisaggPool(sim, group, self.prefill_fraction, self.kv_link_gbps,
                                                self.max_prefill_tokens, link)
        return pool

    def stats(self) -> dict:
        pools = list(self.pools.values())
        n = sum(p.kv_transfers for p in pools)
        links = list(self.links.values())
        return {"pools": len(pools), "colocated_site_models": self.colocated_sites, "kv_transfers": n,
                "kv_transfer_ms_mean": round(1e3 * sum(p.kv_transfer_s for p in pools) / max(n, 1), 3),
                # waits for a site's link while it carries earlier transfers (FIFO)
                "kv_link_queued": sum(k.queued for k in links),
                "kv_link_wait_ms_mean": round(1e3 * sum(k.wait_s for k in links) / max(n, 1), 3),
                "kv_link_wait_ms_max": round(1e3 * max((k.max_wait_s for k in links), default=0.0), 3),
                # waits in a decode pool for a slot or KV room, which the control plane cannot see
                "decode_queued": sum(p.d_queued for p in pools),
                "decode_wait_ms_mean": round(1e3 * sum(p.d_wait_s for p in pools) / max(n, 1), 3),
                "decode_wait_ms_max": round(1e3 * max((p.d_wait_max for p in pools), default=0.0), 3)}


@TECHNIQUES.register("disaggregation", on=lambda t: t.disaggregation)
class Disaggregation(Technique):
    """``prefill_fraction`` of each site's replicas prefill, the rest decode; KV moves at ``kv_link_gbps``."""

    def __init__(self, t):
        super().__init__(t)
        self.factories: dict[str, DisaggFactory] = {}

    def engine(self, name, sim, replica):
        factory = self.factories.get(name)
        if factory is None:
            factory = self.factories[name] = DisaggFactory(self.t.prefill_fraction, self.t.kv_link_gbps)
        return factory(sim, replica)

    def report(self, name, block, requests, frame, arrival_s, fleet, start_utc, day_s):
        idle = DisaggFactory(self.t.prefill_fraction, self.t.kv_link_gbps)  # no generative replica ran
        block["disaggregation"] = self.factories.get(name, idle).stats()
