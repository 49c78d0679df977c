"""Where edgepop keeps files it derives and can always derive again, and how it writes them.

The root is ``$EDGEPOP_CACHE_DIR`` or the user cache directory (``$XDG_CACHE_HOME/edgepop``, default
``~/.cache/edgepop``), with one folder per kind beside ``rtt/`` (:mod:`topology.rtt_cache`): ``placement/``
(:mod:`controlplane.placement.cache`), ``cities/`` (:mod:`topology.demand`). Every entry is keyed by a hash of
everything it depends on, so a stale one is never read; ``EDGEPOP_NO_CACHE=1`` turns every disk cache off. Kept
free of imports from the rest of ``topology``, which every cache user imports.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_folder(kind: str) -> Path | None:
    """The folder of one kind of cache entry (``rtt``, ``placement``, ``cities``) under the root, or None when the
    disk cache is off."""
    if os.environ.get("EDGEPOP_NO_CACHE"):
        return None
    base = os.environ.get("EDGEPOP_CACHE_DIR")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "edgepop" / kind


def cache_dir() -> Path | None:
    """The RTT matrices' folder, ``<root>/rtt``, or None when the disk cache is off."""
    return cache_folder("rtt")


def write_atomic(path: Path, write) -> None:
    """``write(binary file)`` into a temporary file next to ``path``, then renamed onto it: a reader never sees
    half a file. A cache file that cannot be written is simply not kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass
