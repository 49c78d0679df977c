"""The techniques of one scenario run, composed: the one object ``sim.run`` and ``Simulation`` talk to.

``run_scenario`` calls, in order: :meth:`TechniqueRuntime.catalog`, :meth:`perf`, and per deployment
:meth:`plane_options`, :meth:`workload`, :meth:`for_simulation` (the seam handed to ``Simulation``) and, after
the run, :meth:`summarize`. With every switch off each call returns its input unchanged, no seam is handed over
and no summary block is written, so scenarios without a ``[techniques]`` table simulate exactly as plain ones.
"""

from __future__ import annotations

import numpy as np

from sim.techniques.base import TECHNIQUES, Technique
from sim.techniques.metrics import technique_figures


class SimulationSeam:
    """What ``Simulation`` sees of the techniques of one deployment: replica engines and request columns."""

    def __init__(self, name: str, parts: list[Technique]):
        self.name, self.parts = name, parts

    def engine(self, sim, replica):
        for p in self.parts:
            eng = p.engine(self.name, sim, replica)
            if eng is not None:
                return eng
        return None

    def amend(self, sim, frame):
        for p in self.parts:
            frame = p.amend(self.name, sim, frame)
        return frame


class TechniqueRuntime:
    """The techniques a scenario's ``[techniques]`` switches turn on (registry order)."""

    def __init__(self, techniques):
        self.t = techniques
        self.parts: list[Technique] = [TECHNIQUES.create(n, techniques) for n in TECHNIQUES
                                       if TECHNIQUES.entry(n).extra["on"](techniques)]

    @property
    def reported(self) -> bool:
        """Whether deployments get a ``techniques`` block (some technique that changes service is on)."""
        return any(p.reported for p in self.parts)

    def catalog(self, catalog):
        for p in self.parts:
            catalog = p.catalog(catalog)
        return catalog

    def perf(self, perf):
        for p in self.parts:
            perf = p.perf(perf)
        return perf

    def plane_options(self, name: str) -> dict:
        out: dict = {}
        for p in self.parts:
            out.update(p.plane_options(name))
        return out

    def workload(self, name: str, frame, dep, topo, start_utc, day_s: float):
        """The frame deployment ``name`` simulates and the original arrivals (None when none moved)."""
        orig = None
        for p in self.parts:
            frame, moved = p.workload(name, frame, dep, topo, start_utc, day_s)
            orig = moved if moved is not None else orig
        return frame, orig

    def for_simulation(self, name: str) -> SimulationSeam | None:
        return SimulationSeam(name, self.parts) if self.parts else None

    def summarize(self, name: str, block: dict, sim, requests, frame, orig_arrival, fleet, start_utc,
                  day_s: float) -> None:
        """Add the techniques' blocks (and, when one that changes service is on, ``techniques``) to ``block``."""
        for p in self.parts:
            block.update(p.blocks(name, sim, requests))
        if not self.reported:
            return
        batch = frame.batch.to_numpy(dtype=bool) if "batch" in frame else np.zeros(len(frame), bool)
        arrival = frame.arrival_s.to_numpy(dtype=float)
        orig = arrival if orig_arrival is None else np.asarray(orig_arrival, dtype=float)
        # completion of a request (s) counted from when the user sent it (holds included)
        completion = requests.e2e_ms.to_numpy(dtype=float) / 1e3 + (arrival - orig)
        tblock = {"enabled": self.t.enabled(name)}
        for p in self.parts:
            tblock.update(p.info.get(name, {}))
        tblock["figures"] = technique_figures(requests, ~batch, completion)
        for p in self.parts:
            p.report(name, tblock, requests, frame, arrival, fleet, start_utc, day_s)
        block["techniques"] = tblock
