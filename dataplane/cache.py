"""On-disk cache of models built from code, keyed by a hash of their spec.

The cache lives in ``$EDGEPOP_CACHE`` or ``~/.cache/edgepop/models``. A changed spec (or builder version)
gives a new key, so stale files are never reused; files are written atomically so that no process reads a
half-written file, and a lock file per model makes a second process wait for the first's build (POSIX).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import onnx

from edgepop.errors import UserError

_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The model cache directory (created on first use)."""
    root = os.environ.get("EDGEPOP_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "edgepop" / "models"
    where = f"$EDGEPOP_CACHE={root}" if root else f"the model cache {path}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's own message is a bare "[Errno 17] File exists"
        raise UserError(f"{where} is a file; the model cache needs a folder (set $EDGEPOP_CACHE to one)") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot create the model cache folder there ({exc.strerror})") from None
    return path


def spec_key(spec: dict) -> str:
    """A short stable hash of a JSON-able spec."""
    blob = json.dumps(spec, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cached_model(name: str, spec: dict, build: Callable[[], onnx.ModelProto]) -> Path:
    """Path of the ONNX file for ``spec``, building and saving it with ``build()`` if it is not cached.

    One build per file: threads of a process take turns, and processes sharing the cache too (a lock file beside
    the model, where the platform has ``fcntl``): the second waits for the first's file instead of building the
    same model again (GPT-2 small: 10-15 s of CPU on a 2-core machine)."""
    path = cache_dir() / f"{name}-{spec_key(spec)}.onnx"
    if path.exists():  # (a finished file is never rewritten: no lock needed to read it, even in a read-only cache)
        return path
    with _LOCK, _file_lock(path.with_suffix(".lock")):
        if not path.exists():
            model = build()
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            onnx.save_model(model, str(tmp))
            os.replace(tmp, path)
            path.with_suffix(".json").write_text(json.dumps(spec, indent=1, sort_keys=True, default=str))
    return path


@contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock on ``path`` (created if missing) held inside the block; none where there is no
    ``fcntl`` (the atomic rename above keeps concurrent builds safe there, only duplicated)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        f = open(path, "a")  # noqa: SIM115 (closed below)
    except OSError:  # a cache folder this process may read but not write: the build's own save will say so
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
