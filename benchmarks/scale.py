"""Scaling out: one replica with SQLite, one and two replicas sharing PostgreSQL.

    python -m benchmarks.scale                  # starts PostgreSQL (Debian's) and the servers
    python -m benchmarks.scale --duration 5 --no-write

Each replica is a ``fusecut serve`` pinned to a core of its own (two replicas: both cores of a
2-core machine); requests go round-robin over the replicas, from keep-alive connections driven
by asyncio (benchmarks.load). Per configuration:
- uncached plans per second: a new 12-op fusion every request, 4 clients per replica;
- cached p50/p99 at a fixed arrival rate (open loop, default 200/s) with the in-memory layer off
  (``FUSECUT_CACHE_MEMORY_ITEMS=0``), so every hit is read from the database: the cache's own
  latency;
- hits across replicas: plans made on one replica, asked of the next.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import (
    cpu_name,
    markdown_table,
    source_pythonpath,
    wait_ready,
    write_result,
)
from benchmarks.fusiongen import generate
from benchmarks.load import Connections, Outcome, closed_loop, open_loop, percentile_ms
from tests.server import free_port

ROOT = Path(__file__).resolve().parent.parent


class RoundRobin:
    """Connections to several replicas; request i goes to replica i mod n."""

    def __init__(self, urls: list[str]):
        self.replicas = [Connections(u) for u in urls]
        self.sent = 0

    def encode(self, method: str, path: str, **kwargs) -> bytes:
        return self.replicas[0].encode(method, path, **kwargs)  # the Host header is unused

    async def send(self, raw: bytes, replica: int | None = None):
        if replica is None:
            replica, self.sent = self.sent % len(self.replicas), self.sent + 1
        return await self.replicas[replica].send(raw)

    async def close(self) -> None:
        for c in self.replicas:
            await c.close()


def start_replicas(n: int, cache: str, memory_items: int) -> list[tuple[subprocess.Popen, str]]:
    cpus = sorted(os.sched_getaffinity(0))
    servers = []
    for i in range(n):
        port = free_port()
        env = dict(os.environ, PYTHONPATH=source_pythonpath(os.environ.get("PYTHONPATH", "")),
                   FUSECUT_CACHE_URL=cache, FUSECUT_CACHE_MEMORY_ITEMS=str(memory_items),
                   FUSECUT_DEFAULT_TIME_LIMIT_S="2", FUSECUT_WORKER="0")
        core = {cpus[i % len(cpus)]}
        proc = subprocess.Popen([sys.executable, "-m", "fusecut.cli", "serve", "--port",
                                 str(port), "--log-level", "warning"], env=env, cwd=ROOT,
                                preexec_fn=lambda core=core: os.sched_setaffinity(0, core))
        servers.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in servers:
        wait_ready(url, proc)
    return servers


@dataclass
class Result:
    name: str
    uncached: Outcome
    cached: Outcome
    cross_hits: int
    cross_asked: int

    def row(self) -> list[str]:
        u, c = self.uncached, self.cached
        return [self.name, f"{len(u.latencies) / u.seconds:.1f}", str(u.errors),
                percentile_ms(c.latencies, 0.50), percentile_ms(c.latencies, 0.99),
                percentile_ms(c.server, 0.99), f"{len(c.latencies) / c.seconds:.0f}",
                str(c.errors), f"{self.cross_hits}/{self.cross_asked}" if self.cross_asked
                else "-"]


HEADERS = ["configuration", "uncached plans/s", "errors", "cached p50 ms", "cached p99 ms",
           "cached server p99 ms", "cached req/s", "errors", "hits across replicas"]


async def measure(name: str, urls: list[str], duration: float, rate: float) -> Result:
    client = RoundRobin(urls)
    seed0 = int(time.time() * 1000) % 10**9 * 1000 + len(urls) * 10**7
    # encoded ahead: making fusion texts in the timed window took the replicas' cores
    fresh = iter([client.encode("POST", "/v1/plan", json={"definition": generate(12, seed0 + i)})
                  for i in range(int(150 * len(urls) * (duration + 3)))])
    made: list[tuple[int, bytes]] = []  # (replica, request) of every uncached plan

    def uncached(i: int) -> bytes:
        made.append((client.sent % len(urls), next(fresh)))  # the replica send() picks next
        return made[-1][1]

    try:  # the warm-up at the measured concurrency starts every planner process first
        await closed_loop("warm-up", client, uncached, 4 * len(urls), min(3.0, duration))
        made.clear()
        gc.collect()
        planned = await closed_loop("uncached", client, uncached, 4 * len(urls), duration)
        cached_requests = [raw for _, raw in made[:200]]
        for raw in cached_requests:  # each is stored: now hits
            await client.send(raw)
        gc.collect()
        hits = await open_loop("cached", client,
                               lambda i: cached_requests[i % len(cached_requests)], rate,
                               duration)
        cross = asked = 0
        if len(urls) > 1:
            fresh = [(r, raw) for r, raw in made[200:400]] or made[:200]
            for replica, raw in fresh:  # asked of a replica that did not make it
                reply = await client.send(raw, (replica + 1) % len(urls))
                asked += 1
                cross += reply.headers.get("x-fusecut-cache") == "hit"
    finally:
        await client.close()
    return Result(name, planned, hits, cross, asked)


def run_configuration(name: str, n: int, cache: str, duration: float, rate: float) -> Result:
    servers = start_replicas(n, cache, memory_items=0)
    try:
        return asyncio.run(measure(name, [url for _, url in servers], duration, rate))
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--rate", type=float, default=200.0, help="cached requests/s")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    from tests.postgres import Postgres, binaries

    where = binaries()
    if where is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    postgres = Postgres(where).start()
    load = []
    results = []
    try:
        gc.collect()
        gc.freeze()
        for name, n, cache in [
                ("1 replica, SQLite", 1, str(Path(tempfile.mkdtemp()) / "plans.sqlite")),
                ("1 replica, PostgreSQL", 1, postgres.create_database("scale1")),
                ("2 replicas, PostgreSQL", 2, postgres.create_database("scale2"))]:
            load.append(os.getloadavg()[0])
            results.append(run_configuration(name, n, cache, args.duration, args.rate))
            print(markdown_table(HEADERS, [results[-1].row()]).splitlines()[-1], flush=True)
    finally:
        postgres.close()
    one = len(results[1].uncached.latencies) / results[1].uncached.seconds
    two = len(results[2].uncached.latencies) / results[2].uncached.seconds
    table = markdown_table(HEADERS, [r.row() for r in results])
    mean_load = statistics.fmean(load)
    notes = (f"{os.cpu_count()} cores; each replica pinned to one core (two replicas: one "
             f"each), executions off (planning only); PostgreSQL {where.parent.name} on the "
             f"same machine (loopback). Uncached: a new 12-op fusion per request, 4 "
             f"keep-alive clients per replica, {args.duration:g} s. Cached: {args.rate:g} "
             f"req/s open loop for {args.duration:g} s over 200 stored plans, with the "
             f"in-memory layer off so that each hit reads the database (latency counted from "
             f"when each request was due). 2 replicas / 1 replica, uncached (PostgreSQL): "
             f"{two / one:.2f}x. Load average when each configuration started: "
             f"{', '.join(f'{x:.1f}' for x in load)} (mean {mean_load:.1f}; other work on "
             f"the machine counts against these figures). Run: `python -m benchmarks.scale "
             f"--duration {args.duration:g}`.")
    print(table)
    print(notes)
    if not args.no_write:
        print(write_result("scale", cpu_name(), "fusecut scaled out: replicas sharing a plan "
                           "cache", table, notes))


if __name__ == "__main__":
    main()
