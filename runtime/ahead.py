"""Compile ahead: a plan's kernels generated and compiled by background threads.

A whole model's first step runs fusecut's regions one after another, and each region compiles
its kernels with NVRTC just before its first launch: on an H100 host, 1.5-4.6 s of nanoGPT's
first step, with fifteen idle cores beside it. A caller that knows a region long before it runs
(Thunder's fusion pass, seconds before the step) hands the region's plan here. Worker threads
generate each segment's code and compile it while the caller goes on; NVRTC releases the GIL,
so the compiles run in parallel with each other and with the caller's Python.

The cubins land in ``compile``'s caches. The region's first launch finds them there, or waits
for the compile in flight (``compile_cubin`` is single-flight). Nothing here decides what runs:
a plan made for metadata that turns out wrong only costs background work, and a job that fails
is dropped (the foreground meets the same failure and reports it, or falls back).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from fusecut import environment
from fusecut.codegen import generate_segment
from fusecut.optimizer.plan.plan import Plan
from fusecut.runtime.compile import compile_cubin, prepare
from fusecut.runtime.kernels import NOT_GENERATED

log = logging.getLogger("fusecut.runtime")

ENV = "FUSECUT_COMPILE_AHEAD"  # false (0, false, no, off) turns compiling ahead off

_jobs: queue.Queue[Callable[[], None]] = queue.Queue()
_workers: list[threading.Thread] = []
_start_lock = threading.Lock()


def enabled() -> bool:
    return environment.flag(ENV)


def worker_count() -> int:
    """One core is the caller's; at most 8 compile (NVRTC takes 0.1-0.2 s a kernel)."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def submit(job: Callable[[], None]) -> None:
    """Run ``job`` on a background worker (daemon threads: an exit never waits for them)."""
    with _start_lock:
        if not _workers:
            try:  # cuda-python imported here, before any worker imports it beside this thread
                prepare()
            except Exception as e:  # a CPU install: the jobs' compiles will say so
                log.debug("fusecut: compile ahead without cuda-python: %s", e)
        while len(_workers) < worker_count():
            worker = threading.Thread(target=_work, name=f"fusecut-ahead-{len(_workers)}",
                                      daemon=True)
            worker.start()
            _workers.append(worker)
    _jobs.put(job)


def wait() -> None:
    """Until every job submitted so far is done (for tests and benchmarks)."""
    _jobs.join()


def compile_plan(plan: Plan, arch: str) -> None:
    """Generate and compile ``plan``'s kernels for ``arch`` (its vectorised code: what a launch
    with aligned arguments takes) into the cubin caches. Runs on the calling thread."""
    if plan.host is not None:  # a host program compiles its segments as they first run
        return
    for segment in plan.segments:
        if segment.kind in NOT_GENERATED:
            continue
        kernels = generate_segment(plan, segment, None)
        if kernels.kernels:
            compile_cubin(kernels.source, arch, kernels.kernels[0].name)


def _work() -> None:
    while True:
        job = _jobs.get()
        try:
            job()
        except Exception as e:  # a guess that failed: the foreground will say why, if it matters
            log.debug("fusecut: a compile-ahead job failed: %s", e)
        finally:
            _jobs.task_done()
