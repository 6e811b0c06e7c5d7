"""A database that stops answering never stops the service (issue 45): a PostgreSQL server
frozen with its connections open (SIGSTOP: a paused VM, a failover that leaves the old address
dark) and an SQLite file another process holds the write lock of (``BEGIN IMMEDIATE``) cost a
cache call about a second, then the cache is degraded and plans are served without it; /readyz
never waits on the cache.

Every frozen call runs in a thread the test joins with a timeout, so that a regression fails
the test instead of hanging it, and the server is always thawed.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fusecut.service.cache.store import PlanStore, lookup
from tests.server import Server
from tests.service.test_plan_cache import plan_bytes, put


def timed(fn, limit: float):
    """(fn's result, seconds it took); fails, without waiting longer, past ``limit``."""
    box: dict = {}

    def run():
        start = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e
        box["took"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting after {limit} s"
    if "error" in box:
        raise box["error"]
    return box["value"], box["took"]


def cluster_pids(data: Path) -> list[int]:
    """The postmaster (postmaster.pid's first line) and every process it started."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
    return [postmaster, *children]


@contextmanager
def frozen(server):
    """Every process of ``server`` stopped (SIGSTOP), its sockets open; thawed on exit."""
    pids = cluster_pids(server.data)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@contextmanager
def write_locked(path: str):
    """Another process's view of the file holding SQLite's write lock."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def wait_until_ok(store: PlanStore, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while store.status()["state"] != "ok":
        assert time.monotonic() < deadline, store.status()
        time.sleep(0.2)


@pytest.fixture
def own_postgres():
    """A server this test may freeze (the session's is shared)."""
    from tests.postgres import Postgres, require_binaries

    server = Postgres(require_binaries()).start()
    yield server
    server.close()


def test_a_frozen_postgresql_costs_a_call_seconds_then_the_cache_is_degraded(own_postgres):
    url = own_postgres.create_database("frozen")
    store = PlanStore(url, retry_s=0.5)
    first = put(store, 1, key="k1")
    with frozen(own_postgres):
        miss, took = timed(lambda: store.get("a" * 32), 20)
        assert miss is None and took < 4, took
        # degraded now: the next calls do not wait at all, and status() never does
        (_, took) = timed(lambda: store.get("b" * 32), 5)
        assert took < 0.5, took
        stored, took = timed(lambda: put(store, 2, key="k2"), 5)
        assert stored.body == plan_bytes(2)[1] and took < 0.5, took
        status, took = timed(store.status, 5)
        assert status["state"] == "degraded" and took < 0.5, (status, took)
        # a planner process's look-up (its own read-only connection) gives up as soon
        found, took = timed(lambda: lookup(url, plan_id="c" * 32), 20)
        assert found is None and took < 4, took
        time.sleep(2)  # the background thread retries meanwhile; requests still never wait
        (_, took) = timed(lambda: store.get("d" * 32), 5)
        assert took < 0.5, took
    wait_until_ok(store)
    assert store.get(first.plan_id).body == first.body
    put(store, 3)
    check = PlanStore(url)
    assert check.get(f"{3:032x}") is not None
    check.close()
    store.close()


def test_an_sqlite_file_locked_by_another_process_costs_a_write_about_a_second(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    store = PlanStore(path, retry_s=0.5)
    first = put(store, 1, key="k1")
    reader = PlanStore(path)  # another replica: nothing in memory
    with write_locked(path):
        stored, took = timed(lambda: put(store, 2, key="k2"), 40)
        assert stored.body == plan_bytes(2)[1] and took < 2, took
        status, took = timed(store.status, 5)
        assert status["state"] == "degraded" and took < 0.5, (status, took)
        assert "locked" in status["error"]
        # reads do not wait for the lock (WAL), nor behind the store's failing writes
        hit, took = timed(lambda: reader.get(first.plan_id), 40)
        assert hit is not None and hit.body == first.body and took < 1, took
        for i in range(3, 6):
            stored, took = timed(lambda i=i: put(store, i), 40)
            assert took < 0.5, took
        time.sleep(1.5)  # the background thread's retries wait; requests do not
        (_, took) = timed(lambda: put(store, 6), 5)
        assert took < 0.5, took
    wait_until_ok(store)
    put(store, 7)
    assert PlanStore(path).get(f"{7:032x}") is not None
    reader.close()
    store.close()


def test_an_sqlite_file_locked_at_start_degrades_the_cache_and_serves(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    PlanStore(path).close()
    with write_locked(path):
        store, took = timed(lambda: PlanStore(path, retry_s=0.5), 40)
        assert took < 2, took
        status, took = timed(store.status, 5)
        assert status["state"] == "degraded" and took < 0.5
        stored, took = timed(lambda: put(store, 1), 5)
        assert stored.body == plan_bytes(1)[1] and took < 0.5, took
    wait_until_ok(store)
    put(store, 2)
    assert PlanStore(path).get(f"{2:032x}") is not None
    store.close()


# ---- the service ---------------------------------------------------------------------------

DEFINITION = """
def fusion(fd):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    T1 = fd.ops.exp(T0)
    T2 = fd.ops.mul(T1, fd.define_scalar({c}, dtype=DataType.Double))
    fd.add_output(T2)
"""


def plan_body(c: float) -> dict:
    return {"definition": DEFINITION.format(c=c),
            "inputs": [{"shape": [8, 16], "dtype": "float32"}]}


def check_service_answers_without_the_cache(http: httpx.Client, stored_id: str) -> None:
    """New plans and a stored one within seconds, /readyz at once and saying the cache is
    degraded."""
    for c in (2.5, 3.5):
        response, took = timed(lambda c=c: http.post("/v1/plan", json=plan_body(c)), 40)
        assert response.status_code == 200, response.text
        assert took < 8, took
    response, took = timed(lambda: http.get(f"/v1/plans/{stored_id}"), 20)
    assert response.status_code == 200 and took < 4, took
    response, took = timed(lambda: http.get(f"/v1/plans/{'e' * 32}"), 20)
    assert response.status_code == 404 and took < 4, took
    deadline = time.monotonic() + 10
    while True:
        response, took = timed(lambda: http.get("/readyz"), 20)
        assert took < 0.5, took
        if response.json()["cache"]["state"] == "degraded":
            break
        assert time.monotonic() < deadline, response.json()
        time.sleep(0.2)
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    for _ in range(5):
        _, took = timed(lambda: http.get("/readyz"), 5)
        assert took < 0.5, took


def test_the_service_answers_while_its_postgresql_is_frozen(own_postgres, tmp_path):
    url = own_postgres.create_database("frozen_service")
    with Server(tmp_path / "unused.sqlite", cache_url=url) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        stored = http.post("/v1/plan", json=plan_body(1.5))
        assert stored.status_code == 200, stored.text
        with frozen(own_postgres):
            check_service_answers_without_the_cache(http, stored.json()["plan_id"])
        deadline = time.monotonic() + 30
        while http.get("/readyz").json()["cache"]["state"] != "ok":
            assert time.monotonic() < deadline, "the cache did not recover"
            time.sleep(0.3)


def test_the_service_answers_while_its_sqlite_file_is_locked(tmp_path):
    path = tmp_path / "plans.sqlite"
    with Server(path) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        stored = http.post("/v1/plan", json=plan_body(1.5))
        assert stored.status_code == 200, stored.text
        with write_locked(str(path)):
            check_service_answers_without_the_cache(http, stored.json()["plan_id"])
        deadline = time.monotonic() + 30
        while http.get("/readyz").json()["cache"]["state"] != "ok":
            assert time.monotonic() < deadline, "the cache did not recover"
            time.sleep(0.3)
        assert json.loads(http.post("/v1/plan", json=plan_body(4.5)).text)["plan_id"]
