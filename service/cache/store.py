"""The plan cache as the service sees it: an SQLite file (the default) or a PostgreSQL database
shared by replicas (``--cache postgresql://...``), in front of which recently used plans are
kept in memory.

Plans are keyed by their plan id (fusecut version, fusion id, input metadata, options and device
profile), and also by hashes of the requests that produced them (with the version), so a repeated
request is answered without parsing its definition. The cache is bounded (``cache_max_bytes``): the
least recently used plans are evicted (see cache_sql). A use marks the plan in memory; the marks
are written in one statement a second, so a hit costs no write.

The cache is an optimization, never a reason to fail a request: a database that cannot be
reached, is full or is damaged makes reads misses and writes no-ops. Each failure is logged and
counted (``fusecut_cache_errors_total``), ``status()`` (and so ``/readyz``) reports the cache
as degraded, and requests no longer try the failing kind of operation (reads, writes): a
background thread tries it again every ``retry_s`` seconds or so, and requests use the cache
again once that succeeds, so that no request waits for a dead server. Every call has a deadline
(``timeout_s``): an SQLite file another process holds the write lock of, or a PostgreSQL server
that stopped answering with its connections open, costs one call about that long, then the cache
is degraded (issue 45). ``status()`` waits a quarter of a second at most. A damaged row (its
digest does not match) is a miss, and is deleted.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fusecut.service.cache.sql import PlanRow, SqlCache, digest

log = logging.getLogger("fusecut.cache")
T = TypeVar("T")
POSTGRES = ("postgresql://", "postgres://")
MEMORY_BYTES = 64 * 1024 * 1024  # plan bodies kept in memory, at most
READ_ONLY_TIMEOUT_S = 0.5  # a planner process's look-up: without it, it only plans
STATUS_WAIT_S = 0.25  # the longest status() (so /readyz) waits for the cache's counts


@dataclass(frozen=True)
class StoredPlan:
    plan_id: str
    segmenter: str
    body: bytes  # the plan's JSON, ready to send


def open_cache(location: str, read_only: bool = False, timeout_s: float = 1.0) -> SqlCache:
    """The cache at ``location``: a ``postgresql://`` URL, or an SQLite file path (or
    ``sqlite:///path``). Each call on it gives up after ``timeout_s`` (a read-only one, a
    planner process's look-up, after READ_ONLY_TIMEOUT_S at most)."""
    if read_only:
        timeout_s = min(timeout_s, READ_ONLY_TIMEOUT_S)
    if location.startswith(POSTGRES):
        from fusecut.service.cache.postgres import PostgresCache

        return PostgresCache(location, max_connections=1, timeout_s=timeout_s) if read_only \
            else PostgresCache(location, timeout_s=timeout_s)
    from fusecut.service.cache.sqlite import SqliteCache

    path = location.removeprefix("sqlite://") if location.startswith("sqlite://") else location
    return SqliteCache(path, read_only=read_only, timeout_s=timeout_s)


# the password of a URL's user info, and a password=, sslpassword= ... parameter of a URL's query
# or of a key=value connection string (quoted or not): every form libpq accepts
USER_INFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
PASSWORD_PARAMETER = re.compile(r"((?:^|[?&\s;,])[a-z_]*password\s*=\s*)"
                                r"('(?:[^'\\]|\\.)*'|[^\s&#;,]*)", re.IGNORECASE)


def redact(location: str) -> str:
    """A location (or any text naming one) fit for logs and /readyz: every password in it
    replaced by ``***``."""
    return PASSWORD_PARAMETER.sub(r"\1***", USER_INFO.sub(r"\1***@", location))


def describe(error: BaseException) -> str:
    """One line naming the error (a driver's message may span lines, or quote the location:
    its passwords are redacted)."""
    text = redact(" ".join(str(error).split()))
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


class Breaker:
    """Stops calling a failing database for ``retry_s`` after each failure."""

    def __init__(self, retry_s: float):
        self.retry_s = retry_s
        self.failed_at: float | None = None
        self.error: str | None = None

    @property
    def failing(self) -> bool:
        return self.failed_at is not None

    def closed(self) -> bool:
        """True when a call may be tried (no failure, or the last one ``retry_s`` ago)."""
        return self.failed_at is None or time.monotonic() - self.failed_at >= self.retry_s

    def fail(self, error: BaseException) -> bool:
        """Record a failure: True if it is the first since the last success."""
        first = self.failed_at is None
        self.failed_at, self.error = time.monotonic(), describe(error)
        return first

    def succeed(self) -> bool:
        """Record a success: True if it ends a run of failures."""
        was = self.failed_at is not None
        self.failed_at = self.error = None
        return was


class PlanStore:
    def __init__(self, location: str, max_bytes: int = 512 * 1024**2,
                 memory_items: int = 1024, retry_s: float = 2.0, touch_s: float = 1.0,
                 timeout_s: float = 1.0):
        from fusecut.service import metrics

        self.metrics = metrics
        self.location = location
        self.timeout_s = timeout_s  # the longest one call on the database may take
        self.where = redact(location)
        self.kind = "postgresql" if location.startswith(POSTGRES) else "sqlite"
        self.max_bytes = max_bytes
        self.errors = 0
        self.evicted = 0
        self._breakers = {"read": Breaker(retry_s), "write": Breaker(retry_s)}
        self._lock = threading.Lock()  # the memory maps and the marks
        self._opening = threading.Lock()  # the backend's opening (which may wait timeout_s)
        self._stats: tuple[int, int] | None = None  # the counts read last
        self._stats_done: threading.Event | None = None  # set when the last read of them ends
        self._memory: OrderedDict[str, StoredPlan] = OrderedDict()  # by plan id
        self._memory_bytes = 0
        self._requests: OrderedDict[str, str] = OrderedDict()  # request key -> plan id
        self._memory_items = memory_items
        self._used: set[str] = set()  # plan ids used since the marks were last written
        self._backend: SqlCache | None = None
        self._open()
        self._stop = threading.Event()
        self._marker = threading.Thread(target=self._mark_used, args=(touch_s,), daemon=True,
                                        name="fusecut-cache-marks")
        self._marker.start()

    # ---- the database, guarded -----------------------------------------------------------------

    def _open(self) -> SqlCache | None:
        """The backend, opened now if it is not yet (a failure is a degraded cache)."""
        if self._backend is not None:
            return self._backend
        with self._opening:
            if self._backend is None:
                try:
                    self._backend = open_cache(self.location, timeout_s=self.timeout_s)
                except Exception as e:
                    self._failed("read", "open", e)
                    self._failed("write", "open", e, count=False)
                    return None
                for moved in getattr(self._backend, "quarantined", ()):
                    self.metrics.CACHE_QUARANTINED.inc()
                    log.debug("quarantined %s", moved)
        return self._backend

    def _call(self, kind: str, operation: str, fn: Callable[[SqlCache], T], default: T,
              probe: bool = False) -> T:
        """``fn(backend)``, or ``default`` if the database fails: logged, counted and shown by
        status(). While this kind of call fails, only probes (the background thread's, at most
        one each ``retry_s``) try the database; the others get ``default`` at once."""
        breaker = self._breakers[kind]
        if not breaker.closed() or (breaker.failing and not probe):
            return default
        backend = self._open()
        if backend is None:
            return default
        try:
            result = fn(backend)
        except Exception as e:  # sqlite3, psycopg and pool errors, OSError: never a 500
            quarantined = len(getattr(backend, "quarantined", ()))
            if backend.recover(e):  # a corrupt SQLite file moved aside: a fresh cache
                self.metrics.CACHE_QUARANTINED.inc(len(backend.quarantined) - quarantined)
                self._count(operation)
                return default
            self._failed(kind, operation, e)
            if backend.unreachable(e):  # reads and writes alike: wait for neither
                for other in self._breakers:
                    self._failed(other, operation, e, count=False)
            return default
        if breaker.succeed():
            log.warning("plan cache %s works again (%s)", self.where, kind)
            self._degraded_gauge()
        return result

    def _count(self, operation: str) -> None:
        self.errors += 1
        self.metrics.CACHE_ERRORS.labels(operation).inc()

    def _failed(self, kind: str, operation: str, error: BaseException,
                count: bool = True) -> None:
        if count:
            self._count(operation)
        if self._breakers[kind].fail(error):
            log.error("plan cache %s failed (%s %s): %s; serving without it", self.where,
                      kind, operation, describe(error))
        self._degraded_gauge()

    def _degraded_gauge(self) -> None:
        self.metrics.CACHE_DEGRADED.set(1 if self.degraded else 0)

    @property
    def degraded(self) -> bool:
        return any(b.failing for b in self._breakers.values())

    # ---- memory --------------------------------------------------------------------------------

    def _remember(self, stored: StoredPlan) -> None:
        with self._lock:
            old = self._memory.pop(stored.plan_id, None)
            self._memory_bytes += len(stored.body) - (len(old.body) if old else 0)
            self._memory[stored.plan_id] = stored
            while self._memory and (len(self._memory) > self._memory_items
                                    or self._memory_bytes > MEMORY_BYTES):
                _, dropped = self._memory.popitem(last=False)
                self._memory_bytes -= len(dropped.body)

    def _remember_request(self, request_key: str, plan_id: str) -> None:
        with self._lock:
            self._requests[request_key] = plan_id
            self._requests.move_to_end(request_key)
            while len(self._requests) > self._memory_items:
                self._requests.popitem(last=False)

    def _use(self, plan_id: str) -> None:
        with self._lock:
            self._used.add(plan_id)

    def _mark_used(self, every_s: float) -> None:
        """The background thread: writes the marks, and retries a failing database (so that
        status(), which /readyz calls, never waits for one)."""
        ticks = 0
        while not self._stop.wait(every_s):
            self.flush_marks()
            ticks += 1
            if self._breakers["read"].failing or ticks % 10 == 0:  # also keeps the gauge live
                self._refresh_stats(probe=True)
            if self._breakers["write"].failing:
                self._call("write", "probe", lambda b: b.probe_write(), None, probe=True)

    def flush_marks(self) -> None:
        """Write the last-use times of the plans used since the last call (one statement)."""
        with self._lock:
            used, self._used = self._used, set()
        if used:
            now = time.time()
            self._call("write", "mark", lambda b: b.touch(iter(used), now), None)

    # ---- plans ---------------------------------------------------------------------------------

    def remembered(self, request_key: str) -> StoredPlan | None:
        """A request's plan if it is in memory: no database call (safe on the event loop)."""
        with self._lock:
            plan_id = self._requests.get(request_key)
            stored = self._memory.get(plan_id) if plan_id is not None else None
            if stored is not None:
                self._memory.move_to_end(plan_id)
                self._used.add(plan_id)
        return stored

    def _verified(self, row: PlanRow | None) -> PlanRow | None:
        if row is None or digest(row.body, row.request) == row.digest:
            return row
        log.error("plan cache %s: plan %s is damaged (its digest does not match); treated as a "
                  "miss and deleted", self.where, row.plan_id)
        self._count("damaged")
        self._call("write", "delete", lambda b: b.delete(row.plan_id), None)
        return None

    def get(self, plan_id: str) -> StoredPlan | None:
        with self._lock:
            hit = self._memory.get(plan_id)
            if hit is not None:
                self._memory.move_to_end(plan_id)
                self._used.add(plan_id)
                return hit
        row = self._verified(self._call("read", "get", lambda b: b.plan(plan_id), None))
        if row is None:
            return None
        stored = StoredPlan(plan_id, row.segmenter, row.body.encode())
        self._remember(stored)
        self._use(plan_id)
        return stored

    def by_request(self, request_key: str) -> StoredPlan | None:
        stored = self.remembered(request_key)
        if stored is not None:
            return stored
        with self._lock:
            plan_id = self._requests.get(request_key)
        if plan_id is None:
            plan_id = self._call("read", "get", lambda b: b.plan_of(request_key), None)
            if plan_id is None:
                return None
            self._remember_request(request_key, plan_id)
        return self.get(plan_id)

    def request(self, plan_id: str) -> dict[str, Any] | None:
        """What produced a plan: its definition, input metadata and options."""
        row = self._verified(self._call("read", "get", lambda b: b.plan(plan_id), None))
        return json.loads(row.request) if row else None

    def put(self, plan: dict[str, Any], request: dict[str, Any],
            request_key: str | None = None) -> StoredPlan:
        return self.put_bytes(plan["plan_id"], plan["fusion_id"], plan["segmenter"],
                              json.dumps(plan, separators=(",", ":"), allow_nan=False).encode(),
                              json.dumps(request, separators=(",", ":"), allow_nan=False),
                              request_key)

    def put_bytes(self, plan_id: str, fusion_id: str, segmenter: str, body: bytes,
                  request: str, request_key: str | None = None) -> StoredPlan:
        """Store a plan already serialized (strict JSON) with the request (JSON) that made it.
        The plan is returned whether or not the database took it; if another replica stored
        it first, its copy is returned (and kept), so that an id means one body everywhere."""
        stored = StoredPlan(plan_id, segmenter, body)
        request_bytes = request.encode()
        size = len(body) + len(request_bytes)
        if size <= self.max_bytes // 2:  # a plan near the bound would evict all the others
            row = PlanRow(plan_id, fusion_id, segmenter, body.decode(), request,
                      digest(body, request_bytes))
            inserted, evicted = self._call("write", "put", lambda b: b.insert(
                row, size, time.time(), self.max_bytes), (None, 0))
            self._evicted(evicted)
            if inserted is False:  # stored already: by a replica that planned it too
                first = self._verified(self._call("read", "get", lambda b: b.plan(plan_id),
                                                  None))
                if first is not None:
                    stored = StoredPlan(plan_id, first.segmenter, first.body.encode())
        self._remember(stored)
        if request_key:
            self.link(request_key, plan_id)
        return stored

    def link(self, request_key: str, plan_id: str) -> None:
        """Answer later requests with this key by the plan stored under ``plan_id``."""
        self._remember_request(request_key, plan_id)
        self._evicted(self._call("write", "link", lambda b: b.link(
            request_key, plan_id, self.max_bytes), 0))

    def _evicted(self, count: int) -> None:
        if count:
            self.evicted += count
            self.metrics.CACHE_EVICTIONS.inc(count)

    def recent(self, n: int) -> list[tuple[dict[str, Any], str | None]]:
        """The ``n`` newest plans, each with the name of the definition function that made it
        (None for a wire-JSON definition); damaged ones left out."""
        return intact(self._call("read", "recent", lambda b: b.recent(n), []))

    def count(self) -> int:
        return self._call("read", "stats", lambda b: b.stats(), (0, 0))[0]

    def _refresh_stats(self, probe: bool = False) -> tuple[int, int] | None:
        stats = self._call("read", "stats", lambda b: b.stats(), None, probe)
        if stats is not None:
            self._stats = stats
            self.metrics.CACHE_BYTES.set(stats[1])
        return stats

    def _stats_soon(self) -> tuple[int, int] | None:
        """The counts, read now in a thread of their own: those read last if that takes more
        than STATUS_WAIT_S (a read still running is waited for, not started again)."""
        with self._lock:
            done = self._stats_done
            if done is None or done.is_set():
                done = self._stats_done = threading.Event()

                def read() -> None:
                    try:
                        self._refresh_stats()
                    finally:
                        done.set()

                threading.Thread(target=read, daemon=True, name="fusecut-cache-stats").start()
        done.wait(STATUS_WAIT_S)
        return self._stats

    def status(self) -> dict[str, Any]:
        """What /readyz says of the cache: counts read now (or, if that takes longer than
        STATUS_WAIT_S, those read last), none while reads are failing; never a longer wait."""
        stats = self._stats_soon() if not self._breakers["read"].failing else None
        errors = [b.error for b in self._breakers.values() if b.error]
        return {"state": "degraded" if self.degraded else "ok", "backend": self.kind,
                "location": self.where, "plans": stats[0] if stats else None,
                "bytes": stats[1] if stats else None, "max_bytes": self.max_bytes,
                "errors": self.errors, "evicted": self.evicted,
                "quarantined": list(getattr(self._backend, "quarantined", ())),
                **({"error": errors[0]} if errors else {})}

    def close(self) -> None:
        self._stop.set()
        self._marker.join(5)
        self.flush_marks()
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


# ---- reads from planner processes and workers' threads -----------------------------------------
# The service's PlanStore writes; these only read, through a read-only connection of their own,
# so that a read never waits on the store's lock (nor holds the event loop).

_readers: dict[str, tuple[SqlCache | None, Breaker]] = {}
_readers_lock = threading.Lock()


def _read(location: str, read: Callable[[SqlCache], T]) -> T | None:
    """``read(reader)`` on a read-only connection to the cache at ``location``; None where the
    cache cannot say (":memory:" is private to the service's store; no file yet; a dead
    server)."""
    if location == ":memory:":
        return None
    with _readers_lock:
        reader, breaker = _readers.get(location, (None, None))
        if breaker is None:
            breaker = Breaker(retry_s=5.0)
        if not breaker.closed():
            return None
        try:
            if reader is None:
                reader = open_cache(location, read_only=True)
        except Exception as e:
            breaker.fail(e)
            _readers[location] = (None, breaker)
            return None
        _readers[location] = (reader, breaker)
    try:
        found = read(reader)
    except Exception as e:
        with _readers_lock:
            breaker.fail(e)
            if isinstance(e, OSError):
                reader.close()
                _readers[location] = (None, breaker)
        return None
    breaker.succeed()
    return found


def lookup(location: str, request_key: str | None = None,
           plan_id: str | None = None) -> tuple[str, str, str] | None:
    """(plan id, fusion id, segmenter) of the plan stored for a request key or plan id, read
    from a planner process (the service's process writes); None where the cache cannot say."""
    found = _read(location, lambda r: r.summary_of_request(request_key)
                  if request_key is not None else r.summary(plan_id))
    return tuple(found) if found else None


def read_plan(location: str, plan_id: str) -> tuple[str, str] | None:
    """(request JSON, plan JSON) of a stored plan, if it is intact: what a worker rebuilds the
    plan from."""
    row = _read(location, lambda r: r.plan(plan_id))
    if row is None or digest(row.body, row.request) != row.digest:
        return None
    return row.request, row.body


def read_recent(location: str, n: int) -> list[tuple[dict[str, Any], str | None]] | None:
    """As ``PlanStore.recent``, read from a planner process (the dashboard's); None where the
    cache cannot be read from here."""
    rows = _read(location, lambda r: r.recent(n))
    return None if rows is None else intact(rows)


def intact(rows: list[tuple[str, str, str, str | None]]
           ) -> list[tuple[dict[str, Any], str | None]]:
    """(plan, definition name) of the rows of ``SqlCache.recent`` whose digests match."""
    return [(json.loads(plan), name) for plan, request, stored_digest, name in rows
            if digest(plan, request) == stored_digest]
