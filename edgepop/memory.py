"""Process memory: return freed large arrays to the operating system (glibc only; elsewhere a no-op).

glibc serves a freed block's size from its heap next time: after the first large array is freed, its mmap
threshold rises (up to 32 MB), so later arrays of a few MB come from the heap, and freeing them leaves holes that
are never given back. A simulation of a million requests frees hundreds of such arrays (workload generation, the
per-deployment state, summaries) and kept ~0.2-0.4 GB of freed memory that way. A fixed threshold keeps every
large array in its own mapping, unmapped when freed; the extra map/unmap calls cost well under 1% of a run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
LARGE_BYTES = 256 * 1024
_done = False


def release_large_blocks() -> bool:
    """Fix glibc's mmap threshold at 256 KiB for this process (once); False where that is not glibc's."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _done = bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BYTES))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        _done = False
    return _done
