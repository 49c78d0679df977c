"""On-disk cache of models built from code, keyed by a hash of their spec.

The cache lives in ``$EDGEPOP_CACHE`` or ``~/.cache/edgepop/models``. A changed spec (or builder version)
gives a new key, so stale files are never reused; files are written atomically so that two processes
building the same model at once do not read half-written files.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
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
    """Path of the ONNX file for ``spec``, building and saving it with ``build()`` if it is not cached."""
    path = cache_dir() / f"{name}-{spec_key(spec)}.onnx"
    with _LOCK:
        if not path.exists():
            model = build()
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            onnx.save_model(model, str(tmp))
            os.replace(tmp, path)
            path.with_suffix(".json").write_text(json.dumps(spec, indent=1, sort_keys=True, default=str))
    return path
