"""The engine's allocator setting: freed KV arrays stay with the process, so the next copy does not page-fault."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"

PROBE = """
import numpy as np, os, sys
from dataplane.memory import keep_freed_memory
set_ = keep_freed_memory()
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
a = np.ones(24 << 20, np.uint8)  # a KV-sized array, touched
before = rss()
del a
print(set_, (before - rss()) >> 20)
"""


def _probe(default: bool) -> tuple[bool, int]:
    env = {**os.environ, "EDGEPOP_MALLOC_DEFAULT": "1" if default else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    flag, freed_mib = out.stdout.split()
    return flag == "True", int(freed_mib)


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's; elsewhere keep_freed_memory does nothing")
def test_freed_kv_memory_stays_with_the_process():
    kept_set, kept_freed = _probe(default=False)
    default_set, default_freed = _probe(default=True)
    assert kept_set and not default_set
    assert default_freed >= 20  # glibc's default: a 24 MiB block goes back to the kernel when freed
    assert kept_freed <= 4  # set: it stays for the next copy


def test_keep_freed_memory_is_idempotent():
    from dataplane.memory import keep_freed_memory

    assert keep_freed_memory() == keep_freed_memory()
