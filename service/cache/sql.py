"""The plan cache's tables and queries, one text for SQLite and PostgreSQL: the two backends
(cache_sqlite, cache_postgres) differ only in how they connect and hold a transaction, so the
semantics (write once, the size bound, least-recently-used eviction) cannot drift apart.

Sizes: every plan row counts its plan and request texts plus ``ROW_BYTES``, every request link
``LINK_BYTES``; a one-row table keeps the total, updated in the transaction that changes it.
Eviction deletes the least recently used plans (and their links) until the total is back under
``LOW_WATER`` of the bound, in the transaction of the write that passed it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

ROW_BYTES = 200  # a plan row's keys, numbers and index entries
LINK_BYTES = 160  # a request link: its key, plan id and index entries
LOW_WATER = 0.9  # eviction frees down to this fraction of the bound, so it runs once per batch
EVICT_BATCH = 256

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS plans (
        plan_id TEXT PRIMARY KEY,
        fusion_id TEXT NOT NULL,
        segmenter TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        used DOUBLE PRECISION NOT NULL,     -- last use, for LRU eviction (batched touches)
        bytes BIGINT NOT NULL,              -- what this row counts against the bound
        digest TEXT NOT NULL,               -- of plan and request: a damaged row is a miss
        request TEXT NOT NULL,              -- definition (wire JSON), input metadata, options
        plan TEXT NOT NULL                  -- the plan's JSON
    )""",
    """CREATE TABLE IF NOT EXISTS requests (
        request_key TEXT PRIMARY KEY,
        plan_id TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS plan_cache_usage (
        id INTEGER PRIMARY KEY,
        bytes BIGINT NOT NULL
    )""",
    "INSERT INTO plan_cache_usage(id, bytes) VALUES (0, 0) ON CONFLICT (id) DO NOTHING",
    "CREATE INDEX IF NOT EXISTS plans_used ON plans(used)",
    "CREATE INDEX IF NOT EXISTS plans_created ON plans(created)",
    "CREATE INDEX IF NOT EXISTS requests_plan ON requests(plan_id)",
]


@dataclass(frozen=True)
class PlanRow:
    """A plan as stored."""

    plan_id: str
    fusion_id: str
    segmenter: str
    body: str  # the plan's JSON
    request: str  # the request that made it, as JSON
    digest: str


def digest(body: bytes | str, request: bytes | str) -> str:
    """What a stored row is checked against: a damaged plan or request is a miss, not a 500."""
    h = hashlib.blake2b(digest_size=16)
    h.update(body.encode() if isinstance(body, str) else body)
    h.update(b"\0")
    h.update(request.encode() if isinstance(request, str) else request)
    return h.hexdigest()


class Cursor(Protocol):
    def execute(self, sql: str, params: tuple = ...) -> Any: ...
    def fetchone(self) -> tuple | None: ...
    def fetchall(self) -> list[tuple]: ...


class SqlCache:
    """The queries. A backend gives ``connection()``, ``transaction()`` and its parameter
    ``placeholder``. Writers are serialized: SQLite's BEGIN IMMEDIATE; in PostgreSQL, the
    usage row that every size-changing write updates stays locked until it commits."""

    placeholder = "?"
    request_name = "json_extract(request, '$.name')"  # the definition function's name

    def connection(self) -> AbstractContextManager[Cursor]:
        """A cursor for statements that need no write lock (each commits on its own)."""
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Cursor]:
        """A cursor in one transaction that writers take one at a time."""
        raise NotImplementedError

    def writer(self) -> AbstractContextManager[Cursor]:
        """A cursor for a write that needs no transaction (it commits on its own)."""
        return self.connection()

    def close(self) -> None:
        raise NotImplementedError

    def unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` says the server cannot be reached (then nothing else will work
        either), rather than that one statement failed (a full disk fails writes only)."""
        return False

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _one(self, query: str, params: tuple) -> tuple | None:
        with self.connection() as cur:
            cur.execute(self.sql(query), params)
            return cur.fetchone()

    # ---- reads ---------------------------------------------------------------------------------

    def plan(self, plan_id: str) -> PlanRow | None:
        row = self._one("SELECT plan_id, fusion_id, segmenter, plan, request, digest FROM plans "
                        "WHERE plan_id = ?", (plan_id,))
        return PlanRow(*row) if row else None

    def plan_of(self, request_key: str) -> str | None:
        """The plan id a request key was linked to."""
        row = self._one("SELECT plan_id FROM requests WHERE request_key = ?", (request_key,))
        return row[0] if row else None

    def summary_of_request(self, request_key: str) -> tuple[str, str, str] | None:
        """(plan id, fusion id, segmenter) of the plan a request key was linked to."""
        return self._one("SELECT p.plan_id, p.fusion_id, p.segmenter FROM requests r JOIN plans "
                         "p ON p.plan_id = r.plan_id WHERE r.request_key = ?", (request_key,))

    def summary(self, plan_id: str) -> tuple[str, str, str] | None:
        return self._one("SELECT plan_id, fusion_id, segmenter FROM plans WHERE plan_id = ?",
                         (plan_id,))

    def recent(self, n: int) -> list[tuple[str, str, str, str | None]]:
        """(plan JSON, request JSON, digest, definition name) of the ``n`` newest plans."""
        with self.connection() as cur:
            cur.execute(self.sql(f"SELECT plan, request, digest, {self.request_name} FROM plans "
                                 f"ORDER BY created DESC LIMIT ?"), (n,))
            return cur.fetchall()

    def stats(self) -> tuple[int, int]:
        """(plans stored, bytes counted against the bound)."""
        with self.connection() as cur:
            cur.execute("SELECT COUNT(*) FROM plans")
            count = cur.fetchone()[0]
            cur.execute("SELECT bytes FROM plan_cache_usage WHERE id = 0")
            row = cur.fetchone()
        return int(count), int(row[0]) if row else 0

    # ---- writes --------------------------------------------------------------------------------

    def insert(self, row: PlanRow, size: int, now: float, max_bytes: int) -> tuple[bool, int]:
        """Store ``row`` (``size`` bytes of plan and request text) unless its plan id is there
        already (concurrent replicas write a plan once), then evict down to the bound:
        (inserted, plans evicted)."""
        size += ROW_BYTES
        with self.transaction() as cur:
            cur.execute(self.sql(
                "INSERT INTO plans(plan_id, fusion_id, segmenter, created, used, bytes, digest, "
                "request, plan) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (plan_id) DO "
                "NOTHING"), (row.plan_id, row.fusion_id, row.segmenter, now, now, size,
                             row.digest, row.request, row.body))
            inserted = cur.rowcount == 1
            if not inserted:
                return False, 0
            return True, self._grow(cur, size, max_bytes, keep=row.plan_id)

    def link(self, request_key: str, plan_id: str, max_bytes: int) -> int:
        """Answer ``request_key`` by ``plan_id`` from now on: plans evicted."""
        with self.transaction() as cur:
            cur.execute(self.sql("INSERT INTO requests(request_key, plan_id) SELECT ?, ? WHERE "
                                 "EXISTS (SELECT 1 FROM plans WHERE plan_id = ?) "
                                 "ON CONFLICT (request_key) DO NOTHING"),
                        (request_key, plan_id, plan_id))
            if cur.rowcount != 1:
                return 0
            return self._grow(cur, LINK_BYTES, max_bytes, keep=plan_id)

    def _grow(self, cur: Cursor, size: int, max_bytes: int, keep: str) -> int:
        cur.execute(self.sql("UPDATE plan_cache_usage SET bytes = bytes + ? WHERE id = 0"),
                    (size,))
        cur.execute("SELECT bytes FROM plan_cache_usage WHERE id = 0")
        total = int(cur.fetchone()[0])
        if total <= max_bytes:
            return 0
        return self._evict(cur, total - int(max_bytes * LOW_WATER), keep)

    def _evict(self, cur: Cursor, excess: int, keep: str) -> int:
        """Delete the least recently used plans (never ``keep``, just written) until ``excess``
        bytes are freed; the caller's transaction holds the usage row's lock."""
        evicted = 0
        while excess > 0:
            cur.execute(self.sql("SELECT plan_id, bytes FROM plans WHERE plan_id <> ? ORDER BY "
                                 "used, plan_id LIMIT ?"), (keep, EVICT_BATCH))
            victims, chosen = [], 0
            for plan_id, size in cur.fetchall():
                if chosen >= excess:
                    break
                victims.append(plan_id)
                chosen += int(size)
            if not victims:
                break
            freed, count = self._delete(cur, victims)
            evicted += count
            excess -= freed
            if freed == 0:
                break
        return evicted

    def _delete(self, cur: Cursor, plan_ids: list[str]) -> tuple[int, int]:
        """Delete plans and their links, and take their bytes off the total: (bytes, plans)."""
        marks = ", ".join(self.placeholder for _ in plan_ids)
        cur.execute(f"SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM plans WHERE plan_id IN "
                    f"({marks})", tuple(plan_ids))
        size, count = (int(x) for x in cur.fetchone())
        cur.execute(f"DELETE FROM plans WHERE plan_id IN ({marks})", tuple(plan_ids))
        cur.execute(f"DELETE FROM requests WHERE plan_id IN ({marks})", tuple(plan_ids))
        size += cur.rowcount * LINK_BYTES
        cur.execute(self.sql("UPDATE plan_cache_usage SET bytes = bytes - ? WHERE id = 0"),
                    (size,))
        return size, count

    def delete(self, plan_id: str) -> None:
        """Drop a damaged plan, so that the next one made under its id is stored."""
        with self.transaction() as cur:
            self._delete(cur, [plan_id])

    def touch(self, plan_ids: Iterator[str], now: float) -> None:
        """Mark plans as used now (batched by the caller: a cache hit writes nothing)."""
        ids = sorted(plan_ids)  # one lock order for every writer
        if not ids:
            return
        marks = ", ".join(self.placeholder for _ in ids)
        with self.writer() as cur:  # sizes do not change: no usage lock
            cur.execute(f"UPDATE plans SET used = {self.placeholder} WHERE plan_id IN ({marks})",
                        (now, *ids))

    def probe_write(self) -> None:
        """A write that changes nothing: can this cache be written again?"""
        with self.transaction() as cur:
            cur.execute("UPDATE plan_cache_usage SET bytes = bytes WHERE id = 0")
