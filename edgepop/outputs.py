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
import itertools
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from edgepop.errors import UserError, raise_if_terminated


def folder_arg(text: str) -> Path:
    """The argparse type of an output folder flag: a path, not empty (``Path("")`` is the current folder, where
    outputs would land among whatever is there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name a folder")
    return Path(text)


def output_folder(path: str | os.PathLike, flag: str = "--out", staged: bool = False,
                  writes: Iterable[str] = ()) -> Path:
    """``path`` as a Path, once a folder there is known to be writable.

    ``staged``: the output is assembled in a temporary folder beside ``path`` (in its parent) and moved into
    place at the end, all or nothing (:func:`staged_output`): then the parent must take a folder too.
    ``writes``: the names the command will write into it (a folder as ``name/marker``, see :func:`move_into_place`);
    one that is there already as the wrong kind (a folder where a file goes, a file or a folder of the user's where
    a folder goes) is refused now, not after the work.
    """
    if not str(path).strip():  # Path("") is the current folder: outputs would land among whatever is there
        raise UserError(f"{flag}: empty; name a folder (e.g. {flag} out)")
    p = _expanded(path, flag)
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    _check(p, path, flag, (p.parent, p) if staged and p.is_dir() else (p.parent,) if staged else (p,))
    if p.is_dir():
        for name, marker in sorted(_kinds(writes).items()):
            if why := _in_the_way(p / name, marker, folder=marker is not None):
                raise UserError(f"{flag} {path}: {p / name} {why}, where the command writes a "
                                f"{'file' if marker is None else 'folder'} (move it away or choose another {flag})")
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


class OutputConflict(UserError):
    """Finished results that could not be moved into place (something of the user's is in the way); they were kept
    in ``kept``, which the message names."""

    def __init__(self, message: str, kept: Path):
        super().__init__(message)
        self.kept = kept


def move_into_place(tmp: Path, out: Path, owned: Iterable[str] = frozenset()) -> None:
    """Move a finished output folder ``tmp`` to ``out``: created whole when it does not exist, else the files in it
    replace theirs, and those of ``owned`` (the names the command writes) that this run did not produce are
    removed, so no file of an earlier run is left beside the new ones as if it were theirs. Other files in ``out``
    are the user's and stay.

    A folder the command writes is named in ``owned`` as ``name/marker``: a folder ``out/name`` holding the file
    ``marker`` is an earlier run's, replaced by this run's (or removed when this run wrote none); without it, it is
    the user's and stays. A produced file never replaces a folder, nor a produced folder a file or a folder of the
    user's: every such conflict is found before anything moves, and then nothing moves; the results are kept beside
    ``out`` as ``<out>.edgepop-results-<n>`` and :class:`OutputConflict` names both.

    A SIGTERM that arrived during the work (see :func:`edgepop.errors.on_sigterm`) ends it here instead: nothing is
    moved."""
    import shutil

    raise_if_terminated()
    folders = {name: marker for name, marker in _kinds(owned).items() if marker is not None}
    produced = sorted(tmp.iterdir())
    in_the_way = [(out, "is a file", True)] if _exists(out) and not out.is_dir() else []
    if not in_the_way and out.exists():
        for p in produced:
            folder = p.is_dir() and not p.is_symlink()
            if why := _in_the_way(out / p.name, folders.get(p.name, "") if folder else None, folder):
                in_the_way.append((out / p.name, why, folder))
    if in_the_way:
        kept = _keep(tmp, out)
        paths = "; ".join(f"{q}: {why}, where this run writes a {'folder' if folder else 'file'}"
                          for q, why, folder in in_the_way)
        raise OutputConflict(f"{paths}; nothing was moved into {out}: the results are in {kept}", kept)
    if not out.exists():
        _umask_mode(tmp)  # a temporary folder is private (0700)
        tmp.replace(out)
        return
    for p in produced:
        target = out / p.name
        if target.is_dir() and not target.is_symlink():  # an earlier run's folder (checked above)
            shutil.rmtree(target)
        p.replace(target)
    tmp.rmdir()
    for name in set(_kinds(owned)) - {p.name for p in produced}:
        stale = out / name
        if name in folders:
            if stale.is_dir() and not stale.is_symlink() and (stale / folders[name]).is_file():
                shutil.rmtree(stale)
        elif stale.is_file() or stale.is_symlink():
            stale.unlink()


def _kinds(names: Iterable[str]) -> dict[str, str | None]:
    """Each owned name -> its folder's marker file (None for a file)."""
    return dict((n.split("/", 1)[0], n.split("/", 1)[1]) if "/" in n else (n, None) for n in names)


def _exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def _in_the_way(target: Path, marker: str | None, folder: bool) -> str | None:
    """Why ``target`` cannot take a produced file (``folder`` false) or folder (an earlier run's holds ``marker``;
    ``""`` or None: no folder of that name is); None when it can."""
    real_dir = target.is_dir() and not target.is_symlink()
    if not folder:
        return "is a folder" if real_dir else None
    if not _exists(target):
        return None
    if not real_dir:
        return "is a file"
    if not marker or not (target / marker).is_file():
        return "is a folder that is not an earlier run's" + (f" (no {marker})" if marker else "")
    return None


def _umask_mode(folder: Path) -> None:
    """Give ``folder`` the mode a folder made by mkdir would have."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)


def _keep(tmp: Path, out: Path) -> Path:
    """Rename the finished results ``tmp`` to the first free ``<out>.edgepop-results-<n>`` beside ``out``."""
    for n in itertools.count(1):
        kept = out.with_name(f"{out.name}.edgepop-results-{n}")
        if not _exists(kept):
            _umask_mode(tmp)
            tmp.rename(kept)
            return kept
    raise AssertionError("unreachable")


@contextlib.contextmanager
def staged_output(out: Path, owned: Iterable[str], prefix: str = ".edgepop-"):
    """A temporary folder beside ``out`` for a command's files: moved into place when the block ends normally
    (:func:`move_into_place`), removed when it raises, so ``out`` gets every file of the run or none. Results that
    could not be moved (:class:`OutputConflict`) are kept where the error says, never removed."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        yield tmp
        move_into_place(tmp, out, owned)
    except BaseException:  # (after a conflict ``tmp`` is kept under another name: nothing is removed here)
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
