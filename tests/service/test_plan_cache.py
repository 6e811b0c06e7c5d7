"""The plan cache (service.cache.store, over SQLite and PostgreSQL): the same semantics on a
real SQLite file and a real PostgreSQL server, its size bound with least-recently-used eviction,
and a damaged, full or unreachable database turning into misses, never into errors (issues 19
and 20)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from fusecut.service.cache.sql import LINK_BYTES, ROW_BYTES
from fusecut.service.cache.store import PlanStore, StoredPlan, lookup, redact


def plan_bytes(i: int, size: int = 1000) -> tuple[str, bytes, str]:
    """A plan-shaped JSON body of about ``size`` bytes and its request."""
    pid = f"{i:032x}"
    body = json.dumps({"plan_id": pid, "fusion_id": "f" * 64, "segmenter": "greedy",
                       "pad": "x" * size}).encode()
    request = json.dumps({"definition": {"ops": []}, "inputs": [], "name": f"fusion_{i}"})
    return pid, body, request


def put(store: PlanStore, i: int, size: int = 1000, key: str | None = None) -> StoredPlan:
    pid, body, request = plan_bytes(i, size)
    return store.put_bytes(pid, "f" * 64, "greedy", body, request, key)


def row_size(i: int, size: int = 1000) -> int:
    _, body, request = plan_bytes(i, size)
    return len(body) + len(request.encode()) + ROW_BYTES


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "plans.sqlite")
    server = request.getfixturevalue("postgres")
    return server.create_database(f"cache_{request.node.name}".lower()[:60].replace("[", "_")
                                  .replace("]", "").replace("-", "_"))


def fresh(location: str, **kw) -> PlanStore:
    """Another process's view: nothing in memory."""
    return PlanStore(location, **kw)


def test_a_plan_is_written_once_and_found_by_id_and_request(location):
    a, b = fresh(location), fresh(location)
    stored = put(a, 1, key="req-1")
    again = put(b, 1, key="req-1b")  # a second replica computed the same plan
    assert again.body == stored.body
    other = fresh(location)
    assert other.get(stored.plan_id).body == stored.body
    assert other.by_request("req-1").plan_id == stored.plan_id
    assert other.by_request("req-1b").plan_id == stored.plan_id
    assert other.request(stored.plan_id)["name"] == "fusion_1"
    assert other.count() == 1
    status = other.status()
    assert status["state"] == "ok" and status["plans"] == 1
    assert status["bytes"] == row_size(1) + 2 * LINK_BYTES  # one row, two links
    assert lookup(location, request_key="req-1") == (stored.plan_id, "f" * 64, "greedy")
    assert lookup(location, plan_id=stored.plan_id)[0] == stored.plan_id
    assert lookup(location, plan_id="0" * 32) is None
    [(plan, name)] = other.recent(5)
    assert plan["plan_id"] == stored.plan_id and name == "fusion_1"
    for s in (a, b, other):
        s.close()


def test_concurrent_writers_store_a_plan_once(location):
    stores = [fresh(location) for _ in range(4)]
    start = threading.Barrier(len(stores))

    def write(store):
        start.wait()
        for i in range(20):
            put(store, i, key=f"k{i}")

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check = fresh(location)
    assert check.count() == 20
    assert check.status()["bytes"] == sum(row_size(i) for i in range(20)) + 20 * LINK_BYTES
    assert sum(s.errors for s in stores) == 0
    for s in (*stores, check):
        s.close()


def test_the_size_bound_evicts_the_least_recently_used(location):
    size = row_size(0)
    bound = 10 * size + 10 * LINK_BYTES  # room for 10 plans with one link each
    store = fresh(location, max_bytes=bound, memory_items=0)
    for i in range(8):
        put(store, i, key=f"k{i}")
        time.sleep(0.002)  # distinct last-use times
    store.get(f"{0:032x}")  # plan 0 is used again: now the most recent
    store.get(f"{1:032x}")
    store.flush_marks()
    for i in range(8, 14):
        put(store, i, key=f"k{i}")
        time.sleep(0.002)
    status = store.status()
    assert status["bytes"] <= bound
    assert status["evicted"] >= 4 and status["plans"] == 14 - status["evicted"]
    check = fresh(location)
    kept = {i for i in range(14) if check.get(f"{i:032x}") is not None}
    assert {0, 1, 12, 13} <= kept  # used again, or newest
    assert not {2, 3, 4} & kept  # the least recently used went first
    assert check.by_request("k2") is None and check.by_request("k0") is not None
    # the total is exact: what the rows and links left add up to
    left = sum(row_size(i) for i in kept) + len(kept) * LINK_BYTES
    assert check.status()["bytes"] == left
    for s in (store, check):
        s.close()


def test_a_plan_larger_than_half_the_bound_is_served_not_stored(location):
    store = fresh(location, max_bytes=4000)
    put(store, 1, size=100)
    big = put(store, 2, size=5000)
    assert big.body and store.get(big.plan_id) is not None  # from memory
    check = fresh(location)
    assert check.get(big.plan_id) is None and check.get(f"{1:032x}") is not None
    for s in (store, check):
        s.close()


def test_a_damaged_row_is_a_miss_and_is_deleted(location, caplog):
    store = fresh(location)
    stored = put(store, 7, key="k7")
    put(store, 8)
    store.close()
    tamper(location, "UPDATE plans SET plan = replace(plan, 'xxxx', 'xxyx') WHERE plan_id = ?",
           stored.plan_id)
    check = fresh(location)
    with caplog.at_level(logging.ERROR, "fusecut.cache"):
        assert check.get(stored.plan_id) is None
        assert check.by_request("k7") is None
    assert "is damaged" in caplog.text and stored.plan_id in caplog.text
    assert check.errors >= 1 and check.count() == 1  # deleted; plan 8 kept
    assert check.request(f"{8:032x}") is not None
    again = put(check, 7)  # planned again: stored anew
    assert fresh(location).get(stored.plan_id).body == again.body
    check.close()


def tamper(location: str, sql: str, *params) -> None:
    if location.startswith("postgresql"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), params)
    else:
        with sqlite3.connect(location) as db:
            db.execute(sql, params)


def test_an_unreachable_postgresql_is_a_miss_at_once(postgres):
    dead = f"postgresql://nobody:secret@127.0.0.1:{postgres.port + 1}/none"
    store = PlanStore(dead, retry_s=30)
    start = time.monotonic()
    assert put(store, 1).body  # served, not stored
    assert store.get("a" * 32) is None
    assert store.get("b" * 32) is None  # the breaker is open: no second wait
    assert time.monotonic() - start < 5
    status = store.status()
    assert status["state"] == "degraded" and status["errors"] >= 1
    assert "secret" not in json.dumps(status) and status["location"] == redact(dead)
    assert "***" in status["location"]
    store.close()


def test_postgresql_stopped_and_restarted(tmp_path):
    from tests.postgres import Postgres, require_binaries

    server = Postgres(require_binaries()).start()
    try:
        url = server.create_database("restart")
        store = PlanStore(url, retry_s=0.5)
        put(store, 1)
        server.stop()
        assert put(store, 2).body  # served while the server is down
        assert fresh_miss(url)
        assert store.status()["state"] == "degraded"
        server.start()
        server.wait_accepting()
        wait_until_ok(store)
        put(store, 3)
        check = PlanStore(url)
        assert check.get(f"{1:032x}") is not None and check.get(f"{3:032x}") is not None
        store.close()
        check.close()
    finally:
        server.close()


def wait_until_ok(store: PlanStore, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while store.status()["state"] != "ok":
        assert time.monotonic() < deadline, store.status()
        time.sleep(0.2)


def fresh_miss(url: str) -> bool:
    store = PlanStore(url)
    try:
        return store.get(f"{1:032x}") is None
    finally:
        store.close()


# ---- SQLite files ----------------------------------------------------------------------------


def test_a_full_disk_serves_plans_and_reports_a_degraded_cache(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    store = PlanStore(path, retry_s=0.2)
    first = put(store, 1, key="k1")
    db = store._backend._db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own SQLITE_FULL: disk full
    for i in range(2, 6):
        assert put(store, i, size=20_000, key=f"k{i}").body  # served, not stored
    assert store.status()["state"] == "degraded"
    assert "full" in store.status()["error"]
    assert store.errors >= 1
    assert store.get(first.plan_id).body == first.body  # reads still work
    assert fresh(path).get(first.plan_id) is not None
    db.execute("PRAGMA max_page_count = 1073741823")  # space again
    wait_until_ok(store)  # the background thread tried a write again
    put(store, 9, key="k9")
    assert fresh(path).get(f"{9:032x}") is not None
    store.close()


def test_a_corrupt_header_is_quarantined_and_a_fresh_cache_started(tmp_path, caplog):
    path = tmp_path / "plans.sqlite"
    store = PlanStore(str(path))
    put(store, 1)
    store.close()
    data = bytearray(path.read_bytes())
    data[:16] = b"this is no db!!\0"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, "fusecut.cache"):
        store = PlanStore(str(path))
    lines = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0] and "\n" not in lines[0]
    [moved] = store.status()["quarantined"]
    assert Path(moved).exists() and moved.startswith(str(path) + ".corrupt-")
    assert store.get(f"{1:032x}") is None  # a fresh cache
    put(store, 2)
    assert fresh(str(path)).get(f"{2:032x}") is not None
    store.close()


def test_mid_file_corruption_gives_misses_then_a_fresh_cache(tmp_path):
    path = tmp_path / "plans.sqlite"
    store = PlanStore(str(path))
    stored = [put(store, i, size=3000, key=f"k{i}") for i in range(60)]
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    for p in range(len(data) // page // 3, len(data) // page // 3 + 6):  # six pages
        data[p * page:(p + 1) * page] = bytes([0x5A]) * page
    path.write_bytes(bytes(data))
    store = PlanStore(str(path))
    found = [store.get(s.plan_id) for s in stored]  # never raises: a hit, or a miss
    assert all(f is None or f.body == s.body for f, s in zip(found, stored))
    assert any(f is None for f in found)
    for i in range(100, 130):
        assert put(store, i, key=f"k{i}").body
    status = store.status()
    assert status["errors"] >= 1 and status["state"] == "ok"
    [moved] = status["quarantined"]  # SQLite said "malformed": moved aside, started afresh
    assert Path(moved).exists() and status["plans"] == 30
    check = PlanStore(str(path))
    assert check.get(f"{129:032x}") is not None  # new plans are stored again
    store.close()
    check.close()


def test_a_cache_written_before_the_bound_is_migrated(tmp_path):
    path = tmp_path / "plans.sqlite"
    with sqlite3.connect(path) as db:  # the schema before issue 19
        db.executescript("""
            CREATE TABLE plans (plan_id TEXT PRIMARY KEY, fusion_id TEXT NOT NULL,
                segmenter TEXT NOT NULL, created REAL NOT NULL, request TEXT NOT NULL,
                plan TEXT NOT NULL);
            CREATE TABLE requests (request_key TEXT PRIMARY KEY,
                plan_id TEXT NOT NULL REFERENCES plans(plan_id));
            CREATE INDEX plans_created ON plans(created);""")
        pid, body, request = plan_bytes(3)
        db.execute("INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?)",
                   (pid, "f" * 64, "greedy", time.time(), request, body.decode()))
        db.execute("INSERT INTO requests VALUES (?, ?)", ("old-key", pid))
    store = PlanStore(str(path))
    assert store.by_request("old-key").body == body
    assert store.status()["bytes"] == row_size(3) + LINK_BYTES
    put(store, 4)
    assert store.count() == 2
    store.close()


def test_a_second_process_keeps_the_fresh_file_another_quarantine_made(tmp_path):
    # uvicorn --workers N: every process may find the file corrupt before one moves it aside
    from fusecut.service.cache.sqlite import SqliteCache

    path = tmp_path / "plans.sqlite"
    path.write_bytes(b"not an sqlite file" * 100)
    corrupt = path.stat().st_ino
    first = PlanStore(str(path))  # moves it aside, starts a fresh file
    put(first, 1)
    late = SqliteCache.__new__(SqliteCache)  # the other process, failing on the old file
    late.path, late.quarantined = str(path), []
    late._quarantine(sqlite3.DatabaseError("file is not a database"), corrupt)
    assert late.quarantined == [] and path.stat().st_ino != corrupt
    assert fresh(str(path)).get(f"{1:032x}") is not None  # the fresh cache was kept
    first.close()


def test_a_new_version_never_serves_an_old_plan(tmp_path, monkeypatch):
    # issue 32: the cache key held no fusecut version, and the default cache was one file for
    # every checkout: a new version could serve an old plan
    import fusecut
    import fusecut.version
    from fusecut import environment
    from fusecut.optimizer.plan import plan as plan_module
    from fusecut.optimizer.plan.plan import request_key
    from fusecut.service.planning import plan_body
    from fusecut.service.settings import Settings

    settings = Settings(db_path=str(tmp_path / "plans.sqlite"))
    raw = json.dumps({"definition": "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], "
                                    "contiguity=[True], dtype=DataType.Float)\n"
                                    "    fd.add_output(fd.ops.neg(T0))\n",
                      "inputs": [{"shape": [8], "dtype": "float32"}],
                      "options": {"segmenter": "greedy"}}).encode()
    store = PlanStore(settings.cache_location)
    made = plan_body(raw, settings, True)
    assert made.cache == "miss"
    store.put_bytes(made.plan_id, made.fusion_id, made.segmenter, made.body, made.request,
                    made.request_key)
    assert plan_body(raw, settings, True).cache == "hit"  # the same version: served
    old_key = request_key(raw)

    monkeypatch.setattr(plan_module, "VERSION", "99.0")
    again = plan_body(raw, settings, True)
    assert again.cache == "miss" and again.plan_id != made.plan_id
    assert again.request_key != made.request_key and request_key(raw) != old_key
    store.close()

    # the default cache: one per version and checkout
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    here = Path(Settings().db_path)
    assert here.parent.parent == tmp_path / "data" / "fusecut"
    assert here.parent.name.startswith(f"{fusecut.__version__}-")
    monkeypatch.setattr(fusecut.version, "__version__", "99.0")  # declared there, once
    assert Path(Settings().db_path).parent.name.startswith("99.0-")
    monkeypatch.setattr(fusecut.version, "__version__", here.parent.name.split("-")[0])
    monkeypatch.setattr(environment, "__file__", "/elsewhere/fusecut/environment.py")
    assert Settings().db_path != str(here)
