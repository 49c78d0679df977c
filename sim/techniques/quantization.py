"""Quantization in the simulator: every LLM entry of the catalog served at ``precision``.

:func:`controlplane.perf.with_precision` rewrites a catalog entry's weight bytes, so VRAM fit, placement and the
roofline's memory traffic all follow; the roofline also takes the precision's tensor-core peak.
"""

from __future__ import annotations

from controlplane.catalog import Catalog
from controlplane.perf import with_precision
from sim.techniques.base import TECHNIQUES, Technique


def quantize_catalog(catalog: Catalog, precision: str) -> Catalog:
    """Every LLM (text-generation) entry served at ``precision``: weight bytes, VRAM fit and roofline follow."""
    if not precision:
        return catalog
    specs = [with_precision(s, precision) if s.task == "text-generation" else s for s in catalog]
    return Catalog(specs, source=f"{catalog.source} @ {precision}")


@TECHNIQUES.register("quantization", on=lambda t: bool(t.precision))
class Quantization(Technique):
    """``precision``: the LLMs' weight format (fp8, int8, int4, ...)."""

    def catalog(self, catalog):
        return quantize_catalog(catalog, self.t.precision)
