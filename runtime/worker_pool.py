"""One worker process per GPU, and the routing of executions among them.

``fusecut serve --gpus all|0,1,...`` starts a worker per listed device, each pinned to its GPU
with ``CUDA_VISIBLE_DEVICES`` (so each holds its own CUDA context and its own loaded kernels;
the disk cache of compiled kernels is keyed by architecture and shared). An execution goes to
the ready worker with the fewest executions running or waiting; each worker runs one at a time.
Queues are bounded: when every worker has ``queue_limit`` executions, the next is refused at
once (``WorkersBusy``, with a time to retry after) rather than queued without end.

A worker that dies is skipped and restarted while the others keep serving. Without ``--gpus``
there is one worker, which sees whatever devices the service does (as before).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from runtime.worker import Worker, WorkerUnavailable

RECENT = 0.2  # weight of the newest execution in the running mean of execution times


class WorkersBusy(RuntimeError):
    """Every worker's queue is full."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Slot:
    """A worker and what is routed to it."""

    name: str  # the device as listed ("0", "1"; "0/2" for a second worker on 0), or "default"
    worker: Worker
    pending: int = 0  # executions running or waiting
    executions: int = 0
    turn: asyncio.Lock | None = None  # created on the service's event loop
    busy_s: float = 0.0  # device-worker time, summed

    def snapshot(self) -> dict[str, Any]:
        w = self.worker
        return {"device": self.name, "name": w.device, "up": w.ready, "pid": w.pid,
                "pending": self.pending, "executions": self.executions,
                "restarts": w.restarts, "busy_s": round(self.busy_s, 6)}


def parse_gpus(spec: str | None, count: int | None = None,
               visible: str | None = None) -> list[str] | None:
    """The devices of ``--gpus``: None for the default single worker; ``all`` for every
    device (``count`` of them, as torch sees); ``0,1,...`` for those (a device may be listed
    twice: two workers on one GPU). Indices are of the devices this process sees, so under
    ``CUDA_VISIBLE_DEVICES=2,3``, ``0`` is GPU 2. Raises ValueError naming a bad entry."""
    if spec is None or spec.strip() == "":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    listed = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    if spec.strip() == "all":
        if count is None:
            import torch

            count = torch.cuda.device_count()
        return (listed or [str(i) for i in range(count)])[:count] or None
    devices = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry.isdigit():
            raise ValueError(f"--gpus takes 'all' or device indices like 0,1; got {entry!r}")
        index = int(entry)
        if listed is not None:
            if index >= len(listed):
                raise ValueError(f"--gpus {entry}: only {len(listed)} devices are visible "
                                 f"(CUDA_VISIBLE_DEVICES={visible})")
            devices.append(listed[index])
        else:
            devices.append(str(index))
    return devices


def slot_names(devices: list[str]) -> list[str]:
    """A name per worker for metrics and /readyz: the device, and "0/2" for a second worker
    on device 0."""
    seen: dict[str, int] = {}
    names = []
    for d in devices:
        seen[d] = seen.get(d, 0) + 1
        names.append(d if seen[d] == 1 else f"{d}/{seen[d]}")
    return names


class WorkerPool:
    """Workers behind one ``execute``; the service's handle on its devices."""

    def __init__(self, devices: list[str] | None, process: bool = True, queue_limit: int = 16,
                 start_timeout: float = 120.0):
        if not process or devices is None:
            workers = [("default", Worker(process=process, start_timeout=start_timeout))]
        else:
            workers = [(name, Worker(process=True, start_timeout=start_timeout,
                                     env={"CUDA_VISIBLE_DEVICES": d}))
                       for name, d in zip(slot_names(devices), devices)]
        self.slots = [Slot(name, w) for name, w in workers]
        self.queue_limit = queue_limit
        self._lock = threading.Lock()
        self._next = 0  # where the search for the least loaded starts: ties go round
        self._mean_s = 0.0

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for slot in self.slots:
            slot.worker.start()

    def stop(self) -> None:
        for slot in self.slots:
            slot.worker.stop()

    @property
    def ready(self) -> bool:
        return any(s.worker.ready for s in self.slots)

    @property
    def device(self) -> str:
        if len(self.slots) == 1:
            return self.slots[0].worker.device
        return "; ".join(f"{s.name}: {s.worker.device}" for s in self.slots)

    @property
    def pid(self) -> int | None:
        return next((s.worker.pid for s in self.slots if s.worker.pid is not None), None)

    @property
    def restarts(self) -> int:
        return sum(s.worker.restarts for s in self.slots)

    def snapshot(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.slots]

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            slot.worker.wait_ready(max(0.0, deadline - time.monotonic()))
        return all(s.worker.ready for s in self.slots)

    # ---- routing -------------------------------------------------------------------------------

    def _choose(self) -> Slot:
        """The ready worker with the fewest pending executions (restarting any that died
        idle); a starting one if none is ready. Counts the execution as pending there."""
        with self._lock:
            n = len(self.slots)
            order = [self.slots[(self._next + i) % n] for i in range(n)]
            for slot in order:  # died while idle (killed, out of memory): start it again
                w = slot.worker
                if w.process and w.settled and not w.ready and slot.pending == 0:
                    w.restart()
            ready = [s for s in order if s.worker.ready] or \
                [s for s in order if not s.worker.settled] or order
            open_ = [s for s in ready if s.pending < self.queue_limit]
            if not open_:
                wait = max(1, math.ceil(self._mean_s * min(s.pending for s in ready)))
                raise WorkersBusy(f"all {len(ready)} worker(s) have {self.queue_limit} "
                                  f"executions running or waiting; retry in {wait} s",
                                  min(wait, 60))
            slot = min(open_, key=lambda s: s.pending)
            slot.pending += 1
            self._next = (self.slots.index(slot) + 1) % n
            return slot

    async def execute(self, *request: Any) -> dict[str, Any]:
        """``Worker.execute(*request)`` on the least-loaded worker: its response, with
        ``device`` (the slot's name) added. Raises WorkersBusy when the queues are full, and
        the worker's errors."""
        for _ in range(len(self.slots)):
            slot = self._choose()
            try:
                if slot.turn is None:
                    slot.turn = asyncio.Lock()
                async with slot.turn:  # waiting here holds no thread
                    if not slot.worker.ready and any(s.worker.ready for s in self.slots):
                        continue  # it died while this waited: go to one that runs
                    start = time.perf_counter()
                    response = await asyncio.to_thread(slot.worker.execute, *request)
                    spent = time.perf_counter() - start
                    break
            finally:
                with self._lock:
                    slot.pending -= 1
        else:
            raise WorkerUnavailable("no worker is running; they are restarting")
        with self._lock:
            slot.executions += 1
            slot.busy_s += spent
            self._mean_s += RECENT * (spent - self._mean_s) if self._mean_s else spent
        response["device"] = slot.name
        return response
