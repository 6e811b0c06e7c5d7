"""The plan cache in an SQLite file (the embedded default): WAL mode, so several service
processes may share it and nothing committed is lost to a crash.

Writes go through one connection, reads through another (one statement at a time on each), so
that a read never waits behind a write. A write waits at most ``timeout_s`` for the file's write
lock (another process in a transaction, a backup), not SQLite's usual 30 s: then it fails, and the
store serves without the cache until the lock is free again (issue 45).

A file SQLite reports as corrupt (a bad header, a damaged page) is renamed aside
(``PATH.corrupt-TIME``) and a fresh cache is started in its place: a cache holds nothing that
cannot be planned again, and a damaged file only gets worse.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fusecut.service.cache.sql import LINK_BYTES, ROW_BYTES, SCHEMA, SqlCache, digest

log = logging.getLogger("fusecut.cache")
CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
SCHEMA_VERSION = 2  # 1: plans and requests without sizes, last use or digests


def is_corrupt(error: BaseException) -> bool:
    return isinstance(error, sqlite3.DatabaseError) and \
        str(getattr(error, "sqlite_errorname", "")).startswith(CORRUPT)


class SqliteCache(SqlCache):
    def __init__(self, path: str, read_only: bool = False, timeout_s: float = 1.0):
        self.path = path
        self.read_only = read_only
        self.timeout_s = timeout_s  # the longest a statement waits for a lock
        self.quarantined: list[str] = []  # where corrupt files were moved, oldest first
        self._lock = threading.Lock()  # one statement at a time on the writing connection
        self._read_lock = threading.Lock()  # and on the reading one
        self._db = self._open()
        self._reader = self._open_reader()

    def _open(self) -> sqlite3.Connection:
        if self.read_only:  # a planner process's look into the service's file
            return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                   timeout=self.timeout_s, check_same_thread=False,
                                   isolation_level=None)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        opened = _inode(self.path)
        try:
            return self._prepare()
        except sqlite3.DatabaseError as e:
            if not is_corrupt(e):
                raise
            self._quarantine(e, opened)
            return self._prepare()

    def _prepare(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=self.timeout_s, check_same_thread=False,
                             isolation_level=None)  # transactions are explicit
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            old = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'plans'").fetchone()
            if old and version < SCHEMA_VERSION:
                _migrate_v1(db)
            for statement in SCHEMA:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        self._inode = _inode(self.path)
        return db

    def _open_reader(self) -> sqlite3.Connection | None:
        """The connection reads go through (None: the writing one, for a read-only cache or an
        in-memory one, which another connection would not see)."""
        if self.read_only or self.path == ":memory:":
            return None
        return sqlite3.connect(self.path, timeout=self.timeout_s, check_same_thread=False,
                               isolation_level=None)

    def _quarantine(self, error: BaseException, corrupt_inode: int | None) -> None:
        """Move the corrupt file (and its WAL) aside, unless another process sharing it did
        already (the file at the path is then another: a fresh one, kept)."""
        moved = f"{self.path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        if corrupt_inode is not None and corrupt_inode == _inode(self.path):
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.replace(self.path + suffix, moved + suffix)
                except FileNotFoundError:
                    pass
            self.quarantined.append(moved)
            log.error("plan cache %s is corrupt (%s): moved it to %s and started a fresh one",
                      self.path, error, moved)

    def recover(self, error: BaseException) -> bool:
        """After ``error`` from a statement: if it says the file is corrupt, quarantine it and
        start a fresh cache (True)."""
        if self.read_only or not is_corrupt(error):
            return False
        with self._lock, self._read_lock:
            self._db.close()
            if self._reader is not None:
                self._reader.close()
            self._quarantine(error, self._inode)
            self._db = self._prepare()
            self._reader = self._open_reader()
        return True

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Cursor]:
        if self._reader is None:
            with self.writer() as cur:
                yield cur
            return
        with self._read_lock:
            cur = self._reader.cursor()
            try:
                yield cur
            finally:
                cur.close()

    @contextmanager
    def writer(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._db.cursor()
            try:
                yield cur
            finally:
                cur.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")  # the write lock now, not on the first write
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            if self._reader is not None:
                self._reader.close()


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Give a cache written before sizes, last use and digests those columns (in the caller's
    transaction): its plans are kept, used as of their creation."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(plans)")}
    for name, kind in (("used", "DOUBLE PRECISION NOT NULL DEFAULT 0"),
                       ("bytes", "BIGINT NOT NULL DEFAULT 0"),
                       ("digest", "TEXT NOT NULL DEFAULT ''")):
        if name not in columns:
            db.execute(f"ALTER TABLE plans ADD COLUMN {name} {kind}")
    rows = db.execute("SELECT plan_id, plan, request FROM plans").fetchall()
    db.executemany("UPDATE plans SET used = created, bytes = ?, digest = ? WHERE plan_id = ?",
                   [(len(plan.encode()) + len(request.encode()) + ROW_BYTES,
                     digest(plan, request), plan_id) for plan_id, plan, request in rows])
    links = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM plans").fetchone()[0]
    db.execute("CREATE TABLE IF NOT EXISTS plan_cache_usage (id INTEGER PRIMARY KEY, "
               "bytes BIGINT NOT NULL)")
    db.execute("INSERT OR REPLACE INTO plan_cache_usage(id, bytes) VALUES (0, ?)",
               (total + links * LINK_BYTES,))
