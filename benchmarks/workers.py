"""Workers per GPU: the time of one long execution against several submitted together.

    python -m benchmarks.workers --gpus 0,1        # on a 2-GPU machine: about 1x is the goal
    python -m benchmarks.workers --gpus 0,0        # two workers sharing one GPU

Starts ``fusecut serve --gpus SPEC``, plans a long pointwise chain over ``N x N`` uniform draws
plus one input element (so requests are tiny and the device does the work), executes it once
per worker to warm every worker, then times one execution alone and one per worker at once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from benchmarks.common import markdown_table, source_pythonpath, wait_ready, write_result
from fusecut.service.processes.worker_pool import parse_gpus
from fusecut.wire.tensors import dump_safetensors
from tests.server import free_port

ROOT = Path(__file__).resolve().parent.parent


def chain(n: int, ops: int) -> str:
    """A definition: ``n x n`` uniform draws plus one input element, ``ops`` alternating exp/sin,
    summed. The draws make every element differ, so the chain cannot be computed once on the
    element and broadcast: the device really does ``n * n * ops`` work."""
    lines = ["def fusion(fd):",
             "    T0 = fd.define_tensor(shape=[1, 1], contiguity=[True, True], "
             "dtype=DataType.Float)",
             f"    T1 = fd.ops.broadcast_in_dim(T0, shape=[{n}, {n}], broadcast_dims=[0, 1])",
             f"    U = fd.ops.uniform(0.0, 1.0, shape=[{n}, {n}], dtype=DataType.Float)",
             "    T2 = fd.ops.add(U, T1)"]
    for i in range(ops):
        lines.append(f"    T{i + 3} = fd.ops.{'sin' if i % 2 else 'exp'}(T{i + 2})")
    lines.append(f"    T{ops + 3} = fd.ops.sum(T{ops + 2}, dims=[1], keepdim=False)")
    lines.append(f"    fd.add_output(T{ops + 3})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="all", help="fusecut serve --gpus")
    parser.add_argument("--n", type=int, default=16384, help="the tensor's side")
    parser.add_argument("--ops", type=int, default=400, help="pointwise ops in the chain")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    workers = len(parse_gpus(args.gpus) or [None])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=source_pythonpath(os.environ.get("PYTHONPATH", "")),
               FUSECUT_DB_PATH=str(Path(tempfile.mkdtemp()) / "plans.sqlite"),
               FUSECUT_WORKERS_PER_DEVICE="1")  # a worker per listed device, as measured
    server = subprocess.Popen([sys.executable, "-m", "fusecut.cli", "serve", "--port", str(port),
                               "--gpus", args.gpus, "--log-level", "warning"], env=env, cwd=ROOT)
    try:
        wait_ready(url, server, timeout=300)
        body = dump_safetensors({"T0": torch.ones(1, 1)})
        definition = chain(args.n, args.ops)

        def execute() -> float:
            start = time.perf_counter()
            r = httpx.post(f"{url}/v1/execute", data={"definition": definition}, timeout=600,
                           files={"tensors": ("t.safetensors", body)})
            assert r.status_code == 200, r.text
            return time.perf_counter() - start

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda _: execute(), range(2 * workers)))  # plan, compile, warm all
            alone = [execute() for _ in range(args.repeats)]
            together = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                list(pool.map(lambda _: execute(), range(workers)))
                together.append(time.perf_counter() - start)
        state = httpx.get(f"{url}/readyz").json()
    finally:
        server.terminate()
        server.wait(30)
    one, many = statistics.median(alone), statistics.median(together)
    device = state["device"]
    table = markdown_table(
        ["workers (--gpus)", "device", "one execution s", f"{workers} together s", "ratio",
         "executions per worker"],
        [[f"{workers} ({args.gpus})", device, f"{one:.3f}", f"{many:.3f}", f"{many / one:.2f}",
          ", ".join(f"{w['device']}: {w['executions']}" for w in state["workers"])]])
    notes = (f"A {args.ops}-op pointwise chain over {args.n}x{args.n} fp32 uniform draws plus "
             f"one input element, then a row sum (request and response are small); median of "
             f"{args.repeats}. Run: `python -m benchmarks.workers --gpus {args.gpus}`.")
    print(table)
    print(notes)
    if not args.no_write:
        print(write_result("workers", device.split(";")[0].split(": ")[-1], "Workers per GPU",
                           table, notes))


if __name__ == "__main__":
    main()
