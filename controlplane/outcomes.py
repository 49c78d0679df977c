"""Request outcomes and error codes that mirror Workers AI.

Invariant (checked by the simulator at the end of every run and by tests): every request that arrives ends exactly
once, as ``ok``, ``rejected`` (never started: bad input, no capacity, queue timeout) or ``failed`` (started, then
lost to a fault).
"""

from __future__ import annotations

from enum import IntEnum

OK, REJECTED, FAILED = "ok", "rejected", "failed"
OUTCOMES = (OK, REJECTED, FAILED)


class Code(IntEnum):
    """Workers AI error codes (developers.cloudflare.com/workers-ai/platform/errors)."""

    TOO_LARGE = 3006  # "Request is too large"
    TIMEOUT = 3007  # "Request timeout"
    OUT_OF_CAPACITY = 3040  # "Out of capacity"
    INTERNAL = 3043  # "Internal server error": used for requests lost when their node fails
    NO_SUCH_MODEL = 5007  # "No such model"


HTTP_STATUS = {Code.TOO_LARGE: 413, Code.TIMEOUT: 408, Code.OUT_OF_CAPACITY: 429, Code.INTERNAL: 500,
               Code.NO_SUCH_MODEL: 400}

MESSAGES = {Code.TOO_LARGE: "Request is too large", Code.TIMEOUT: "Request timeout",
            Code.OUT_OF_CAPACITY: "Out of capacity", Code.INTERNAL: "Internal server error",
            Code.NO_SUCH_MODEL: "No such model"}

# What each code means in this system, as a report says it (after the Workers AI message above).
MEANINGS = {Code.TOO_LARGE: "prompt + output over the model's context window or KV pool",
            Code.TIMEOUT: "waited in a queue past its timeout, or was still waiting when the run ended",
            Code.OUT_OF_CAPACITY: "no replica had room for it",
            Code.INTERNAL: "lost when its node failed", Code.NO_SUCH_MODEL: "a model the deployment does not serve"}
