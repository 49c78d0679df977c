"""The roofline's fitted constants: hardware efficiencies shared by every engine, and one
:class:`EngineProfile` per serving stack (fixed costs per pass, attention-kernel quality).

Values and their provenance are in ``controlplane/data/perf_params.json`` (refit with ``python -m
controlplane.perf_calibration``); :class:`controlplane.perf.Roofline` reads them. The methods that take a
GPU take a :class:`controlplane.perf.GPU` (not imported here: perf imports this module).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from edgepop.errors import UserError, is_real

PARAMS_FILE = Path(__file__).parent / "data" / "perf_params.json"
# Allowed range of each overridable constant: (low, low allowed, high). Efficiencies are fractions of a peak
# (above 1 a pass beats the hardware); the smooth maximum needs an exponent >= 1 (1: compute + memory).
RANGES = {"gemm_efficiency": (0.0, False, 1.0), "bw_efficiency": (0.0, False, 1.0),
          "weight_only_bw_efficiency": (0.0, False, 1.0), "elementwise_efficiency": (0.0, False, 1.0),
          "link_efficiency": (0.0, False, 1.0), "fp8_gemm_factor": (0.0, False, 1.0),
          "gemm_half_tokens": (0.0, True, math.inf), "layer_floor_us": (0.0, True, math.inf),
          "overlap_exponent": (1.0, True, math.inf), "allreduce_latency_us": (0.0, True, math.inf),
          "allreduce_ll_latency_us": (0.0, True, math.inf)}


def check_override(name: str, value) -> None:
    """A UserError naming ``name`` and ``value`` unless it is a finite number in the constant's range (or a
    dict of them, keyed by GPU type or kind)."""
    low, low_ok, high = RANGES[name]
    rule = f"{'>=' if low_ok else '>'} {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
    for key, v in (value.items() if isinstance(value, dict) else [(None, value)]):
        ok = is_real(v) and math.isfinite(v)
        if not (ok and (v >= low if low_ok else v > low) and v <= high):
            what = f"{name}[{key!r}]" if key is not None else name
            raise UserError(f"roofline parameter {what} must be a finite number {rule}, got {v!r}")


@dataclass(frozen=True)
class EngineProfile:
    """What the serving software adds on top of the hardware: fixed costs per pass and attention kernel quality.

    ``attn_efficiency`` is the fraction of the 16-bit peak the prefill attention kernel reaches (FlashAttention-2/3
    reach 50-75%; stacks without fused attention much less). ``elementwise_factor`` is the share of the
    unfused element-wise traffic (norms, adds, rotary, activation as separate kernels = 1.0) an engine still
    moves after fusing them into its GEMMs and into each other. ``dense_attention_bytes`` is for stacks that
    materialise attention as one dense masked score matrix over the whole pass (every prompt of a batch
    against every other, every head on every GPU of the group): bytes moved through memory per score element
    per head and layer, 0 for engines with fused, per-sequence, head-sharded kernels. ``barrier_jitter_us`` is for
    stacks whose tensor-parallel workers each launch their kernels from their own host thread, unsynchronised
    (eager multi-process stacks): the spread (standard deviation) of when the workers reach an all-reduce, which
    waits for the last of them, on average :func:`controlplane.perf.straggler_factor` (tp) spreads after the
    typical one; 0 for engines whose workers run captured or lockstep launches. ``first_token_decode``: the
    engine's prefill stops one token short of each prompt and the first token comes out of a decode step that
    processes the last prompt token (TurboMind 0.1's ``ContextDecode`` "skip[s] the last input token (will
    process with decoder later)"), so its time to first token is a prefill over ``n - 1`` tokens (none for a
    one-token prompt) plus one decode step, with that step's overhead too. ``gemm_efficiency``: the share of the
    pass's dense peak (of its precision) this engine's passes reach on every board, replacing the boards' fitted GEMM
    efficiencies (and the FP8 factor); None for the language-model engines, whose efficiencies are the boards'. The
    image server's convolution nets reach a lower share than a language model's large GEMMs.
    """

    prefill_overhead_ms: float = 3.0
    step_overhead_ms: float = 2.0
    attn_efficiency: float = 0.5
    elementwise_factor: float = 1.0
    dense_attention_bytes: float = 0.0
    barrier_jitter_us: float = 0.0
    first_token_decode: bool = False
    gemm_efficiency: float | None = None
    description: str = ""


@dataclass(frozen=True)
class RooflineParams:
    """The fitted constants (see ``controlplane/data/perf_params.json`` for values and provenance).

    Hardware-side constants are shared by every engine; ``engines`` holds one :class:`EngineProfile` per serving
    stack seen in the reference data plus ``default`` (a modern optimised engine: what estimates use).
    """

    gemm_efficiency: dict = field(default_factory=lambda: {"ampere": 0.6, "hopper": 0.45, "ada": 0.5,
                                                           "turing": 0.6})
    gemm_half_tokens: float = 64.0
    fp8_gemm_factor: float = 1.0
    bw_efficiency: dict = field(default_factory=lambda: {"hbm": 0.8, "gddr": 0.8})
    weight_only_bw_efficiency: float = 0.8
    elementwise_efficiency: float = 0.4
    layer_floor_us: float = 0.0
    overlap_exponent: float = 4.0
    allreduce_latency_us: dict = field(default_factory=lambda: {"nvlink": 15.0, "pcie": 15.0})
    allreduce_ll_latency_us: float = 15.0
    link_efficiency: dict = field(default_factory=lambda: {"nvlink": 0.7, "pcie": 0.7})
    engines: dict = field(default_factory=lambda: {"default": EngineProfile(description="built-in default")})

    @classmethod
    def load(cls, path: str | Path | None = None) -> RooflineParams:
        """Read the fitted constants (the shipped file by default; built-in defaults if it does not exist)."""
        path = Path(path) if path else PARAMS_FILE
        if not path.exists():
            return cls()
        try:
            doc = json.loads(path.read_text())["params"]
            values = {f.name: doc[f.name] for f in fields(cls) if f.name != "engines"}
            engines = {name: EngineProfile(**prof) for name, prof in doc["engines"].items()}
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UserError(f"{path}: not a perf parameter file ({exc})") from None
        if "default" not in engines:
            raise UserError(f"{path}: engines has no 'default' profile")
        return cls(**values, engines=engines)

    def by(self, name: str, key: str) -> float:
        """Constant ``name`` for ``key`` (an architecture, memory or link kind); a plain number applies to all."""
        value = getattr(self, name)
        return float(value[key]) if isinstance(value, dict) else float(value)

    def compute_efficiency(self, g) -> float:
        """GEMM efficiency of GPU type ``g``: its own fitted value, else its architecture's (the median of the
        fitted boards of that architecture, or of all boards when none was measured)."""
        table = self.gemm_efficiency
        if not isinstance(table, dict):  # (a plain number applies to every GPU, as for the other efficiencies)
            return float(table)
        return float(table.get(g.name, table.get(g.arch, table.get("ampere", 0.6))))

    def memory_efficiency(self, g) -> float:
        """Fraction of the memory bandwidth weight streaming reaches on ``g``: its own fitted value, else its
        memory technology's (HBM or GDDR)."""
        table = self.bw_efficiency
        if not isinstance(table, dict):
            return float(table)
        return float(table.get(g.name, table.get(g.memory_kind, 0.8)))

    def link_efficiency_of(self, g) -> float:
        """Fraction of the link bandwidth a ring all-reduce reaches on ``g``'s boxes (else its link kind's)."""
        table = self.link_efficiency
        if not isinstance(table, dict):
            return float(table)
        return float(table.get(g.name, table.get(g.link_kind, 0.7)))

    def engine(self, name: str) -> EngineProfile:
        try:
            return self.engines[name]
        except KeyError:
            raise UserError(f"unknown engine profile {name!r} (known: {', '.join(sorted(self.engines))})") from None

    def to_dict(self) -> dict:
        return asdict(self)
