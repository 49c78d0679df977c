"""A solver call with a hard deadline: the answer when it comes in time, None when it does not, its errors
raised in the caller."""

import time

import numpy as np
import pytest

from controlplane.placement.deadline import call_with_deadline, can_enforce


def _slow(seconds: float, value):
    time.sleep(seconds)
    return value


def _fails():
    raise ValueError("bad model")


# The deadlines of calls that finish are far away (they return as soon as they are done): only whether an answer
# comes back is asserted, never how fast.
def test_answer_in_time_comes_back_whole():
    x = np.arange(200_000, dtype=np.float64)  # larger than a pipe's buffer
    out = call_with_deadline(np.add, time.perf_counter() + 600.0, x, 1.0)
    assert np.array_equal(out, x + 1.0)
    assert call_with_deadline(_slow, time.perf_counter() + 600.0, 0.0, value="ok") == "ok"


def test_errors_are_raised_in_the_caller():
    with pytest.raises(ValueError, match="bad model"):
        call_with_deadline(_fails, time.perf_counter() + 600.0)


@pytest.mark.skipif(not can_enforce(), reason="needs a forked child (Linux, not a daemonic process)")
def test_a_call_still_running_at_the_deadline_gives_none():
    # Were the deadline not enforced, the call would return "late" after 30 s and the assertion would fail.
    assert call_with_deadline(_slow, time.perf_counter() + 0.2, 30.0, value="late") is None
