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
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from edgepop.errors import UserError, raise_if_terminated

MARKER = ".edgepop-output"  # in a folder a command writes inside --out: the command and the files it wrote there
# In --out itself: which command wrote which of the files there, so that another command (``topology`` after
# ``simulate``: both write summary.json) refuses to replace them instead of leaving a folder of mixed runs.
RUNS = ".edgepop-runs"


def folder_arg(text: str) -> Path:
    """The argparse type of an output folder flag: a path, not empty (``Path("")`` is the current folder, where
    outputs would land among whatever is there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name a folder")
    return Path(text)


def output_folder(path: str | os.PathLike, flag: str = "--out", staged: bool = False,
                  writes: Iterable[str] = (), command: str | None = None) -> Path:
    """``path`` as a Path, once a folder there is known to be writable.

    ``staged``: the output is assembled in a temporary folder beside ``path`` (in the parent of the folder it names,
    links followed) and moved into place at the end, all or nothing (:func:`staged_output`): then that parent must
    take a folder too.
    ``writes``: the names the command will write into it (a folder as ``name/marker``, see :func:`move_into_place`);
    one that is there already as the wrong kind (a folder where a file goes, a file or a folder of the user's where
    a folder goes) is refused now, not after the work.
    ``command``: the command writing (as :func:`staged_output` records it); files of these names that another
    command wrote there (see :data:`RUNS`) are refused now too.
    """
    if not str(path).strip():  # Path("") is the current folder: outputs would land among whatever is there
        raise UserError(f"{flag}: empty; name a folder (e.g. {flag} out)")
    p = _expanded(path, flag)
    if p.is_symlink() and not p.exists():  # (a dangling link: the run would write through it, or fail to)
        raise UserError(f"{flag} {path}: is a link to {os.readlink(p)}, which does not exist (create it, or name "
                        f"another {flag})")
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    parent = _stage_in(p)  # where staged_output stages: on the file system of the folder it names
    _check(p, path, flag, (parent, p) if staged and p.is_dir() else (parent,) if staged else (p,))
    if p.is_dir():
        kinds = _kinds(writes)
        for name, marker in sorted(kinds.items()):
            if why := _in_the_way(p / name, marker, folder=marker is not None):
                raise UserError(f"{flag} {path}: {p / name} {why}, where the command writes a "
                                f"{'file' if marker is None else 'folder'} (move it away or choose another {flag})")
        if command is not None:
            for other, names in sorted(_runs(p).items()):
                taken = sorted(n for n in names if n in kinds and _exists(p / n))
                if other != command and taken:
                    raise UserError(f"{flag} {path}: holds the output of `edgepop {other}`, whose "
                                    f"{', '.join(taken)} `edgepop {command}` would replace (choose another {flag}, "
                                    "or move them away)")
    return p


def _runs(folder: Path) -> dict[str, list[str]]:
    """``folder``'s :data:`RUNS` record: command -> the names it wrote there ({} when there is none, or not one
    :func:`_record_run` wrote)."""
    try:
        doc = json.loads((folder / RUNS).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items()
            if isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)}


def _record_run(tmp: Path, out: Path, command: str) -> None:
    """Write into ``tmp`` (moved into ``out`` next) the record of ``out``'s runs with this one's names: the other
    commands keep those of their names still in ``out`` and not written again now."""
    produced = sorted(q.name for q in tmp.iterdir() if q.name != RUNS)
    runs = _runs(out) if out.is_dir() else {}
    runs = {other: kept for other, names in runs.items() if other != command
            and (kept := sorted(n for n in names if n not in produced and _exists(out / n)))}
    runs[command] = produced
    (tmp / RUNS).write_text(json.dumps(dict(sorted(runs.items())), indent=2) + "\n")


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
            _probe(folder)
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


def move_into_place(tmp: Path, out: Path, owned: Iterable[str] = frozenset(), command: str | None = None) -> None:
    """Move a finished output folder ``tmp`` to ``out``: created whole when it does not exist, else the files in it
    replace theirs, and those of ``owned`` (the names the command writes) that this run did not produce are
    removed, so no file of an earlier run is left beside the new ones as if it were theirs. Other files in ``out``
    are the user's and stay.

    A folder the command writes is named in ``owned`` as ``name/marker``: a folder ``out/name`` holding the file
    ``marker`` is an earlier run's, replaced by this run's (or removed when this run wrote none); without it, it is
    the user's and stays. A produced file never replaces a folder, nor a produced folder a file or a folder of the
    user's: every such conflict is found before anything moves, and then nothing moves; the results are kept beside
    ``out`` as ``<out>.edgepop-results-<n>`` and :class:`OutputConflict` names both. An earlier run's folder
    holding a file its marker does not list (one the user added) is such a conflict too; one this run does not
    write again loses only the files its marker lists (:func:`mark_folder`).

    ``command``: the command that produced them, recorded in ``out`` (:data:`RUNS`) with the names it wrote.

    A SIGTERM that arrived during the work (see :func:`edgepop.errors.on_sigterm`) ends it here instead: nothing is
    moved."""
    import shutil

    raise_if_terminated()
    out = _real(out)  # (``.`` has no name to keep the results beside; a link's target is where they go)
    if command is not None:
        _record_run(tmp, out, command)
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
        if target.is_dir() and not target.is_symlink():  # an earlier run's folder, nothing else in it (checked above)
            shutil.rmtree(target)
        p.replace(target)
    tmp.rmdir()
    for name in set(_kinds(owned)) - {p.name for p in produced}:
        stale = out / name
        if name in folders:
            if stale.is_dir() and not stale.is_symlink():
                _remove_earlier_runs(stale, folders[name])
        elif stale.is_file() or stale.is_symlink():
            stale.unlink()


def _kinds(names: Iterable[str]) -> dict[str, str | None]:
    """Each owned name -> its folder's marker file (None for a file)."""
    return dict((n.split("/", 1)[0], n.split("/", 1)[1]) if "/" in n else (n, None) for n in names)


def _exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def _real(p: Path) -> Path:
    """``p`` absolute, links followed (``.`` gets a name and a parent; a link's target its own file system)."""
    return Path(os.path.realpath(p))


def mark_folder(folder: Path, command: str) -> None:
    """Mark ``folder`` as the output of ``command``: the file :data:`MARKER` in it names the command and every file
    in the folder now. A later run replaces or removes such a folder (see :func:`move_into_place`), but never one
    without it, and never a file the listing does not name (one the user added)."""
    files = sorted(q.relative_to(folder).as_posix() for q in folder.rglob("*") if not q.is_dir())
    (folder / MARKER).write_text(json.dumps({"command": command, "files": files}, indent=2) + "\n")


def _listed(folder: Path, marker: str) -> set[str] | None:
    """The files the marker ``folder/marker`` lists (None when it is absent or not one :func:`mark_folder` wrote)."""
    try:
        files = json.loads((folder / marker).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return set(files) if isinstance(files, list) and all(isinstance(f, str) for f in files) else None


def _not_an_earlier_runs(target: Path, marker: str | None) -> str | None:
    """Why the folder ``target`` is not an earlier run's whole (None when it is: marked, nothing else in it)."""
    listed = _listed(target, marker) if marker else None
    if listed is None:
        return "is a folder that is not an earlier run's" + (f" (no {marker})" if marker else "")
    for q in sorted(target.rglob("*")):
        name = q.relative_to(target).as_posix()
        if name != marker and name not in listed and not (q.is_dir() and not q.is_symlink()):
            return f"holds {q}, which no earlier run wrote"
    return None


def _remove_earlier_runs(folder: Path, marker: str) -> None:
    """Remove an earlier run's ``folder``: the files its marker lists, and the folder once empty; the user's files
    in it (any the marker does not name) stay, and so does the folder that holds them."""
    import shutil

    listed = _listed(folder, marker)
    if listed is None:
        return
    if _not_an_earlier_runs(folder, marker) is None:
        shutil.rmtree(folder)
        return
    for name in sorted(listed | {marker}):
        q = folder / name
        if q.is_file() or q.is_symlink():
            q.unlink()
    for q in sorted((q for q in folder.rglob("*") if q.is_dir() and not q.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            q.rmdir()  # (an emptied sub-folder)


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
    return _not_an_earlier_runs(target, marker)


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


def staging_folder(out: Path, prefix: str = ".edgepop-") -> Path:
    """A new private temporary folder beside the folder ``out`` names (links followed: on its file system, so
    moving from it into ``out`` is a rename), its parent folders created first."""
    parent = _stage_in(out)
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _stage_in(out: Path) -> Path:
    """The folder to stage ``out``'s files in: its parent (links followed), or ``out`` itself when that is an
    existing folder whose parent cannot take one (``--out .`` in a home folder under a root-owned ``/home``); the
    files then move out of a hidden folder inside it."""
    real = _real(out)
    if real.is_dir() and real.parent.is_dir() and not _can_stage_in(real.parent):
        return real
    return real.parent


def _can_stage_in(folder: Path) -> bool:
    """Whether a temporary folder can be made (and removed) in the existing ``folder``."""
    try:
        _probe(folder)
    except OSError:
        return False
    return True


def _probe(folder: Path) -> None:
    """Make and remove a temporary folder in ``folder`` (OSError where that cannot be done: permissions, a
    read-only or pseudo file system)."""
    os.rmdir(tempfile.mkdtemp(prefix=".edgepop-probe-", dir=folder))


@contextlib.contextmanager
def staged_output(out: Path, owned: Iterable[str], prefix: str = ".edgepop-", command: str | None = None):
    """A temporary folder beside ``out`` for a command's files (:func:`staging_folder`): moved into place when the
    block ends normally (:func:`move_into_place`), removed when it raises, so ``out`` gets every file of the run or
    none. Results that could not be moved (:class:`OutputConflict`, or an OSError while moving) are kept where the
    error says, never removed. ``command``: recorded with the names it wrote (:func:`move_into_place`)."""
    import shutil

    tmp = staging_folder(out, prefix)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        move_into_place(tmp, out, owned, command)
    except OutputConflict:  # (``tmp`` is kept under another name)
        raise
    except OSError as exc:  # the work is done: keep what was not moved, and say where
        kept = tmp
        with contextlib.suppress(OSError):
            kept = _keep(tmp, _real(out))
        raise OutputConflict(f"{out}: could not move the results into place ({exc}); the results not moved are "
                             f"in {kept}", kept) from None
    except BaseException:  # (SIGTERM: nothing moved)
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
