"""Wire the ``[techniques]`` switches owned by the simulator into one scenario run.

``run_scenario`` calls, in order: :meth:`TechniqueRuntime.catalog` (quantization), :meth:`perf` (speculative
decoding), per deployment :meth:`workload` (async batch policy, edge only) and :meth:`engine_factory`
(disaggregation), and after the run :meth:`summary`. With every switch off each call returns its input unchanged
and no summary block is written, so scenarios without a ``[techniques]`` table simulate exactly as before.
"""

from __future__ import annotations

import numpy as np

from controlplane.catalog import Catalog
from controlplane.perf import with_precision


def quantize_catalog(catalog: Catalog, precision: str) -> Catalog:
    """Every LLM (text-generation) entry served at ``precision``: weight bytes, VRAM fit and roofline follow."""
    if not precision:
        return catalog
    specs = [with_precision(s, precision) if s.task == "text-generation" else s for s in catalog]
    return Catalog(specs, source=f"{catalog.source} @ {precision}")


class TechniqueRuntime:
    """The simulator-side techniques of one scenario (``sc.techniques``)."""

    def __init__(self, techniques):
        self.t = techniques
        self.factories: dict = {}
        self.info: dict = {}

    @property
    def active(self) -> bool:
        t = self.t
        return bool(t.speculative or t.disaggregation or t.precision or t.batch_policy != "none")

    def catalog(self, catalog: Catalog) -> Catalog:
        return quantize_catalog(catalog, self.t.precision)

    def perf(self, perf):
        if not self.t.speculative:
            return perf
        from sim.speculative import SpeculativePerf

        return SpeculativePerf(perf, self.t.spec_k, self.t.spec_acceptance, self.t.spec_draft_cost)

    def workload(self, name: str, frame, dep, placement, topo, start_utc, day_s: float):
        """The frame this deployment simulates and the original arrivals (batch rows may be held)."""
        if self.t.batch_policy != "night" or name != "edge":
            return frame, None
        from controlplane.fleet import ingress_site_rtt
        from sim.batch_policy import apply_night_policy

        out, orig, info = apply_night_policy(frame, topo, dep.fleet, placement.table, start_utc, day_s,
                                             ingress_site_rtt(topo, dep.fleet))
        self.info[name] = {"batch_policy": info}
        return out, orig

    def engine_factory(self, name: str):
        if not self.t.disaggregation:
            return None
        from sim.disagg import DisaggFactory

        self.factories[name] = DisaggFactory(self.t.prefill_fraction, self.t.kv_link_gbps)
        return self.factories[name]

    def summary(self, name: str, requests, frame, orig_arrival, fleet, start_utc, day_s: float) -> dict | None:
        """The ``techniques`` block of a deployment's summary (None when every switch is off)."""
        if not self.active:
            return None
        from sim.techmetrics import technique_figures

        batch = frame.batch.to_numpy(dtype=bool) if "batch" in frame else np.zeros(len(frame), bool)
        arrival = frame.arrival_s.to_numpy(dtype=float)
        orig = arrival if orig_arrival is None else np.asarray(orig_arrival, dtype=float)
        # completion of a request (s) counted from when the user sent it (holds included)
        completion = requests.e2e_ms.to_numpy(dtype=float) / 1e3 + (arrival - orig)
        block = {"enabled": self.t.enabled(), **self.info.get(name, {}),
                 "figures": technique_figures(requests, ~batch, completion)}
        if batch.any():
            from sim.batch_policy import night_share

            block["batch_served_at_night_share"] = round(night_share(requests, batch, fleet, start_utc, day_s,
                                                                     arrival), 4)
        if name in self.factories:
            block["disaggregation"] = self.factories[name].stats()
        return block
