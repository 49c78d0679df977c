"""Process memory policies: a serving engine keeps freed KV arrays (the next copy does not page-fault), a
simulation returns freed large blocks to the kernel; the last one set in a process wins. Placement pauses the
cyclic garbage collector and restores whatever state it found."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"

PROBE = """
import numpy as np, os
from edgepop.memory import keep_freed_memory, release_large_blocks
ok = [{"keep": keep_freed_memory, "release": release_large_blocks}[p]() for p in os.environ["POLICIES"].split()]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
a = np.ones(24 << 20, np.uint8)  # a KV-sized array, touched
before = rss()
del a
print(all(ok), (before - rss()) >> 20)
"""


def _probe(policies: str, default: bool = False) -> tuple[bool, int]:
    env = {**os.environ, "POLICIES": policies, "EDGEPOP_MALLOC_DEFAULT": "1" if default else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    flag, freed_mib = out.stdout.split()
    return flag == "True", int(freed_mib)


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's; elsewhere both functions do nothing")
def test_engine_keeps_freed_memory_and_a_simulation_returns_it_last_call_wins():
    flag, freed = _probe("keep")
    assert flag and freed <= 4  # kept for the next copy
    flag, freed = _probe("keep", default=True)  # EDGEPOP_MALLOC_DEFAULT=1: glibc's defaults
    assert not flag and freed >= 20  # a 24 MiB block goes back to the kernel when freed
    assert _probe("release")[1] >= 20
    assert _probe("release keep")[1] <= 4 and _probe("keep release")[1] >= 20


def test_policies_are_idempotent():
    from edgepop.memory import keep_freed_memory

    assert keep_freed_memory() == keep_freed_memory()


def test_collector_paused_restores_what_it_found():
    """Off inside (nested blocks too), back on after, and left off if it was off: a caller that turned the collector
    off itself keeps it off."""
    import gc

    from edgepop.memory import collector_paused

    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("restored on errors too")
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("restored on errors too")
        assert gc.isenabled()
    finally:
        gc.enable()


FREEZE = """
import gc
from edgepop.memory import freeze_startup
start_up = [[i] for i in range(3)]
start_up.append(start_up)  # a cycle: the kind of object a full collection walks
n = freeze_startup()
later = [1]
later.append(later)
tracked = {id(o) for o in gc.get_objects()}  # the collector's generations (frozen objects are not in them)
print(n == gc.get_freeze_count() > 0, id(start_up) not in tracked, id(later) in tracked)
"""


def test_freeze_startup_takes_what_exists_out_of_the_collector_and_nothing_made_later():
    # in a child: freezing is process-wide and permanent
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]
