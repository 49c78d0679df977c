"""Process memory: how glibc's malloc treats freed large blocks, set per process role (glibc only; elsewhere a
no-op). The two roles want opposite things, and the last call in a process wins.

* **A simulation** (:func:`release_large_blocks`, called by ``sim.run``): glibc serves a freed block's size from
  its heap next time: after the first large array is freed, its mmap threshold rises (up to 32 MB), so later
  arrays of a few MB come from the heap, and freeing them leaves holes that are never given back. A simulation of
  a million requests frees hundreds of such arrays (workload generation, the per-deployment state, summaries)
  and kept ~0.2-0.4 GB of freed memory that way. A fixed threshold keeps every large array in its own mapping,
  unmapped when freed; the extra map/unmap calls cost well under 1% of a run.
* **A serving engine** (:func:`keep_freed_memory`, called by the first ``dataplane.engine_lm.LMEngine``): every
  join and leave copies the batch's KV cache (one array per layer and kind) into fresh arrays, tens of MiB at a
  time. Memory handed back to the kernel must be page-faulted in again by the next copy: on the stand-in's layout
  (12 arrays) a 64 MiB copy took 13-20 ms that way and 5-6 ms with freed memory kept, and its cost jumped with
  the allocator's history rather than growing with size. Allocations up to 32 MiB (glibc's ceiling for the
  setting) come from the heap and up to 1 GiB of freed heap is kept, so a copy costs memory bandwidth, in the
  engine and in the profile that times it. ``EDGEPOP_MALLOC_DEFAULT=1`` leaves glibc's defaults (to measure what
  they cost).

:func:`collector_paused` turns Python's cyclic garbage collector off around work that builds many small, acyclic
objects while a large heap is alive (placement search), where each full pass walks the whole heap and frees
nothing. :func:`freeze_startup` takes what a long-running process built at start-up out of the collector's
passes for good (a gateway: its full passes otherwise walk the topology, control plane and models every time,
holding the interpreter lock, so every engine thread stalls with them).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import threading
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
LARGE_BYTES = 256 * 1024
KEEP_MMAP_BYTES = 32 << 20
KEEP_TRIM_BYTES = 1 << 30
_lock = threading.Lock()
_policy: list[str] = []  # the policy set last in this process, if any


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def _set(policy: str, settings: tuple[tuple[int, int], ...]) -> bool:
    with _lock:
        if _policy and _policy[-1] == policy:
            return True
        mallopt = _mallopt()
        if mallopt is None or not all(mallopt(param, value) for param, value in settings):
            return False
        _policy.append(policy)
        return True


def release_large_blocks() -> bool:
    """Fix glibc's mmap threshold at 256 KiB (a simulation's role); False where that is not glibc's."""
    return _set("release", ((M_MMAP_THRESHOLD, LARGE_BYTES),))


def keep_freed_memory() -> bool:
    """Keep freed memory with the process (a serving engine's role); False where that is not glibc's, or with
    ``EDGEPOP_MALLOC_DEFAULT=1``."""
    if os.environ.get("EDGEPOP_MALLOC_DEFAULT") == "1":
        return False
    return _set("keep", ((M_MMAP_THRESHOLD, KEEP_MMAP_BYTES), (M_TRIM_THRESHOLD, KEEP_TRIM_BYTES)))


@contextmanager
def collector_paused():
    """The cyclic garbage collector off inside the block, restored on exit (blocks nest within a thread; the
    switch is process-wide, so of two threads' overlapping blocks the first to leave turns it back on, costing
    the other only its speed-up; reference counting still frees everything acyclic at once). Placement at 3,000 PoPs makes millions of short-lived lists and tuples:
    with the collector on, its passes over the topology, workload and fleet already in memory took about 0.7 s
    of a 6 s greedy placement and freed nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_startup() -> int:
    """Move every object alive now into the collector's permanent generation (``gc.freeze``) and return how many.

    For a server once it has started: its start-up objects (topology, placement, control plane, models) live as
    long as the process, and each full collection would walk them again. On ``edgepop serve`` (one PoP, the
    stand-in LM) every full collection while serving paused the process for 53-65 ms, 2 ms once frozen, while an
    engine waited on the interpreter lock. Reference counting still frees frozen objects that become unreachable;
    only reference cycles among them are never collected, which start-up objects that live until exit do not
    mind."""
    gc.collect()  # what start-up left as garbage goes now, not into the permanent generation
    gc.freeze()
    return gc.get_freeze_count()
