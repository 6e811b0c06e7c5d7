"""The plan cache: an SQLite file, so a restarted service serves the plans it made before.

Plans are keyed by their plan id (fusion id, input metadata, options and device profile), and
also by a hash of the request that produced them, so a repeated request is answered without
parsing its definition. Writes are transactions (WAL mode): nothing stored is lost to a crash or
a concurrent writer, and several service processes may share one file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    plan_id TEXT PRIMARY KEY,
    fusion_id TEXT NOT NULL,
    segmenter TEXT NOT NULL,
    created REAL NOT NULL,
    request TEXT NOT NULL,   -- definition (wire JSON), input metadata, options
    plan TEXT NOT NULL       -- the plan's JSON
);
CREATE TABLE IF NOT EXISTS requests (
    request_key TEXT PRIMARY KEY,
    plan_id TEXT NOT NULL REFERENCES plans(plan_id)
);
CREATE INDEX IF NOT EXISTS plans_created ON plans(created);
"""


@dataclass(frozen=True)
class StoredPlan:
    plan_id: str
    segmenter: str
    body: bytes  # the plan's JSON, ready to send


class PlanStore:
    def __init__(self, path: str, memory_items: int = 1024):
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._db.commit()
        self._memory: OrderedDict[str, StoredPlan] = OrderedDict()  # by plan id
        self._requests: OrderedDict[str, str] = OrderedDict()  # request key -> plan id
        self._memory_items = memory_items

    def _remember(self, memory: OrderedDict, key: str, value) -> None:
        """Keep the most recently used items in memory (callers hold the lock)."""
        memory[key] = value
        memory.move_to_end(key)
        while len(memory) > self._memory_items:
            memory.popitem(last=False)

    def get(self, plan_id: str) -> StoredPlan | None:
        with self._lock:
            hit = self._memory.get(plan_id)
            if hit is not None:
                return hit
            row = self._db.execute("SELECT segmenter, plan FROM plans WHERE plan_id = ?",
                                   (plan_id,)).fetchone()
            if row is None:
                return None
            stored = StoredPlan(plan_id, row[0], row[1].encode())
            self._remember(self._memory, plan_id, stored)
            return stored

    def by_request(self, request_key: str) -> StoredPlan | None:
        with self._lock:
            plan_id = self._requests.get(request_key)
            if plan_id is None:
                row = self._db.execute("SELECT plan_id FROM requests WHERE request_key = ?",
                                       (request_key,)).fetchone()
                if row is None:
                    return None
                plan_id = row[0]
                self._remember(self._requests, request_key, plan_id)
        return self.get(plan_id)

    def request(self, plan_id: str) -> dict[str, Any] | None:
        """What produced a plan: its definition, input metadata and options."""
        with self._lock:
            row = self._db.execute("SELECT request FROM plans WHERE plan_id = ?",
                                   (plan_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, plan: dict[str, Any], request: dict[str, Any],
            request_key: str | None = None) -> StoredPlan:
        return self.put_bytes(plan["plan_id"], plan["fusion_id"], plan["segmenter"],
                              json.dumps(plan, separators=(",", ":"), allow_nan=False).encode(),
                              json.dumps(request, separators=(",", ":"), allow_nan=False),
                              request_key)

    def put_bytes(self, plan_id: str, fusion_id: str, segmenter: str, body: bytes,
                  request: str, request_key: str | None = None) -> StoredPlan:
        """Store a plan already serialized (strict JSON) with the request (JSON) that made it."""
        stored = StoredPlan(plan_id, segmenter, body)
        with self._lock:
            with self._db:  # one transaction
                self._db.execute(
                    "INSERT OR IGNORE INTO plans(plan_id, fusion_id, segmenter, created, request, "
                    "plan) VALUES (?, ?, ?, ?, ?, ?)",
                    (plan_id, fusion_id, segmenter, time.time(), request, body.decode()))
            self._remember(self._memory, plan_id, stored)
        if request_key:
            self.link(request_key, plan_id)
        return stored

    def link(self, request_key: str, plan_id: str) -> None:
        """Answer later requests with this key by the plan stored under ``plan_id``."""
        with self._lock:
            with self._db:
                self._db.execute("INSERT OR REPLACE INTO requests(request_key, plan_id) "
                                 "VALUES (?, ?)", (request_key, plan_id))
            self._remember(self._requests, request_key, plan_id)

    def recent(self, n: int) -> list[tuple[dict[str, Any], str | None]]:
        """The ``n`` newest plans, each with the name of the definition function that made it
        (None for a wire-JSON definition)."""
        with self._lock:
            rows = self._db.execute("SELECT plan, json_extract(request, '$.name') FROM plans "
                                    "ORDER BY created DESC LIMIT ?", (n,)).fetchall()
        return [(json.loads(plan), name) for plan, name in rows]

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
