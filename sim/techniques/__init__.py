"""Serving techniques in the simulator, each switched on by a scenario's ``[techniques]`` table.

Start with :mod:`sim.techniques.config` (the switches and their parameters) and :mod:`sim.techniques.base` (the
hooks a technique may implement and the :data:`~sim.techniques.base.TECHNIQUES` registry). Then one module per
technique: :mod:`~sim.techniques.caching` (prefix caching, LoRA adapters), :mod:`~sim.techniques.speculative`,
:mod:`~sim.techniques.disagg` (prefill/decode disaggregation), :mod:`~sim.techniques.quantization`,
:mod:`~sim.techniques.batch_policy` (async batch on idle GPUs), :mod:`~sim.techniques.chunked` (chunked
prefill). :mod:`~sim.techniques.runtime` composes the
enabled ones for a run; :mod:`~sim.techniques.metrics` computes the figures they are compared on and
:mod:`~sim.techniques.ablation` runs the ablation (every technique alone against the same arrivals) as a sweep.
:mod:`~sim.techniques.adapters` draws the LoRA adapter each request names (the workload's ``adapter`` column).
docs/techniques.md says what each technique models.

A new technique: subclass :class:`~sim.techniques.base.Technique`, register it with a switch, import its module
below.
"""

from sim.techniques import batch_policy, caching, chunked, disagg, quantization, speculative  # noqa: F401  (register)
from sim.techniques.base import TECHNIQUES, Technique
from sim.techniques.config import Techniques, parse_techniques
from sim.techniques.runtime import TechniqueRuntime

__all__ = ["TECHNIQUES", "Technique", "TechniqueRuntime", "Techniques", "parse_techniques"]
