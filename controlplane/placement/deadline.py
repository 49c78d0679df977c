"""Run a solver call with a hard wall-clock deadline.

HiGHS reads its ``time_limit`` between phases, not inside them: on the 339-PoP x 20-model placement problem a
MILP given 2.5 s came back after 7 s (a phase it does not interrupt), so a policy that promises a time budget
cannot rely on it. :func:`call_with_deadline` runs the call in a forked child and, if no answer has come by the
deadline, kills the child and returns ``None``: the caller keeps the best plan it had before the call.

Forking is used where it is the platform's safe default (Linux): the child starts at once with the parent's
memory, nothing is pickled on the way in, only the result comes back through a pipe. Elsewhere, and inside a
daemonic process (which may not have children), the call runs in this process and the deadline is only the
solver's own time limit.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable


def can_enforce() -> bool:
    """Whether :func:`call_with_deadline` can stop a call at its deadline here (a forked child is allowed)."""
    return sys.platform.startswith("linux") and not multiprocessing.current_process().daemon


def call_with_deadline(fn: Callable, deadline: float, *args, **kwargs):
    """``fn(*args, **kwargs)``, or ``None`` when it has not returned by ``deadline`` (a ``time.perf_counter()``
    value). An exception in ``fn`` is raised here again."""
    if not can_enforce():
        return fn(*args, **kwargs)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
    child.start()
    send.close()  # the child holds the only writer: a child that dies makes recv() raise EOFError
    try:
        if not recv.poll(max(0.0, deadline - time.perf_counter())):
            return None
        try:
            ok, value = recv.recv()
        except EOFError:  # the child died without an answer (killed from outside, out of memory)
            return None
        if not ok:
            raise value
        return value
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        recv.close()


def _child(send, fn, args, kwargs) -> None:
    try:
        out = (True, fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        out = (False, exc)
    send.send(out)
    send.close()
