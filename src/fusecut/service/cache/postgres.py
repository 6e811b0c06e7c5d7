"""The plan cache in PostgreSQL, shared by service replicas on any number of machines
(psycopg 3 with a connection pool; ``postgresql://user:password@host:port/database``).

The tables and queries are cache_sql's, as for SQLite. Replicas that create the tables at the
same moment take turns (an advisory lock); a replica that cannot reach the server serves
without caching (see service.cache.store) while the pool keeps trying to connect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fusecut.service.cache.sql import SCHEMA, SqlCache

SCHEMA_LOCK = 0x66757365637574  # pg_advisory_xact_lock's key while creating the tables


class PostgresCache(SqlCache):
    placeholder = "%s"
    request_name = "(request::json)->>'name'"

    def __init__(self, url: str, max_connections: int = 8, timeout_s: float = 2.0):
        from psycopg_pool import ConnectionPool

        self.url = url
        # autocommit: a statement outside transaction() commits on its own; a connection
        # attempt gives up after timeout_s (an unreachable host must not hold a request long)
        self.pool = ConnectionPool(url, min_size=1, max_size=max_connections, timeout=timeout_s,
                                   open=False, name="fusecut-cache",
                                   kwargs={"autocommit": True,
                                           "connect_timeout": max(1, round(timeout_s))})
        self.pool.open(wait=False)
        self._schema = False

    def _ensure_schema(self, conn) -> None:
        if self._schema:
            return
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            for statement in SCHEMA:
                cur.execute(statement)
        self._schema = True

    @contextmanager
    def connection(self) -> Iterator:
        with self.pool.connection() as conn:
            self._ensure_schema(conn)
            with conn.cursor() as cur:
                yield cur

    @contextmanager
    def transaction(self) -> Iterator:
        with self.pool.connection() as conn:
            self._ensure_schema(conn)
            with conn.transaction(), conn.cursor() as cur:
                yield cur

    def recover(self, error: BaseException) -> bool:
        return False  # the pool replaces broken connections by itself

    def unreachable(self, error: BaseException) -> bool:
        import psycopg
        from psycopg_pool import PoolTimeout

        return isinstance(error, (psycopg.OperationalError, PoolTimeout))

    def close(self) -> None:
        self.pool.close(timeout=2)
