"""Faults: a PoP, a GPU node or a backbone link down for an interval.

Spec syntax (CLI ``--fail`` and scenario ``faults = [...]``): ``KIND:TARGET@START+DURATION`` with times in
simulated seconds, e.g. ``pop:FRA@600+300``, ``node:FRA-0@0+3600``, ``link:NewYork-Bude@100+50``.

- node: the node's replicas stop; running requests that have not streamed a token are retried elsewhere (or all
  fail, with ``fault_policy = "fail"``); queued ones are re-routed under either policy; routing skips the node
  until it is back, and then its replicas load their weights again (a cold start each).
- pop: every node at the PoP goes down and, for the edge, the PoP stops announcing its anycast prefix: new
  requests from its users enter at their next-nearest live PoP.
- link: the backbone link is cut; RTTs are recomputed over the remaining graph and routing uses them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from edgepop.errors import UserError
from edgepop.registry import Registry


@dataclass
class Fault:
    """A PoP, GPU node or backbone link down during [start_s, start_s + duration_s)."""

    kind: str  # "pop" | "node" | "link"
    target: str
    start_s: float
    duration_s: float
    origin: str = field(default="", compare=False, repr=False)  # where it was given, for errors ("" = the scenario)


# What happens to requests on a node that fails: each policy answers "retry the ones that streamed nothing yet?".
FAULT_POLICIES = Registry("fault policy")


@FAULT_POLICIES.register("retry")
def retry_unstreamed() -> bool:
    """Requests that have not streamed a token are retried elsewhere; the rest fail with 3043."""
    return True


@FAULT_POLICIES.register("fail")
def fail_all() -> bool:
    """Every request on the failed node fails with 3043."""
    return False


FAULT_SPEC = re.compile(r"^(pop|node|link):([A-Za-z0-9:_.\-]+)@(\d+(?:\.\d+)?)\+(\d+(?:\.\d+)?)$")


def parse_fault(spec: str) -> Fault:
    """Parse ``KIND:TARGET@START+DURATION`` (one-line error naming the spec when malformed)."""
    m = FAULT_SPEC.match(spec.strip())
    if not m:
        raise UserError(f"bad fault spec {spec!r}: expected KIND:TARGET@START+DURATION with KIND pop|node|link, "
                        "e.g. pop:FRA@600+300")
    kind, target, start, dur = m.groups()
    if not (math.isfinite(float(start)) and math.isfinite(float(dur))):  # hundreds of digits read as inf
        raise UserError(f"bad fault spec {spec!r}: start and duration must be finite numbers of seconds")
    if float(dur) <= 0:
        raise UserError(f"bad fault spec {spec!r}: duration must be positive")
    return Fault(kind, target, float(start), float(dur))


def link_ends(target: str, names) -> tuple[str | None, str | None]:
    """The two backbone node names of a link fault's ``A-B`` target: region ids have dashes of their own
    (``aws:ap-northeast-1``), so every dash is tried as the separator; (None, None) when no split names two
    nodes."""
    parts = target.split("-")
    for i in range(1, len(parts)):
        a, b = "-".join(parts[:i]), "-".join(parts[i:])
        if a in names and b in names:
            return a, b
    return None, None


def link_index(backbone, a: str, b: str) -> tuple[int, int] | None:
    """The (lower, higher) node indices of the backbone's direct link between nodes named ``a`` and ``b``."""
    idx = {n: i for i, n in enumerate(backbone.nodes.name)}
    i, j = idx[a], idx[b]
    links = backbone.links
    hit = links[((links.i == i) & (links.j == j)) | ((links.i == j) & (links.j == i))]
    return None if hit.empty else (min(i, j), max(i, j))


def check_fault_targets(faults, topo) -> None:
    """Refuse a node fault whose target cannot name a node of either fleet (node ids are ``<PoP id>-<n>`` at the
    edge and ``<region id>-<n>`` centrally; which nodes a fleet really has is known once it is built, and a fault
    on a node of the other fleet, or past a site's last node, is listed as skipped in summary.json), and a link
    fault that names no direct backbone link."""
    sites = set(topo.pops.id) | set(topo.regions.id)
    backbone = topo.latency.backbone
    names = set(backbone.nodes.name)
    for f in faults:
        if f.kind == "node":
            site, _, n = f.target.rpartition("-")
            if site not in sites or not n.isdigit():
                raise UserError(f"fault node:{f.target}: no node can have this id (node ids are <PoP id>-<n> at "
                                "the edge, e.g. FRA-0, and <region id>-<n> centrally, e.g. aws:eu-west-1-0)")
        elif f.kind == "link":
            check_link_target(f.target, backbone, names)


def check_link_target(target: str, backbone, names) -> tuple[int, int]:
    """The backbone link a link fault's ``A-B`` target names (one-line errors when it names none)."""
    a, b = link_ends(target, names)
    if a is None:
        raise UserError(f"fault link:{target}: endpoints must be backbone node names (PoP ids, region ids or "
                        "landing points) joined by '-'")
    link = link_index(backbone, a, b)
    if link is None:
        raise UserError(f"fault link:{target}: there is no direct backbone link between {a} and {b}")
    return link


class FaultHandler:
    """Applies faults to one running simulation; knows the topology to re-route ingress and recompute RTTs."""

    def __init__(self, topo, deployment, faults):
        self.topo, self.dep = topo, deployment
        self.rtt_builder = deployment.rtt_builder  # latency model -> the deployment's ingress x site RTT matrix
        self.down_pops: set[int] = set()
        self._city_pop_rtt: dict[int, np.ndarray] = {}
        self._last_mile: np.ndarray | None = None  # every demand city's last mile (ms), read on the first re-route
        self._base_latency = topo.latency
        self._backbone_names = set(topo.latency.backbone.nodes.name)  # (link targets are read against them)
        self._cut_links: set[tuple[int, int]] = set()
        # Faults may overlap on one target (two faults of a PoP, a node fault inside its PoP's): a target is down
        # while any fault holding it is active, so each counts the faults holding it.
        self._held: Counter = Counter()
        self.validate(faults)

    def validate(self, faults) -> None:
        nodes = set(self.dep.fleet.nodes.node_id)
        pops = set(self.topo.pops.id)
        names = self._backbone_names
        for f in faults:
            if f.kind == "node" and f.target not in nodes:
                raise UserError(f"fault {f.kind}:{f.target}: no GPU node {f.target!r} in the {self.dep.name} fleet")
            if f.kind == "pop" and f.target not in pops:
                raise UserError(f"fault pop:{f.target}: unknown PoP id")
            if f.kind == "link":
                check_link_target(f.target, self._base_latency.backbone, names)

    # ---------------------------------------------------------------- apply
    def apply(self, sim, fault, down: bool) -> None:
        """Start (``down``) or end ``fault``: a target goes down with the first fault holding it and comes back
        with the last one's end."""
        now = sim.env.now
        if fault.kind == "node":
            node = int(np.flatnonzero(self.dep.fleet.nodes.node_id.to_numpy() == fault.target)[0])
            self._node(sim, node, down, now)
        elif fault.kind == "pop":
            pop = int(np.flatnonzero(self.topo.pops.id.to_numpy() == fault.target)[0])
            if self._hold(("pop", pop), down):
                (self.down_pops.add if down else self.down_pops.discard)(pop)
            nodes = np.flatnonzero(self.dep.fleet.nodes.site_id.to_numpy() == fault.target).tolist()
            changed = [node for node in nodes if self._hold(("node", node), down)]
            if down:  # all at once: a request lost on one node must not be retried on a sibling about to fail
                sim.kill_nodes(changed, now)
            else:
                for node in changed:
                    sim.revive_node(node, now)
        else:
            link = check_link_target(fault.target, self._base_latency.backbone, self._backbone_names)
            if self._hold(("link", link), down):
                (self._cut_links.add if down else self._cut_links.discard)(link)
                self.dep.plane.state.set_rtt(self.rtt_builder(self._latency()))

    def _hold(self, target, down: bool) -> bool:
        """Count one more (``down``) or one fewer fault holding ``target``; whether its state changes."""
        self._held[target] += 1 if down else -1
        return self._held[target] == (1 if down else 0)

    def _node(self, sim, node: int, down: bool, now: float) -> None:
        if self._hold(("node", node), down):
            (sim.kill_node if down else sim.revive_node)(node, now)

    def _latency(self):
        """The latency model without the cut links (all-pairs shortest paths recomputed)."""
        from topology.latency import Backbone, LatencyModel

        base = self._base_latency
        if not self._cut_links:
            return base
        links = base.backbone.links
        keep = [(min(i, j), max(i, j)) not in self._cut_links for i, j in zip(links.i, links.j, strict=True)]
        return LatencyModel(Backbone(base.backbone.nodes, links[keep].reset_index(drop=True)), base.params)

    def reingress(self, sim, k: int) -> int:
        """Ingress key for request ``k`` now: its anycast PoP, or the next-nearest live one if that PoP is down
        (its access RTT then that PoP's, or the first one's if larger: the user's city's last mile as the
        workload's, scaled by the request's RTT factor as its first one was)."""
        key = int(sim.key[k])
        if self.dep.ingress_col != "ingress" or key not in self.down_pops:
            return key
        city = int(sim.w.city.iat[k])
        rtt = self._city_pop_rtt.get(city)
        if rtt is None:
            d = self.topo.demand
            if self._last_mile is None:
                self._last_mile = self.topo.demand_last_mile_ms()
            rtt = self.topo.user_pop_rtt(d.lat.to_numpy()[[city]], d.lon.to_numpy()[[city]],
                                         self._last_mile[[city]])[0]
            self._city_pop_rtt[city] = rtt
        masked = rtt.copy()
        masked[list(self.down_pops)] = np.inf
        new = int(np.argmin(masked))
        # A live PoP nearer than the down one it was sent to (a request anycast had misrouted) is reached no
        # sooner than that one would have been: the arrival feed has already spent that trip, so the request
        # keeps its access RTT (its TTFT still adds up: the one-way trip it is decided after is its wan_in).
        sim.access_s[k] = max(float(rtt[new]) * float(sim.rtt_factor[k]) / 1e3, float(sim.access_s[k]))
        sim.key[k] = new
        return new


def faults_for(faults, dep) -> tuple[list, list[str]]:
    """The faults that apply to ``dep`` and the skipped ones with why: a node fault applies to the deployment whose
    fleet has that node (edge node ids are ``<PoP>-<n>``, central ones ``<region>-<n>``), a PoP fault to the edge
    (central users reach regions directly), a link fault to both."""
    nodes = set(dep.fleet.nodes.node_id)
    keep, skipped = [], []
    for f in faults:
        if f.kind == "node" and f.target not in nodes:
            skipped.append(f"{fault_spec(f)}: no node {f.target!r} in the {dep.name} fleet")
        elif f.kind == "pop" and dep.entry != "anycast":
            skipped.append(f"{fault_spec(f)}: {dep.name} users do not enter through PoPs")
        else:
            keep.append(f)
    return keep, skipped


def fault_spec(f) -> str:
    """``KIND:TARGET@START+DURATION`` as ``--fail`` reads it back (times short where that loses nothing)."""
    def num(v: float) -> str:  # (positional: the spec's '+' separates, so no exponent like 1e+06)
        return np.format_float_positional(float(v), trim="-")
    return f"{f.kind}:{f.target}@{num(f.start_s)}+{num(f.duration_s)}"
