"""Load on a running fusecut service: requests per second and latency percentiles.

    python -m benchmarks.load                       # starts a server pinned to 2 cores
    python -m benchmarks.load --url http://host:8000 --duration 20

Scenarios (each on loopback, from keep-alive connections driven by asyncio in this process):
- cached plans at a fixed arrival rate (open loop, default 200/s): latency counts from the
  moment a request was due, so a stalled server cannot hide its queue;
- cached plans, closed loop: the most requests per second the server answers;
- uncached plans: a new fusion every request (the planner runs each time);
- small executes: 64x64 tensors as safetensors through the worker, with the definition
  (multipart) and by plan id (an application/octet-stream body).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from benchmarks.common import (
    CORPUS,
    cpu_name,
    markdown_table,
    source_pythonpath,
    wait_ready,
    write_result,
)
from benchmarks.fusiongen import generate
from fusecut.wire.tensors import dump_safetensors

ROOT = Path(__file__).resolve().parent.parent


def percentile_ms(values: list[float], p: float) -> str:
    ordered = sorted(values) or [float("nan")]
    return f"{ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3:.2f}"


def server_seconds(timing: str) -> float:
    """The server's own time for a request, from its ``Server-Timing: app;dur=MS`` header."""
    for part in timing.split(";"):
        if part.strip().startswith("dur="):
            return float(part.strip()[4:]) / 1e3
    return float("nan")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class Connections:
    """Keep-alive HTTP/1.1 connections to one server, and nothing more: httpx spends about a
    millisecond of CPU per request, several times what the server spends on a cached plan, and
    the figures are to be the server's. Requests are encoded once, by httpx, ahead of time."""

    def __init__(self, url: str):
        self.url = url
        self.host, port = httpx.URL(url).host, httpx.URL(url).port
        self.port = port or 80
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def encode(self, method: str, path: str, **kwargs) -> bytes:
        request = httpx.Request(method, self.url + path, **kwargs)
        body = request.read()
        head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in request.headers.items())]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    async def send(self, raw: bytes) -> Reply:
        if self.idle:
            connection = self.idle.pop()
            try:
                return await self.exchange(connection, raw)
            except (asyncio.IncompleteReadError, ConnectionError):
                connection[1].close()  # the server closed it while idle (keep-alive timeout)
        return await self.exchange(await asyncio.open_connection(self.host, self.port), raw)

    async def exchange(self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                       raw: bytes) -> Reply:
        reader, writer = connection
        writer.write(raw)
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, value = line.split(":", 1)
                headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
        self.idle.append(connection)
        return Reply(int(lines[0].split()[1]), headers, body)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


@dataclass
class Outcome:
    name: str
    latencies: list[float]
    server: list[float]  # the server's share of each latency
    errors: int
    seconds: float
    late: list[float]  # open loop: how late this generator sent each request


    def row(self) -> list[str]:
        lat = self.latencies
        return [self.name, str(len(lat)), str(self.errors), f"{len(lat) / self.seconds:.0f}",
                percentile_ms(lat, 0.50), percentile_ms(lat, 0.95), percentile_ms(lat, 0.99),
                f"{statistics.fmean(lat or [float('nan')]) * 1e3:.2f}",
                percentile_ms(self.server, 0.50), percentile_ms(self.server, 0.99),
                percentile_ms(self.late, 0.99) if self.late else "-"]


HEADERS = ["scenario", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms", "mean ms",
           "server p50 ms", "server p99 ms", "sent late p99 ms"]


async def open_loop(name: str, client: Connections, make, rate: float,
                    duration: float) -> Outcome:
    """Send make(i) at ``rate`` per second; latency from when each request was due."""
    latencies: list[float] = []
    server: list[float] = []
    late: list[float] = []
    errors = 0
    start = time.perf_counter()

    async def one(i: int, due: float) -> None:
        nonlocal errors
        raw = make(i)
        late.append(time.perf_counter() - due)
        reply = await client.send(raw)
        if reply.status != 200:
            errors += 1
        latencies.append(time.perf_counter() - due)
        server.append(server_seconds(reply.headers.get("server-timing", "")))

    tasks = []
    n = int(rate * duration)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return Outcome(name, latencies, server, errors, time.perf_counter() - start, late)


async def closed_loop(name: str, client: Connections, make, concurrency: int,
                      duration: float) -> Outcome:
    """``concurrency`` clients, each sending its next request when the last one returns."""
    latencies: list[float] = []
    server: list[float] = []
    errors = 0
    counter = iter(range(10**9))
    end = time.perf_counter() + duration

    async def user() -> None:
        nonlocal errors
        while time.perf_counter() < end:
            raw = make(next(counter))
            t = time.perf_counter()
            reply = await client.send(raw)
            latencies.append(time.perf_counter() - t)
            server.append(server_seconds(reply.headers.get("server-timing", "")))
            if reply.status != 200:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return Outcome(name, latencies, server, errors, time.perf_counter() - start, [])


def plan_bodies() -> list[bytes]:
    """Distinct cached-plan requests: the corpus repros (each carries its inputs list)."""
    return [json.dumps({"definition": p.read_text()}).encode()
            for p in sorted(CORPUS.glob("*.py")) if "inputs = [" in p.read_text()]


def execute_request() -> dict:
    text = (CORPUS / "softmax_fwd.py").read_text()
    x = torch.randn(64, 64).bfloat16()
    return {"files": {"tensors": ("t.safetensors", dump_safetensors({"T0": x}))},
            "data": {"definition": text}}


async def run(url: str, duration: float, rate: float, concurrency: int) -> list[Outcome]:
    client = Connections(url)
    headers = {"content-type": "application/json"}
    cached = [client.encode("POST", "/v1/plan", content=body, headers=headers)
              for body in plan_bodies()]
    small_request = execute_request()
    small = client.encode("POST", "/v1/execute", **small_request)
    for raw in [*cached, small]:  # warm the plan cache and the kernel cache
        reply = await client.send(raw)
        if reply.status != 200:
            raise SystemExit(f"warm-up request failed: {reply.status} {reply.body[:300]!r}")
    by_id = client.encode("POST", "/v1/execute", content=small_request["files"]["tensors"][1],
                          headers={"content-type": "application/octet-stream",
                                   "x-fusecut-plan-id": reply.headers["x-fusecut-plan-id"]})
    seed0 = int(time.time())  # new fusions on every run, so nothing is cached

    def cached_plan(i: int) -> bytes:
        return cached[i % len(cached)]

    def uncached_plan(i: int) -> bytes:  # a repro text with its inputs list
        return client.encode("POST", "/v1/plan",
                             json={"definition": generate(12, seed0 * 1000 + i)})

    def small_execute(i: int) -> bytes:
        return small

    try:
        scenarios = [
            lambda: open_loop(f"cached plan, {rate:.0f}/s open loop", client, cached_plan, rate,
                              duration),
            lambda: closed_loop(f"cached plan, {concurrency} clients", client, cached_plan,
                                concurrency, duration),
            lambda: closed_loop("uncached plan (12-op fusion), 4 clients", client,
                                uncached_plan, 4, duration),
            lambda: closed_loop("execute 64x64 softmax, 4 clients", client, small_execute, 4,
                                duration),
            lambda: closed_loop("execute by plan id (safetensors body), 4 clients", client,
                                lambda i: by_id, 4, duration),
        ]
        # Unmeasured lead-in at the open-loop rate: connections open and code paths warm first.
        await open_loop("lead-in", client, cached_plan, rate, min(2.0, duration))
        outcomes = []
        for scenario in scenarios:
            gc.collect()  # between scenarios, not during one
            outcomes.append(await scenario())
    finally:
        await client.close()
    return outcomes


def start_server(cores: int) -> tuple[subprocess.Popen, str]:
    from tests.server import free_port

    port = free_port()
    env = dict(os.environ, PYTHONPATH=source_pythonpath(os.environ.get("PYTHONPATH", "")),
               FUSECUT_DB_PATH=str(Path(tempfile.mkdtemp()) / "plans.sqlite"))
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = set(cpus[-cores:]) if cores else set(cpus)
    proc = subprocess.Popen([sys.executable, "-m", "fusecut.cli", "serve", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=ROOT,
                            preexec_fn=lambda: os.sched_setaffinity(0, server_cpus))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    rest = set(cpus) - server_cpus
    if rest:  # keep the load generator off the server's cores where there are others
        os.sched_setaffinity(0, rest)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running service (default: start one here)")
    parser.add_argument("--cores", type=int, default=2, help="cores to pin a started server to")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.cores)
    try:
        # The generator's own collector pauses would count as server latency: keep the
        # setup's objects out of it and collect between scenarios only.
        gc.collect()
        gc.freeze()
        gc.disable()
        outcomes = asyncio.run(run(url, args.duration, args.rate, args.concurrency))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
    table = markdown_table(HEADERS, [o.row() for o in outcomes])
    print(table)
    total = os.cpu_count()
    where = (f"server pinned to {args.cores} of {total} cores, load generator on the others"
             if args.url is None and args.cores < total else
             f"server and load generator sharing {total} cores" if args.url is None else
             f"server at {url}")
    notes = (f"Loopback; {where}; {args.duration:.0f} s per scenario after a 2 s lead-in; one "
             f"uvicorn worker process and its GPU worker. Clients are keep-alive HTTP/1.1 "
             f"connections. Open-loop latency counts from when each request was due ('sent "
             f"late' is the generator's own delay, included); 'server' columns are the app's "
             f"Server-Timing. Run: `python -m benchmarks.load --duration {args.duration:g}`.")
    print(notes)
    if not args.no_write:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
        print(write_result("load", device, "fusecut service under load", table, notes))


if __name__ == "__main__":
    main()
