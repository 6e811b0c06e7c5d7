"""The GPU worker: a separate process that owns the CUDA context and runs executions.

The service sends it a plan and tensors over a pipe and waits, with a timeout; the worker
answers with a value of service.processes.results (a result, or a failure of a known kind). If a
kernel (or anything else) kills the process, the request in flight fails as ``WORKER_CRASHED``, a
new worker starts, and the service keeps serving. Without a GPU the worker runs the CPU path (the
torch reference). ``Worker(process=False)`` runs executions in the service's own process.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from fusecut.service.processes.children import become_child, reap, start_child
from fusecut.service.processes.results import (
    ExecutionFailure,
    ExecutionResult,
    FailureKind,
    Outcome,
    PlanNeeded,
    WorkerFailedToStart,
    WorkerStarted,
    refusal,
    unknown_plan,
)

PLANS_HELD = 64  # plans a worker keeps rebuilt, least recently used out first


def _describe_device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Job:
    """One execution: the plan (by id), the inputs by name (scalars as one-element tensors),
    the response's wire format ("json" or "safetensors": its outputs must fit it) and the
    limits on what the execution may make (see service.processes.limits)."""

    plan_id: str
    tensors: dict[str, Any]
    wire: str = "safetensors"
    max_output_bytes: int = 1 << 62
    max_tensor_bytes: int = 1 << 62


# How a worker gets a plan it does not hold: the JSON texts of the request that made it (its
# definition and input metadata) and of the plan, from which it rebuilds the plan without
# solving. Texts, not a Plan object: pickling a 20,000-op plan held the service's GIL for a
# second.
PlanSource = tuple[str, str]
# Where a worker gets them: called (in a worker's thread of the service) only when the worker
# does not hold the plan; None when no plan has the id.
SourceOf = Callable[[], PlanSource | None]


@dataclass(frozen=True)
class Request:
    """What the service sends the worker process: a job, and the plan's texts unless the
    worker was sent them before."""

    job: Job
    source: PlanSource | None


def held_plan(source: PlanSource) -> tuple[Held, Any]:
    """The plan ``source`` describes, from the process's engine when it holds it (planned by the
    SDK, a Thunder region or the CLI in this process, or restored before), else rebuilt from
    its JSON without solving and given to the engine, under the request's definition, input
    metadata and options (so that any door asking for the same plan is served it)."""
    from fusecut.engine import default_engine
    from fusecut.optimizer.ir.wire import fusion_from_json, meta_from_json
    from fusecut.optimizer.plan.restore import restore_plan

    request, data = json.loads(source[0]), json.loads(source[1])
    fusion = fusion_from_json(request["definition"])
    held = Held(default_engine().fusion(fusion),
                tuple(meta_from_json(m) for m in request["inputs"]), data["options"])
    plan = held.plan()
    if plan is None or plan.plan_id != data.get("plan_id"):
        plan = restore_plan(fusion, list(held.inputs), data)
        held.handle.adopt(list(held.inputs), plan, **held.options)
    return held, plan


@dataclass(frozen=True)
class Held:
    """Where a plan a worker runs lives: in the process's engine, under its definition's
    handle, input metadata and options."""

    handle: Any  # fusecut.engine.FusionHandle
    inputs: tuple
    options: dict[str, Any]

    def plan(self):
        """The plan, or None when the engine has let it go (the least recently used)."""
        return self.handle.cached_plan(list(self.inputs), **self.options)


def at_sizes_of(plan, args: list[Any]):
    """A plan asked for with symbolic extents (-1), bound to the sizes of ``args`` (its tensors
    rebound without a search: ``optimizer.plan.rebind.bind_symbolic``); an InputError where
    they break its pattern or its segments do not schedule there as planned."""
    import torch

    from fusecut.optimizer.errors import InputError
    from fusecut.optimizer.plan.rebind import bind_symbolic
    from fusecut.runtime.tensors import meta_of

    metas = [meta_of(a) if isinstance(a, torch.Tensor) else plan.bound.inputs[name]
             for name, a in zip(plan.fusion.caller_inputs(), args)]
    bound = bind_symbolic(plan, metas)
    if bound is None:
        raise InputError(f"plan {plan.plan_id} does not hold for these sizes: a segment "
                         f"schedules as another kind there; plan the definition for them")
    return bound


class _Runner:
    """Executes jobs; lives in the worker process (or in the service, inline)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.held: OrderedDict[str, Held] = OrderedDict()  # plan id -> where it is
        # (symbolic plan id, the tensors' sizes) -> that plan rebound to them: a shape run
        # again is not rebound again
        self.rebound: OrderedDict[tuple, Any] = OrderedDict()

    def at_sizes(self, plan_id: str, plan, args: list[Any]):
        """``at_sizes_of``, remembered for the PLANS_HELD shapes run last."""
        key = (plan_id, tuple((tuple(a.shape), tuple(a.stride()), a.dtype)
                              for a in args if isinstance(a, self.torch.Tensor)))
        found = self.rebound.get(key)
        if found is None:
            found = self.rebound[key] = at_sizes_of(plan, args)
            while len(self.rebound) > PLANS_HELD:
                self.rebound.popitem(last=False)
        self.rebound.move_to_end(key)
        return found

    def execute(self, job: Job, source: PlanSource | None) -> Outcome | PlanNeeded:
        import fusecut.runtime.compile as rc
        from fusecut.engine import default_engine
        from fusecut.optimizer.errors import FusecutError
        from fusecut.service.processes.limits import check_result_sizes
        from fusecut.wire.tensors import arguments, check_encodable, to_device

        try:
            held = self.held.get(job.plan_id)
            plan = held.plan() if held is not None else None  # None too when the engine let
            if plan is None:  # it go
                if source is None:
                    return PlanNeeded(job.plan_id)
                self.held[job.plan_id], plan = held_plan(source)
                while len(self.held) > PLANS_HELD:
                    self.held.popitem(last=False)
            self.held.move_to_end(job.plan_id)
            args = arguments(plan.fusion, job.tensors)
            if plan.symbolic:  # asked for with -1 extents: bound to these tensors' sizes
                plan = self.at_sizes(job.plan_id, plan, args)
            check_encodable(plan.fusion, job.wire)
            check_result_sizes(plan, job.max_output_bytes, job.max_tensor_bytes)
            args = [to_device(v, self.device) if isinstance(v, self.torch.Tensor) else v
                    for v in args]
            stats = rc.STATS
            before = (stats.compiles, stats.seconds, stats.memory_hits + stats.disk_hits)
            result = default_engine().run(plan, args, timed=True)
            outputs = [(name, t.cpu()) for name, t in zip(plan.fusion.outputs, result.outputs)]
        except FusecutError as e:
            return refusal(e)
        return ExecutionResult(job.plan_id, outputs, result.backend,
                               [asdict(t) for t in result.timings],
                               compiles=rc.STATS.compiles - before[0],
                               compile_seconds=rc.STATS.seconds - before[1],
                               cache_hits=rc.STATS.memory_hits + rc.STATS.disk_hits - before[2])


# Plain pickle, not multiprocessing's (which would share tensors through fds). Every CPU tensor
# travels as its bytes, out of band: pickling its storage copies it while holding the GIL (90 ms
# per 100 MB, a stall of the service's event loop), while its bytes are written to and read from
# the pipe a chunk at a time, and copied into a tensor by torch, which lets other threads run.
# Small tensors too: torch cannot unpickle its own uint16/32/64 and float8 tensors ("type object
# 'UntypedStorage' has no attribute 'dtype'"), which killed the worker on a 4-byte input.


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor or obj.device.type != "cpu" \
                or obj.requires_grad:
            return NotImplemented
        # by its module's name: this module is __main__ in the worker process
        from fusecut.wire.safetensors import tensor_from_bytes

        # stride-0 (expanded) axes travel as one entry and are expanded again on arrival
        core = obj
        for axis in range(obj.dim()):
            if obj.stride(axis) == 0 and obj.shape[axis] > 1:
                core = core.narrow(axis, 0, 1)
        flat = core.contiguous().reshape(-1)
        if flat.numel() and flat.stride(0) != 1:  # one element with stride 0 is "contiguous"
            flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
        raw = pickle.PickleBuffer(flat.view(torch.uint8).numpy())
        return tensor_from_bytes, (raw, obj.dtype, tuple(core.shape), tuple(obj.shape))


def _send(conn: Connection, message: Any) -> None:
    buffers: list[pickle.PickleBuffer] = []
    head = io.BytesIO()
    _Pickler(head, protocol=5, buffer_callback=buffers.append).dump(message)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + head.getbuffer())
    for raw in buffers:
        conn.send_bytes(raw.raw())


def _recv(conn: Connection) -> Any:
    head = conn.recv_bytes()
    buffers = [conn.recv_bytes() for _ in range(int.from_bytes(head[:4], "little"))]
    return pickle.loads(memoryview(head)[4:], buffers=buffers)


def _main(conn: Connection) -> None:  # the worker process
    try:
        runner = _Runner()
        _send(conn, WorkerStarted(_describe_device()))
    except Exception as e:  # report, then exit: the service restarts us
        _send(conn, WorkerFailedToStart(repr(e)))
        return
    while True:
        try:
            request: Request = _recv(conn)
        except (EOFError, OSError):
            return
        except Exception as e:  # a message this process cannot decode: say so, keep serving
            _send(conn, ExecutionFailure(FailureKind.INTERNAL,
                                         f"the worker could not decode the request: {e!r}"))
            continue
        try:
            answer = runner.execute(request.job, request.source)
        except Exception as e:  # a bug in fusecut: report it, keep serving
            answer = ExecutionFailure(FailureKind.INTERNAL, repr(e))
        _send(conn, answer)


class Worker:
    """The service's handle on the worker process: start, restart, run one request at a time."""

    def __init__(self, process: bool = True, start_timeout: float = 120.0,
                 env: dict[str, str] | None = None):
        self.process = process
        self.start_timeout = start_timeout
        self.env = env or {}  # for the worker process: CUDA_VISIBLE_DEVICES pins it to a GPU
        self.restarts = 0
        self.device = "starting"
        self._lock = threading.Lock()  # one request at a time through the socket
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._inline: _Runner | None = None
        # plan ids the current worker holds, in the order it used them: its runner keeps the
        # PLANS_HELD it used last, and so does this (it was never pruned)
        self._known: OrderedDict[str, None] = OrderedDict()
        self._settled = threading.Event()  # set once a start has succeeded or failed

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker in the background; ``ready`` says when it takes requests."""
        self._settled.clear()
        self.device = "starting"
        threading.Thread(target=self._start, daemon=True, name="fusecut-worker-start").start()

    def _start(self) -> None:
        try:
            if self.process:
                self._spawn()
            else:
                self._inline = _Runner()
                self.device = _describe_device()
        finally:
            self._settled.set()

    def _spawn(self) -> None:
        proc, conn = start_child("fusecut.service.processes.worker", self.env)
        hello: WorkerStarted | WorkerFailedToStart = WorkerFailedToStart("no answer")
        if conn.poll(self.start_timeout):
            try:
                hello = _recv(conn)
            except (EOFError, OSError):
                hello = WorkerFailedToStart(f"exited with code {proc.wait()}")
        if not isinstance(hello, WorkerStarted):
            reap(proc, conn)
            self.device = f"failed to start: {hello.error}"
            return
        self._proc, self._conn, self._known = proc, conn, OrderedDict()
        self.device = hello.device

    def wait_ready(self, timeout: float) -> bool:
        self._settled.wait(timeout)
        return self.ready

    @property
    def ready(self) -> bool:
        if not self.process:
            return self._inline is not None
        return self._proc is not None and self._proc.poll() is None

    @property
    def settled(self) -> bool:
        """False while a start is under way."""
        return self._settled.is_set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        self._kill()

    def _kill(self) -> None:
        if self._proc is not None:
            reap(self._proc, self._conn)
        self._proc = self._conn = None

    # ---- requests -----------------------------------------------------------------------------

    def execute(self, job: Job, source: SourceOf, timeout: float) -> Outcome:
        """Run ``job``: its result, or why it failed. ``source`` gives the plan when this worker
        does not hold it."""
        with self._lock:
            if not self.wait_ready(self.start_timeout):
                if self._settled.is_set():  # it failed to start, or died idle: try again
                    self.restart()
                return ExecutionFailure(FailureKind.WORKER_UNAVAILABLE,
                                        f"the worker is not running ({self.device})")
            # inline, the runner is asked first: it keeps the plans it was given
            known = not self.process or job.plan_id in self._known
            answer = self._call(job, None, timeout) if known else PlanNeeded(job.plan_id)
            if isinstance(answer, PlanNeeded):  # never sent, or the worker forgot it
                texts = source()
                if texts is None:
                    return unknown_plan(job.plan_id)
                answer = self._call(job, texts, timeout)
            if isinstance(answer, PlanNeeded):  # asked again for the plan just sent: a bug
                return ExecutionFailure(FailureKind.INTERNAL, f"the worker lost plan "
                                                              f"{job.plan_id} as it was sent")
            return answer

    def _remember(self, plan_id: str) -> None:
        """The worker was sent a job of ``plan_id``: it holds the plan now, as the last used."""
        self._known[plan_id] = None
        self._known.move_to_end(plan_id)
        while len(self._known) > PLANS_HELD:
            self._known.popitem(last=False)

    def knows(self, plan_id: str) -> bool:
        """Whether this worker was sent the plan (and so likely holds it)."""
        return plan_id in self._known

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _call(self, job: Job, source: PlanSource | None, timeout: float
              ) -> Outcome | PlanNeeded:
        if not self.process:
            return self._inline.execute(job, source)
        try:
            _send(self._conn, Request(job, source))
            self._remember(job.plan_id)
            deadline = time.monotonic() + timeout
            while not self._conn.poll(0.05):
                if self._proc.poll() is not None:
                    raise EOFError
                if time.monotonic() > deadline:
                    self.restart()
                    return ExecutionFailure(FailureKind.WORKER_TIMED_OUT,
                                            f"the execution took longer than {timeout:g} s; "
                                            f"the worker was restarted")
            return _recv(self._conn)
        except (EOFError, OSError):
            code = self._proc.poll() if self._proc is not None else None
            self.restart()
            return ExecutionFailure(FailureKind.WORKER_CRASHED,
                                    f"the GPU worker died while running this request (exit "
                                    f"code {code}); it is restarting")


if __name__ == "__main__":
    _main(become_child(sys.argv))
