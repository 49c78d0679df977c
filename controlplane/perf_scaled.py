"""Any service-time model with its prefill and decode times multiplied: a stress test of the model's calibration.

The calibrated roofline's simulated replica serves 1.2x (one client) to 1.7x (100-250 clients) the requests/s of
the engine it was checked against under load (docs/perf-model.md, "The simulated replica under load"). A scenario's
``prefill_time_scale`` and ``decode_time_scale`` ask what a slower replica would change: every prefill (alone, in
a batch, or in a mixed iteration's prefill part) and every decode step takes that many times as long, for the
placement's capacity estimates, the control plane's and the replica engines alike. A uniform factor, not a model of
the bias: the measured one grows with batch and context, so read a run with it as the direction and size of what a
slower replica does, not as a calibrated prediction.
"""

from __future__ import annotations


class ScaledPerf:
    """``perf`` (same interface) with prefill times x ``prefill`` and decode step times x ``decode``.

    A mixed iteration (chunked prefill beside decode steps) is split into its two parts by asking ``perf`` for
    each alone, so each part takes its own factor. A one-shot model's pass (embedding, image, speech) is its
    prefill. Everything else (memory, flags, options) is ``perf``'s; its breakdowns are refused (their parts would
    not add up to the scaled times)."""

    def __init__(self, perf, prefill: float = 1.0, decode: float = 1.0):
        for name, value in (("prefill", prefill), ("decode", decode)):
            if not (isinstance(value, int | float) and 0 < value <= 100):
                raise ValueError(f"{name} time scale must be in (0, 100], got {value!r}")
        self.perf = perf
        self.prefill = float(prefill)
        self.decode = float(decode)

    def prefill_ms(self, spec, gpu, tokens, **kw) -> float:
        return self.prefill * self.perf.prefill_ms(spec, gpu, tokens, **kw)

    def _prefill_batch_ms(self, spec, gpu, tokens_list, **kw) -> float:
        return self.prefill * self.perf.prefill_batch_ms(spec, gpu, tokens_list, **kw)

    def decode_step_ms(self, spec, gpu, batch, context, **kw) -> float:
        return self.decode * self.perf.decode_step_ms(spec, gpu, batch, context, **kw)

    def _mixed_step_ms(self, spec, gpu, prompts, batch, context, **kw) -> float:
        whole = self.perf.mixed_step_ms(spec, gpu, prompts, batch, context, **kw)
        if self.prefill == self.decode:
            return self.prefill * whole
        # the decode part: what the batch's step alone costs; the rest of the iteration is the prompts'
        own = {k: v for k, v in kw.items() if k != "prior"}
        decode = min(self.perf.decode_step_ms(spec, gpu, batch, context, **own), whole) if batch else 0.0
        return self.decode * decode + self.prefill * (whole - decode)

    def __getattr__(self, name):
        if name == "perf":  # not set yet (a copy or an unpickling in progress)
            raise AttributeError(name)
        attr = getattr(self.perf, name)  # callers ask getattr(perf, name, None): present only where perf has it
        if name in ("prefill_batch_ms", "mixed_step_ms"):
            return getattr(self, f"_{name}")
        if name in ("prefill_breakdown", "decode_breakdown", "mixed_breakdown"):
            raise AttributeError(f"{name} of a scaled service-time model: its parts are not scaled; ask the "
                                 "wrapped model (ScaledPerf.perf)")
        return attr  # memory, flags (counts_prefix_attention) and options are the wrapped model's


def scaled_perf(perf, prefill: float = 1.0, decode: float = 1.0):
    """``perf`` itself when both factors are 1 (the same objects and results as without), else a :class:`ScaledPerf`."""
    return perf if prefill == 1.0 and decode == 1.0 else ScaledPerf(perf, prefill, decode)
