"""Durable async batch jobs in SQLite (stdlib ``sqlite3``, WAL journal, ``synchronous=FULL``).

A job is one ``POST ...?queueRequest=true`` with ``{"requests": [...]}``; each request is an *item*. Item states:
``queued`` -> ``running`` -> ``done``. Durability rules:

* a job and all its items are written in one transaction before its ``request_id`` is returned;
* an item is marked ``running`` (attempts + 1) before it is run, and ``done`` together with its result in one
  transaction, guarded by ``status = 'running'``, so an item completes at most once (``completions`` <= 1);
* on start, items left ``running`` by a killed process were never completed: they go back to ``queued`` and run
  again. So after a SIGKILL and restart every item completes exactly once: none lost, none completed twice;
* that recovery is only right when no other process serves the file: a store holds an exclusive ``flock`` on the
  database file itself (released when the store closes or its process dies), so a second store on the same file,
  by whatever name (a symlink, a hard link), is refused instead of re-queueing the first one's running items.

Every method is synchronous and must be called from one thread (the gateway uses a one-thread executor).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

from edgepop.errors import UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, account TEXT NOT NULL, model TEXT NOT NULL, created REAL NOT NULL,
    lat REAL NOT NULL, lon REAL NOT NULL, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    job TEXT NOT NULL, idx INTEGER NOT NULL, input TEXT NOT NULL, external_reference TEXT,
    status TEXT NOT NULL DEFAULT 'queued', result TEXT, success INTEGER, attempts INTEGER NOT NULL DEFAULT 0,
    completions INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (job, idx));
CREATE INDEX IF NOT EXISTS items_status ON items (status, not_before);
"""


class BatchStore:
    """Jobs and items in a SQLite file (``":memory:"`` for a throwaway store)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._lock: int | None = None
        created = False
        if self.path != ":memory:":
            if Path(self.path).is_dir():
                raise UserError(f"batch db {self.path}: is a folder, not a database file")
            file_above = next((q for q in Path(self.path).parents if q.exists() and not q.is_dir()), None)
            if file_above is not None:
                raise UserError(f"batch db {self.path}: {file_above} is a file, not a folder")
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"batch db {self.path}: cannot create its folder ({exc.strerror})") from None
            # The lock is on the file itself, not on a name: a symlink or a hard link to a served file is the served
            # file (a hard link keeps a WAL of its own name, and two writers through two WALs corrupt the store).
            created = not Path(self.path).exists()
            self._lock = _exclusive_lock(self.path)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            _check_tables(self.db)  # before anything is written: another application's file is left as it was
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
        except (sqlite3.DatabaseError, UserError) as exc:
            with contextlib.suppress(AttributeError, sqlite3.Error):
                self.db.close()  # before the lock's descriptor: closing it would drop SQLite's POSIX locks too
            self._unlock()
            if self.path != ":memory:" and created:  # (a refused start leaves no file it made)
                Path(self.path).unlink(missing_ok=True)
            if isinstance(exc, UserError):
                raise UserError(f"batch db {self.path}: {exc}") from None
            raise UserError(f"batch db {self.path}: not a usable SQLite database ({exc})") from None
        self.recovered = self.recover()

    def _rollback(self) -> None:
        """Undo an open transaction; a failed COMMIT may have ended it already (its error is the one to raise)."""
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # (closing the descriptor releases its flock)
            self._lock = None

    def recover(self) -> int:
        """Put items a dead process left ``running`` back in the queue; returns how many."""
        with self.db:
            cur = self.db.execute("UPDATE items SET status = 'queued', not_before = 0 WHERE status = 'running'")
        return cur.rowcount

    def create(self, account: str, model: str, requests: list[dict], lat: float, lon: float) -> str:
        """Store a job and its items atomically; returns its request id."""
        job = str(uuid.uuid4())
        rows = []
        for i, r in enumerate(requests):
            inputs = {k: v for k, v in r.items() if k != "external_reference"}
            rows.append((job, i, json.dumps(inputs), r.get("external_reference")))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (job, account, model, time.time(), lat, lon, len(rows)))
            self.db.executemany("INSERT INTO items (job, idx, input, external_reference) VALUES (?, ?, ?, ?)", rows)
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return job

    def claim(self, limit: int, now: float | None = None, models: list[str] | None = None) -> list[dict]:
        """Mark up to ``limit`` queued items (oldest job first) ``running`` and return them with their job; with
        ``models``, only items of those models (the others wait for a server that serves theirs)."""
        now = time.time() if now is None else now
        only, args = ("", ()) if models is None else (f" AND j.model IN ({', '.join('?' * len(models))})", models)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows = self.db.execute(
                "SELECT i.job, i.idx, i.input, j.account, j.model, j.lat, j.lon FROM items i JOIN jobs j "
                f"ON i.job = j.id WHERE i.status = 'queued' AND i.not_before <= ?{only} "
                "ORDER BY j.created, i.job, i.idx LIMIT ?", (now, *args, limit)).fetchall()
            self.db.executemany("UPDATE items SET status = 'running', attempts = attempts + 1 "
                                "WHERE job = ? AND idx = ?", [(r[0], r[1]) for r in rows])
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return [{"job": r[0], "idx": r[1], "input": json.loads(r[2]), "account": r[3], "model": r[4],
                 "lat": r[5], "lon": r[6]} for r in rows]

    def complete(self, job: str, idx: int, result, success: bool) -> bool:
        """Record an item's outcome; False if it was not running (it cannot complete twice)."""
        with self.db:
            cur = self.db.execute("UPDATE items SET status = 'done', result = ?, success = ?, "
                                  "completions = completions + 1 WHERE job = ? AND idx = ? AND status = 'running'",
                                  (json.dumps(result), int(success), job, idx))
        return cur.rowcount == 1

    def requeue(self, job: str, idx: int, delay_s: float) -> None:
        """Give a running item back (e.g. out of capacity), to be retried after ``delay_s``."""
        with self.db:
            self.db.execute("UPDATE items SET status = 'queued', not_before = ? WHERE job = ? AND idx = ? "
                            "AND status = 'running'", (time.time() + delay_s, job, idx))

    def job(self, account: str, job: str) -> dict | None:
        """A job of ``account`` with its items (None if there is no such job for that account)."""
        row = self.db.execute("SELECT model, n, created FROM jobs WHERE id = ? AND account = ?",
                              (job, account)).fetchone()
        if row is None:
            return None
        items = self.db.execute("SELECT idx, status, result, success, external_reference, attempts, completions "
                                "FROM items WHERE job = ? ORDER BY idx", (job,)).fetchall()
        return {"request_id": job, "model": row[0], "n": row[1], "created": row[2],
                "items": [{"id": i[0], "status": i[1], "result": json.loads(i[2]) if i[2] is not None else None,
                           "success": bool(i[3]) if i[3] is not None else None, "external_reference": i[4],
                           "attempts": i[5], "completions": i[6]} for i in items]}

    def progress(self, account: str, job: str) -> tuple[str, int, int, int] | None:
        """``(model, items, done, running)`` of ``account``'s job, counted without reading a result; None if there is
        no such job for that account."""
        row = self.db.execute("SELECT model FROM jobs WHERE id = ? AND account = ?", (job, account)).fetchone()
        if row is None:
            return None
        total, done, running = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(status = 'done'), 0), COALESCE(SUM(status = 'running'), 0) FROM items "
            "WHERE job = ?", (job,)).fetchone()
        return row[0], total, done, running

    def results(self, job: str) -> list[tuple]:
        """Each item's ``(idx, result as stored JSON text, success, external_reference)``, in order, undecoded."""
        return self.db.execute("SELECT idx, result, success, external_reference FROM items WHERE job = ? ORDER BY idx",
                               (job,)).fetchall()

    def model_of(self, account: str, job: str) -> str | None:
        """The model of ``account``'s job ``job`` (None if there is no such job for that account)."""
        row = self.db.execute("SELECT model FROM jobs WHERE id = ? AND account = ?", (job, account)).fetchone()
        return row[0] if row else None

    def waiting(self, models: list[str]) -> dict[str, list[str]]:
        """Jobs (oldest first) with queued items of a model not in ``models``, by model."""
        rows = self.db.execute(
            f"SELECT DISTINCT j.model, j.id, j.created FROM items i JOIN jobs j ON i.job = j.id WHERE i.status = "
            f"'queued' AND j.model NOT IN ({', '.join('?' * len(models))}) ORDER BY j.created", models).fetchall()
        out: dict[str, list[str]] = {}
        for model, job, _ in rows:
            out.setdefault(model, []).append(job)
        return out

    def counts(self) -> dict[str, int]:
        """Items per status."""
        rows = self.db.execute("SELECT status, COUNT(*) FROM items GROUP BY status").fetchall()
        return {"queued": 0, "running": 0, "done": 0, **{s: n for s, n in rows}}

    def next_due(self) -> float | None:
        """Earliest ``not_before`` of a queued item (wall-clock seconds), or None if none is queued."""
        row = self.db.execute("SELECT MIN(not_before) FROM items WHERE status = 'queued'").fetchone()
        return row[0]

    def close(self) -> None:
        self.db.close()
        self._unlock()


_COLUMNS = {"jobs": ["id", "account", "model", "created", "lat", "lon", "n"],
            "items": ["job", "idx", "input", "external_reference", "status", "result", "success", "attempts",
                      "completions", "not_before"]}


def _check_tables(db: sqlite3.Connection) -> None:
    """A one-line error for a file holding tables that are not this store's (another application's database)."""
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
             if not r[0].startswith("sqlite_")]  # (SQLite's own: ANALYZE's statistics, ...)
    other = sorted(set(names) - set(_COLUMNS))
    if other:
        raise UserError(f"holds tables that are not edgepop's batch tables ({', '.join(other[:5])}); give --db a "
                        "file of its own")
    for name in names:
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({name})").fetchall()]
        if cols != _COLUMNS[name]:
            raise UserError(f"its table {name!r} has columns {cols}, not edgepop's batch table's; give --db a file of "
                            "its own")


def _exclusive_lock(path: str) -> int | None:
    """An exclusive, non-blocking ``flock`` on the database file ``path`` (made empty if missing, which SQLite takes
    as a new database), as its descriptor, or a one-line error when another process holds it. None where ``fcntl``
    does not exist (Windows): no lock there. On Linux ``flock`` and SQLite's own ``fcntl`` byte-range locks do not
    interact, so holding this beside SQLite's connection is safe as long as it is closed after the connection."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # (read-only is enough to flock, and works on any file)
    except OSError as exc:
        raise UserError(f"batch db {path}: cannot open it ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UserError(f"batch db {path} is in use by another edgepop serve (or store); give this one its "
                        "own --db") from None
    return fd
