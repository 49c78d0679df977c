"""Node and PoP faults inside a run: what happens to the requests on a node that goes down, and its return.

A mixin of :class:`sim.simulator.Simulation` (it reads the simulation's per-request arrays and calls its
``_submit``/``_end``/``_flush``); the fault schedule itself and which nodes a fault takes are ``sim.faults``.
"""

from __future__ import annotations

from controlplane.outcomes import Code
from sim.faults import Fault
from sim.request_frame import OUT_FAILED

NAN = float("nan")


class NodeFaults:
    """Fault handling of a :class:`sim.simulator.Simulation`: a fault process, nodes taken down and revived."""

    def _lost(self, reqs, now: float, started: bool) -> None:
        """Requests whose node failed: retry those that have not streamed a token yet (queued ones, ``started``
        False, whatever the fault policy: they lost only their place in a queue), fail the rest."""
        for req in reqs:
            k = req.payload
            seq = self.seqs[k]
            if seq is not None:
                seq.done = True
            streamed = self.first_token[k] == self.first_token[k]  # not NaN
            if (self.retry_unstreamed or not started) and not streamed:
                self.retries[k] += 1
                self.cold_ms[k] = 0.0
                self.seqs[k] = None
                req.replica = None
                # where the lost attempt was: a retry refused outright was served nowhere (no node, no RTT)
                self.site[k] = self.node[k] = -1
                self.backbone_ms[k] = self.at_node[k] = NAN
                self._submit(k, now)
            else:
                self._end(k, OUT_FAILED, int(Code.INTERNAL))

    def _faults(self, fault: Fault):
        yield self.env.timeout(max(0.0, fault.start_s - self.env.now))
        self.fault_handler.apply(self, fault, down=True)
        yield self.env.timeout(fault.duration_s)
        self.fault_handler.apply(self, fault, down=False)

    def kill_node(self, node: int, now: float) -> None:
        """Take a GPU node down: its engines drop everything, its requests are retried or failed."""
        self.kill_nodes([node], now)

    def kill_nodes(self, nodes: list[int], now: float) -> None:
        """Take GPU nodes down together (a PoP's): every one is down before their requests are retried, so no
        retry lands on a node failing in the same instant (and is lost, and counted, twice)."""
        lost, evicted = [], []
        for node in nodes:
            on_node, queued = self.plane.set_node_up(node, False, now)
            lost += on_node
            evicted += queued
            for r in self.plane.state.replicas:
                if r.node == node and r.id in self.engines:
                    self.engines[r.id].kill(now)
                    self.engines[r.id].dead = True
        self._lost(lost, now, started=True)
        self._lost(evicted, now, started=False)
        self._flush()

    def revive_node(self, node: int, now: float) -> None:
        self.plane.set_node_up(node, True, now)
        for r in self.plane.state.replicas:
            if r.node == node and r.id in self.engines:
                self.engines[r.id].dead = False
