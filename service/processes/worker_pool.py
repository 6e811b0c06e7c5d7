"""One worker process per GPU, and the routing of executions among them.

``fusecut serve --gpus all|0,1,...`` starts a worker per listed device, each pinned to its GPU
with ``CUDA_VISIBLE_DEVICES`` (so each holds its own CUDA context and its own loaded kernels;
the disk cache of compiled kernels is keyed by architecture and shared); ``per_device`` workers
each (two overlap one execution's host work with another's kernels). An execution goes to the
ready worker with the fewest executions running or waiting, among those the one that holds its
plan; each worker runs one at a time. How many executions may run or wait is the service's
admission gate's business (service.admission), not this pool's.

A worker that dies is skipped and restarted while the others keep serving. Without ``--gpus``
the workers see whatever devices the service does.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from fusecut.service.processes.results import (
    ExecutionFailure,
    ExecutionResult,
    FailureKind,
    Outcome,
)
from fusecut.service.processes.worker import Job, SourceOf, Worker


@dataclass
class Slot:
    """A worker and what is routed to it."""

    name: str  # the device as listed ("0", "1"; "0/2" for a second worker on 0), or "default"
    # ("default/2")
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


def parse_gpus(spec: str | None, count: int | None = None, visible: str | None = None,
               name: str = "--gpus") -> list[str] | None:
    """The devices of ``--gpus``: None for the default single worker; ``all`` for every
    device (``count`` of them, as torch sees); ``0,1,...`` for those (a device may be listed
    twice: two workers on one GPU). Indices are of the devices this process sees, so under
    ``CUDA_VISIBLE_DEVICES=2,3``, ``0`` is GPU 2. Raises ValueError naming a bad entry and
    where the spec came from (``name``: the option, or FUSECUT_GPUS)."""
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
            raise ValueError(f"{name} takes 'all' or device indices like 0,1; got {entry!r}")
        index = int(entry)
        if listed is not None:
            if index >= len(listed):
                raise ValueError(f"{name} {entry}: only {len(listed)} devices are visible "
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

    def __init__(self, devices: list[str] | None, process: bool = True, per_device: int = 1,
                 start_timeout: float = 120.0):
        listed = [d for d in (devices or ["default"]) for _ in range(max(1, per_device))]
        pinned = process and devices is not None
        self.slots = [Slot(name, Worker(process=process, start_timeout=start_timeout,
                                        env={"CUDA_VISIBLE_DEVICES": d} if pinned else None))
                      for name, d in zip(slot_names(listed), listed)]
        self._lock = threading.Lock()
        self._next = 0  # where the search for the least loaded starts: ties go round

    def __len__(self) -> int:
        """How many executions run at once."""
        return len(self.slots)

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
        """The device the running workers name (one GPU model, "cpu"); else each worker's."""
        running = {s.worker.device for s in self.slots if s.worker.ready}
        if len(running) == 1:
            return running.pop()
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

    def _choose(self, plan_id: str) -> Slot:
        """The ready worker with the fewest pending executions, one holding the plan among
        equals (restarting any that died idle); a starting one if none is ready. Counts the
        execution as pending there."""
        with self._lock:
            n = len(self.slots)
            order = [self.slots[(self._next + i) % n] for i in range(n)]
            for slot in order:  # died while idle (killed, out of memory): start it again
                w = slot.worker
                if w.process and w.settled and not w.ready and slot.pending == 0:
                    w.restart()
            ready = [s for s in order if s.worker.ready] or \
                [s for s in order if not s.worker.settled] or order
            slot = min(ready, key=lambda s: (s.pending, not s.worker.knows(plan_id)))
            slot.pending += 1
            self._next = (self.slots.index(slot) + 1) % n
            return slot

    async def execute(self, job: Job, source: SourceOf, timeout: float) -> Outcome:
        """``Worker.execute`` on the least-loaded worker: its answer, a result naming the slot
        that ran it (``device``)."""
        for _ in range(len(self.slots)):
            slot = self._choose(job.plan_id)
            try:
                if slot.turn is None:
                    slot.turn = asyncio.Lock()
                async with slot.turn:  # waiting here holds no thread
                    if not slot.worker.ready and any(s.worker.ready for s in self.slots):
                        continue  # it died while this waited: go to one that runs
                    start = time.perf_counter()
                    answer = await asyncio.to_thread(slot.worker.execute, job, source,
                                                     timeout)
                    spent = time.perf_counter() - start
                    break
            finally:
                with self._lock:
                    slot.pending -= 1
        else:
            return ExecutionFailure(FailureKind.WORKER_UNAVAILABLE,
                                    "no worker is running; they are restarting")
        with self._lock:
            slot.executions += 1
            slot.busy_s += spent
        if isinstance(answer, ExecutionResult):
            answer = replace(answer, device=slot.name)
        return answer
