"""The plan cache in PostgreSQL, shared by service replicas on any number of machines
(psycopg 3 with a connection pool; ``postgresql://user:password@host:port/database``).

The tables and queries are cache_sql's, as for SQLite. Replicas that create the tables at the
same moment take turns (an advisory lock); a replica that cannot reach the server serves
without caching (see service.cache.store) while the pool keeps trying to connect.

Every call has a deadline (``timeout_s``): a connection from the pool, a new connection, and the
statements on it. A server that stops answering with its connections open (a paused VM, a
failover that leaves the old address dark) is not noticed by TCP for minutes, and cannot run a
``statement_timeout`` or answer a cancel request; so a call past its deadline has its
connection's socket shut down here, which fails the statement at once (issue 45). The pool then
drops that connection.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fusecut.service.cache.sql import SCHEMA, SqlCache

SCHEMA_LOCK = 0x66757365637574  # pg_advisory_xact_lock's key while creating the tables


class PostgresCache(SqlCache):
    placeholder = "%s"
    request_name = "(request::json)->>'name'"

    def __init__(self, url: str, max_connections: int = 8, timeout_s: float = 1.0):
        from psycopg_pool import ConnectionPool

        self.url = url
        self.timeout_s = timeout_s
        # autocommit: a statement outside transaction() commits on its own; a connection
        # attempt gives up after timeout_s (libpq's least is 2 s), waiting for a connection
        # from the pool too (an unreachable host must not hold a request long)
        self.pool = ConnectionPool(url, min_size=1, max_size=max_connections, timeout=timeout_s,
                                   open=False, name="fusecut-cache",
                                   kwargs={"autocommit": True,
                                           "connect_timeout": max(2, round(timeout_s))})
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
    def _connection(self) -> Iterator:
        """A connection from the pool, its schema ensured, cut if the caller still has it
        ``timeout_s`` later."""
        import psycopg

        with self.pool.connection() as conn:
            cut = threading.Event()
            timer = threading.Timer(self.timeout_s, _cut, (conn, cut))
            timer.daemon = True
            timer.start()
            try:
                self._ensure_schema(conn)
                yield conn
            except psycopg.Error as e:
                if cut.is_set():
                    raise psycopg.OperationalError(
                        f"no answer from the server within {self.timeout_s:g} s") from e
                raise
            finally:
                timer.cancel()
                if cut.is_set() and not conn.closed:
                    conn.close()  # cut as the call ended: the pool must not hand it out

    @contextmanager
    def connection(self) -> Iterator:
        with self._connection() as conn, conn.cursor() as cur:
            yield cur

    @contextmanager
    def transaction(self) -> Iterator:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def recover(self, error: BaseException) -> bool:
        return False  # the pool replaces broken connections by itself

    def unreachable(self, error: BaseException) -> bool:
        import psycopg
        from psycopg_pool import PoolTimeout

        return isinstance(error, (psycopg.OperationalError, PoolTimeout))

    def close(self) -> None:
        self.pool.close(timeout=2)


def _cut(conn, cut: threading.Event) -> None:
    """Shut down ``conn``'s socket: whatever waits on it fails now."""
    cut.set()
    try:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception:  # closed meanwhile: nothing waits on it
        pass
