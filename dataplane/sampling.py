"""Sampling parameters and next-token sampling (temperature, top-k, top-p), one seeded generator per request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataplane.errors import InvalidInputError

# Below this a temperature is greedy decoding (vLLM's threshold too): the softmax is one-hot in float64 long
# before, and dividing logits by a subnormal temperature such as 1e-310 overflows them to inf.
GREEDY_BELOW = 1e-5
MAX_TEMPERATURE = 5  # the highest temperature accepted (Workers AI's bound too)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. ``temperature`` below :data:`GREEDY_BELOW` (0 included) is greedy
    decoding."""

    max_tokens: int = 256
    temperature: float = 0.6
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_on_eos: bool = True

    def __post_init__(self):
        def bad(msg):
            raise InvalidInputError(msg)

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float) or not (
            0 <= self.temperature <= MAX_TEMPERATURE
        ):
            bad(f"temperature must be a number in [0, {MAX_TEMPERATURE}], got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            bad(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.top_p is not None and (
            isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1
        ):
            bad(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            bad(f"seed must be a non-negative integer, got {self.seed!r}")


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Draw the next token id from one row of logits."""
    if params.temperature < GREEDY_BELOW:
        return int(np.argmax(logits))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf logits are reported below, with a message of our own
        # (from GREEDY_BELOW up, float32 logits divided by the temperature stay finite; unshifted, as it always was,
        # so a seeded request draws the tokens it drew before)
        z = logits.astype(np.float64) / params.temperature
        if params.top_k is not None and params.top_k < z.size:
            kth = np.partition(z, -params.top_k)[-params.top_k]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z - z.max())
        total = p.sum()
    if not np.isfinite(total) or total <= 0:  # NaN or +inf logits: the model is broken, not the request
        raise ValueError(f"cannot sample from non-finite logits (max {logits.max()!r}, any NaN: "
                         f"{bool(np.isnan(logits).any())})")
    p /= total
    if params.top_p is not None and params.top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, params.top_p) + 1)]  # smallest set reaching top_p
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    return int(rng.choice(p.size, p=p))
