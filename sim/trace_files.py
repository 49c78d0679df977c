"""Which trace files runs read, as outputs name them: a replay's ``trace`` block of summary.json
(:func:`trace_block`), the file's identity (:func:`trace_source`: path, size, sha256) that the sweep and frontier
manifests record too, and a grid's up-front read of every distinct trace file its variants replay
(:func:`check_variant_traces`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgepop.errors import UserError
from sim.traces import TRACE_FORMATS, TraceFileError


def trace_block(wl, workload, replayed: int) -> dict:
    """Where a replay's arrivals came from, and which limit set their count: ``limited_by`` is ``trace`` (all
    the file holds), ``trace_limit``, ``requests`` or ``duration_s`` (a cut in time)."""
    held = workload.trace_rows if workload.trace_rows is not None else replayed
    caps = {k: v for k, v in (("trace", held), ("trace_limit", wl.trace_limit), ("requests", wl.requests))
            if v is not None}
    asked = min((v for k, v in caps.items() if k != "trace"), default=None)
    # fewer rows than the least count limit: the time cut ended it (a tie goes to the trace's own length)
    by = "duration_s" if replayed < min(caps.values()) else min(caps, key=caps.get)
    return {**trace_source(wl, workload.source), "speed": wl.trace_speed, "requests": replayed, "asked": asked,
            "held": held, "duration_s": wl.duration_s, "limited_by": by,
            # the trace's own first timestamp (absolute times only), beside the day's start_utc the run used
            "first_utc": first.isoformat() if (first := workload.trace_first_utc) is not None else None}


_DIGESTS: dict[str, tuple[tuple[int, int], str]] = {}  # path -> ((size, mtime), sha256): hashed once unchanged


def trace_source(wl, name: str | None = None) -> dict:
    """Which trace file a replay reads: ``file`` (the path as the workload gives it; the shipped one's name when it
    gives none, or ``name``), ``format``, and the file's size in ``bytes`` and ``sha256`` (None if unreadable), so
    that outputs name the very file they replayed. What ``summary.json``'s ``trace`` and the sweep and frontier
    manifests record."""
    shipped = TRACE_FORMATS.entry(wl.kind).extra["shipped"]
    path = Path(wl.trace) if wl.trace else shipped
    size = digest = None
    try:
        st = path.stat()
        size, stamp = st.st_size, (st.st_size, st.st_mtime_ns)
        key = str(path.resolve())
        if key not in _DIGESTS or _DIGESTS[key][0] != stamp:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            _DIGESTS[key] = (stamp, h.hexdigest())
        digest = _DIGESTS[key][1]
    except OSError:
        pass
    return {"file": wl.trace or name or shipped.name, "format": wl.kind, "bytes": size, "sha256": digest}


# Trace files a grid's up-front check has read, by (path, format): the (size, mtime) seen then, and the error the
# reader raised (None: it read). A file changed since is read again; a grid of many variants on one trace reads it
# once.
_CHECKED: dict[tuple[str, str], tuple[tuple[int, int], TraceFileError | None]] = {}


def check_trace_file(path: str | Path, kind: str) -> None:
    """Read the trace file ``path`` as ``kind`` with the run's own reader, raising its :class:`TraceFileError`;
    a file already read unchanged (same size and modification time) is not read again."""
    p = Path(path)
    try:
        st = p.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = None  # (missing or unreadable: the reader says which)
    key = (str(p.resolve()), kind)
    if stamp is not None and key in _CHECKED and _CHECKED[key][0] == stamp:
        error = _CHECKED[key][1]
    else:
        try:
            TRACE_FORMATS.entry(kind).target(p)
            error = None
        except TraceFileError as exc:
            error = exc
        if stamp is not None:
            _CHECKED[key] = (stamp, error)
    if error is not None:
        raise error


def check_variant_traces(source: str, variants) -> None:
    """Every distinct trace file the ``variants`` (of a grid read from ``source``) replay, read once with the run's
    reader before any variant runs, so that a bad file stops a sweep before its first variant rather than at the
    first variant that names it (after the ones before it ran). The error is the run's, with the variant's name."""
    first = {}
    for v in variants:
        wl = v.scenario.workload
        if wl.is_trace and wl.trace is not None:  # (the shipped traces are known good)
            first.setdefault((wl.trace, wl.kind), v)
    for (trace, kind), v in first.items():
        try:
            check_trace_file(trace, kind)
        except TraceFileError as exc:  # as the run would say it, with the first variant it would stop
            raise UserError(f"{source}: variant {v.id} ({v.label}): {v.scenario.source} [workload]: {exc}") from None
