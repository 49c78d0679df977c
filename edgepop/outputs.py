"""Output paths, checked before the work starts.

A simulation, a sweep or a cross-validation can run for minutes; it must not end in a traceback, its results lost,
because ``--out`` names a file, a folder that cannot be created, or a place the user cannot write. The commands
call these first: they create the folders the output will need and a probe folder inside, then remove what they
created, so that permissions, read-only file systems and pseudo file systems fail the same way, at once, with a
one-line error naming the path, and a check leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from edgepop.errors import UserError, raise_if_terminated


def folder_arg(text: str) -> Path:
    """The argparse type of an output folder flag: a path, not empty (``Path("")`` is the current folder, where
    outputs would land among whatever is there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name a folder")
    return Path(text)


def output_folder(path: str | os.PathLike, flag: str = "--out", staged: bool = False) -> Path:
    """``path`` as a Path, once a folder there is known to be writable.

    ``staged``: the output is assembled in a temporary folder beside ``path`` (in its parent) and moved into
    place at the end, all or nothing (``sim.outputs.write_outputs``, sweeps): then the parent must take a folder too.
    """
    if not str(path).strip():  # Path("") is the current folder: outputs would land among whatever is there
        raise UserError(f"{flag}: empty; name a folder (e.g. {flag} out)")
    p = _expanded(path, flag)
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    _check(p, path, flag, (p.parent, p) if staged and p.is_dir() else (p.parent,) if staged else (p,))
    return p


def output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a Path, once a file can be written there."""
    p = _expanded(path, flag)
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a folder, expected a file name")
    _check(p.parent, path, flag, (p.parent,))
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{flag} {path}: cannot write there (Permission denied)")
    return p


def _expanded(path, flag: str) -> Path:
    try:
        return Path(path).expanduser()
    except RuntimeError:  # '~nosuchuser/x': Path raises rather than leave it as it is
        raise UserError(f"{flag} {path}: cannot expand '~' (no such user, or no home folder)") from None


def _check(p: Path, path, flag: str, folders: tuple[Path, ...]) -> None:
    """Each of ``folders`` can be created and written in (``p``'s nearest existing ancestor must be a folder)."""
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                raise UserError(f"{flag} {path}: {q} is a file, not a folder")
            break
    for folder in folders:
        created = [q for q in (folder, *folder.parents) if not q.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            os.rmdir(tempfile.mkdtemp(prefix=".edgepop-probe-", dir=folder))
        except OSError as exc:
            raise UserError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
        finally:
            for q in created:  # deepest first
                try:
                    q.rmdir()
                except OSError:
                    break


def move_into_place(tmp: Path, out: Path, owned: frozenset[str] | set[str] = frozenset()) -> None:
    """Move a finished output folder ``tmp`` to ``out``: created whole when it does not exist, else the files in it
    replace theirs, and those of ``owned`` (the names the command writes) that this run did not produce are
    removed, so no file of an earlier run is left beside the new ones as if it were theirs. Other files in ``out``
    are the user's and stay. A SIGTERM that arrived during the work (see :func:`edgepop.errors.on_sigterm`) ends
    it here instead: nothing is moved."""
    import shutil

    raise_if_terminated()

    if not out.exists():
        # A temporary folder is private (0700); the output gets the mode a folder made by mkdir would have.
        mask = os.umask(0)
        os.umask(mask)
        tmp.chmod(0o777 & ~mask)
        tmp.replace(out)
        return
    produced = sorted(tmp.iterdir())
    for p in produced:
        target = out / p.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        p.replace(target)
    tmp.rmdir()
    for name in set(owned) - {p.name for p in produced}:
        stale = out / name
        if stale.is_file() or stale.is_symlink():
            stale.unlink()


@contextlib.contextmanager
def staged_output(out: Path, owned: frozenset[str] | set[str], prefix: str = ".edgepop-"):
    """A temporary folder beside ``out`` for a command's files: moved into place when the block ends normally
    (:func:`move_into_place`), removed when it raises, so ``out`` gets every file of the run or none."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        yield tmp
        move_into_place(tmp, out, owned)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def native_output_to_stderr():
    """Within the block, what native libraries print to the process's standard output (HiGHS's diagnostics)
    goes to standard error: a command printing JSON on stdout keeps it parseable."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
