"""Polling until something is so: a hang guard for tests that wait on a server, an engine or a process, never a
timing goal (a generous limit, and the assertion names what never happened)."""

from __future__ import annotations

import time


def until(check, message: str, limit_s: float = 120.0, poll_s: float = 0.01) -> None:
    """Call ``check()`` every ``poll_s`` until it is true; fail with ``message`` after ``limit_s`` seconds."""
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(poll_s)
