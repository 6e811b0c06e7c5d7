"""Load on a running fusecut service: requests per second and latency percentiles.

    python -m benchmarks.load                       # starts a server pinned to 2 cores
    python -m benchmarks.load --url http://host:8000 --duration 20

Scenarios (each on loopback, from asyncio httpx clients in this process):
- cached plans at a fixed arrival rate (open loop, default 200/s): latency counts from the
  moment a request was due, so a stalled server cannot hide its queue;
- cached plans, closed loop: the most requests per second the server answers;
- uncached plans: a new fusion every request (the planner runs each time);
- small executes: 64x64 tensors as safetensors through the worker.
"""

from __future__ import annotations

import argparse
import asyncio
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

from benchmarks.common import CORPUS, cpu_name, markdown_table, write_result
from benchmarks.fusiongen import generate
from runtime.tensor_wire import dump_safetensors

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    name: str
    latencies: list[float]
    errors: int
    seconds: float

    def row(self) -> list[str]:
        lat = sorted(self.latencies) or [float("nan")]

        def pct(p: float) -> str:
            return f"{lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3:.2f}"

        return [self.name, str(len(self.latencies)), str(self.errors),
                f"{len(self.latencies) / self.seconds:.0f}", pct(0.50), pct(0.95), pct(0.99),
                f"{statistics.fmean(lat) * 1e3:.2f}"]


HEADERS = ["scenario", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms", "mean ms"]


async def open_loop(name: str, client: httpx.AsyncClient, make, rate: float,
                    duration: float) -> Outcome:
    """Send make(i) at ``rate`` per second; latency from when each request was due."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()

    async def one(i: int, due: float) -> None:
        nonlocal errors
        method, url, kwargs = make(i)
        response = await client.request(method, url, **kwargs)
        if response.status_code != 200:
            errors += 1
        latencies.append(time.perf_counter() - due)

    tasks = []
    n = int(rate * duration)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return Outcome(name, latencies, errors, time.perf_counter() - start)


async def closed_loop(name: str, client: httpx.AsyncClient, make, concurrency: int,
                      duration: float) -> Outcome:
    """``concurrency`` clients, each sending its next request when the last one returns."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(10**9))
    end = time.perf_counter() + duration

    async def user() -> None:
        nonlocal errors
        while time.perf_counter() < end:
            method, url, kwargs = make(next(counter))
            t = time.perf_counter()
            response = await client.request(method, url, **kwargs)
            latencies.append(time.perf_counter() - t)
            if response.status_code != 200:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return Outcome(name, latencies, errors, time.perf_counter() - start)


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
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        cached = plan_bodies()
        for body in cached:  # warm the cache
            (await client.post("/v1/plan", content=body,
                               headers={"content-type": "application/json"})).raise_for_status()
        headers = {"content-type": "application/json"}

        def cached_plan(i):
            return "POST", "/v1/plan", {"content": cached[i % len(cached)], "headers": headers}

        seed0 = int(time.time())  # new fusions on every run, so nothing is cached

        def uncached_plan(i):  # a repro text with its inputs list
            return "POST", "/v1/plan", {"json": {"definition": generate(12, seed0 * 1000 + i)}}

        small = execute_request()
        (await client.post("/v1/execute", **small)).raise_for_status()

        def small_execute(i):
            return "POST", "/v1/execute", small

        return [
            await open_loop(f"cached plan, {rate:.0f}/s open loop", client, cached_plan, rate,
                            duration),
            await closed_loop(f"cached plan, {concurrency} clients", client, cached_plan,
                              concurrency, duration),
            await closed_loop("uncached plan (12-op fusion), 4 clients", client, uncached_plan,
                              4, duration),
            await closed_loop("execute 64x64 softmax, 4 clients", client, small_execute, 4,
                              duration),
        ]


def start_server(cores: int) -> tuple[subprocess.Popen, str]:
    from tests.server import free_port

    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "clients")]),
               FUSECUT_DB_PATH=str(Path(tempfile.mkdtemp()) / "plans.sqlite"))
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = set(cpus[-cores:]) if cores else set(cpus)
    proc = subprocess.Popen([sys.executable, "-m", "fusecut.cli", "serve", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=ROOT,
                            preexec_fn=lambda: os.sched_setaffinity(0, server_cpus))
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        raise SystemExit("the server did not start")
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
    notes = (f"Loopback; {where}; {args.duration:.0f} s per scenario; one uvicorn worker "
             f"process. Latency of the open-loop scenario counts from when each request was "
             f"due. Run: `python -m benchmarks.load`.")
    print(notes)
    if not args.no_write:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
        print(write_result("load", device, "fusecut service under load", table, notes))


if __name__ == "__main__":
    main()
