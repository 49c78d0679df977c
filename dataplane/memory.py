"""The process's allocator, set for an engine that copies its KV arrays whenever its batch changes.

Every join and leave copies the batch's KV cache (one array per layer and kind) into fresh arrays, tens of MiB
at a time. glibc's malloc by default hands freed memory back to the kernel once the free top of its heap exceeds
a threshold that adapts to recent allocation sizes, so the next copy of that size page-faults every page anew:
measured on the stand-in's layout (12 arrays), a 64 MiB copy took 13-17 ms that way and 5 ms with freed memory
kept, and the cost jumped with the allocator's history rather than growing with size. :func:`keep_freed_memory`
fixes the thresholds once per process (allocations up to 32 MiB from the heap, freed memory kept up to 1 GiB),
so copy time is memory bandwidth and grows linearly with size, in the engine and in the profile that times it.
Elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD = 1 << 30
_lock = threading.Lock()
_state: dict[str, bool] = {}


def keep_freed_memory() -> bool:
    """Set the thresholds (once per process); True when they are set. ``EDGEPOP_MALLOC_DEFAULT=1`` leaves
    glibc's defaults (to measure what they cost)."""
    with _lock:
        if "set" not in _state:
            _state["set"] = _mallopt() if os.environ.get("EDGEPOP_MALLOC_DEFAULT") != "1" else False
        return _state["set"]


def _mallopt() -> bool:
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
