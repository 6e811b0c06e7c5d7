"""Read-only looks into the plan store's SQLite file, from planner processes and threads.

The service's ``PlanStore`` writes; these only read, each thread (or process) through its own
connection, so that a look never waits on the store's lock or holds the event loop.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

_local = threading.local()  # connections, one per thread and file


def _connection(db_path: str) -> sqlite3.Connection | None:
    if db_path == ":memory:":  # private to the service's own connection
        return None
    connections = _local.__dict__.setdefault("connections", {})
    db = connections.get(db_path)
    if db is None:
        try:
            db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
        except sqlite3.Error:
            return None
        connections[db_path] = db
    return db


def lookup(db_path: str, query: str, *params: Any) -> tuple | None:
    """The first row ``query`` gives, or None (also where the store cannot be read)."""
    rows = lookup_all(db_path, query, *params)
    return rows[0] if rows else None


def lookup_all(db_path: str, query: str, *params: Any) -> list[tuple] | None:
    """The rows ``query`` gives, or None where the store cannot be read."""
    db = _connection(db_path)
    if db is None:
        return None
    try:
        return db.execute(query, params).fetchall()
    except sqlite3.Error:
        return None
