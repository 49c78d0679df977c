"""Output paths, checked before the work starts.

A simulation, a sweep or a cross-validation can run for minutes; it must not end in a traceback, its results lost,
because ``--out`` names a file, a folder that cannot be created, or a place the user cannot write. The commands
call these first: they create what the output will need and write a probe there, so that permissions, read-only
file systems and pseudo file systems fail the same way, at once, with a one-line error naming the path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgepop.errors import UserError


def output_folder(path: str | os.PathLike, flag: str = "--out", staged: bool = False) -> Path:
    """``path`` as a Path, once a folder there is known to be writable (created if missing).

    ``staged``: the output is assembled in a temporary folder beside ``path`` (in its parent) and moved into
    place at the end, all or nothing (``sim.run.write_outputs``, sweeps): then the parent must take a folder too,
    and ``path`` itself is not created before the results are ready.
    """
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    _existing_folder(p, path, flag)
    try:
        if staged:
            _probe(p.parent)
            if p.is_dir():
                _probe(p)
        else:
            p.mkdir(parents=True, exist_ok=True)
            _probe(p)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return p


def output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a Path, once a file can be written there (its folder created if missing)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a folder, expected a file name")
    _existing_folder(p.parent, path, flag)
    try:
        _probe(p.parent)
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return p


def _existing_folder(p: Path, path, flag: str) -> None:
    """The nearest existing ancestor of ``p`` must be a folder (a file there cannot hold one)."""
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise UserError(f"{flag} {path}: {q} is a file, not a folder")
            return


def _probe(folder: Path) -> None:
    """Create ``folder`` (and its parents) if missing and make and remove an empty folder in it."""
    folder.mkdir(parents=True, exist_ok=True)
    os.rmdir(tempfile.mkdtemp(prefix=".edgepop-probe-", dir=folder))
