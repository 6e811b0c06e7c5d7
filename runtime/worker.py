"""The GPU worker: a separate process that owns the CUDA context and runs executions.

The service sends it a plan and tensors over a pipe and waits, with a timeout. If a kernel (or
anything else) kills the process, the request in flight fails with ``WorkerCrashed``, a new
worker starts, and the service keeps serving. Without a GPU the worker runs the CPU path (the
torch reference). ``Worker(process=False)`` runs executions in the service's own process.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


class WorkerCrashed(RuntimeError):
    """The worker process died while running a request."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer within the request's timeout (it was restarted)."""


class WorkerUnavailable(RuntimeError):
    """No worker is running (it is starting, or failed to start)."""


def _describe_device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


class _Runner:
    """Executes requests; lives in the worker process (or in the service, inline)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.plans: OrderedDict[str, Any] = OrderedDict()

    def execute(self, request: dict[str, Any]) -> dict[str, Any]:
        import runtime.compile as rc
        from optimizer.errors import FusecutError
        from runtime.run import run_plan
        from runtime.tensor_wire import to_device

        plan = request.get("plan")
        plan_id = request["plan_id"]
        if plan is not None:
            self.plans[plan_id] = plan
            while len(self.plans) > 64:
                self.plans.popitem(last=False)
        plan = self.plans.get(plan_id)
        if plan is None:
            return {"ok": False, "kind": "MissingPlan", "message": plan_id}
        try:
            args = [to_device(v, self.device) if isinstance(v, self.torch.Tensor) else v
                    for v in request["args"]]
            stats = rc.STATS
            before = (stats.compiles, stats.seconds, stats.memory_hits + stats.disk_hits)
            result = run_plan(plan, args, timed=True)
            outputs = [t.cpu() for t in result.outputs]
        except FusecutError as e:
            return {"ok": False, "kind": type(e).__name__, "message": str(e)}
        return {"ok": True, "outputs": outputs, "backend": result.backend,
                "timings": [t.__dict__ for t in result.timings],
                "compiles": rc.STATS.compiles - before[0],
                "compile_seconds": rc.STATS.seconds - before[1],
                "cache_hits": rc.STATS.memory_hits + rc.STATS.disk_hits - before[2]}


def _child_env() -> dict[str, str]:
    """The worker imports fusecut's packages from where this process found them."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


# Plain pickle, not multiprocessing's (which would share tensors through fds). A large CPU
# tensor travels out of band: pickling its storage copies it while holding the GIL (90 ms per
# 100 MB, a stall of the service's event loop), while its bytes are written to and read from the
# pipe a chunk at a time, and copied into a tensor by torch, which lets other threads run.
OUT_OF_BAND_BYTES = 1 << 16


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if (torch is None or type(obj) is not torch.Tensor or obj.device.type != "cpu"
                or obj.requires_grad or not obj.is_contiguous()
                or obj.numel() * obj.element_size() < OUT_OF_BAND_BYTES):
            return NotImplemented
        # by its module's name: this module is __main__ in the worker process
        from runtime.safetensors_io import tensor_from_bytes

        raw = pickle.PickleBuffer(obj.reshape(-1).view(torch.uint8).numpy())
        return tensor_from_bytes, (raw, obj.dtype, tuple(obj.shape))


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
        _send(conn, {"ready": True, "device": _describe_device()})
    except Exception as e:  # report, then exit: the service restarts us
        _send(conn, {"ready": False, "error": repr(e)})
        return
    while True:
        try:
            request = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            response = runner.execute(request)
        except Exception as e:  # a bug in fusecut: report it, keep serving
            response = {"ok": False, "kind": "InternalError", "message": repr(e)}
        _send(conn, response)


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
        self._known: set[str] = set()  # plan ids the current worker holds
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
        # A plain subprocess (not multiprocessing's spawn, which re-imports the caller's
        # __main__) talking over a socket pair.
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-m", "runtime.worker", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], env={**_child_env(), **self.env})
        theirs.close()
        conn = Connection(ours.detach())
        hello: dict[str, Any] = {"ready": False, "error": "no answer"}
        if conn.poll(self.start_timeout):
            try:
                hello = _recv(conn)
            except (EOFError, OSError):
                hello = {"ready": False, "error": f"exited with code {proc.wait()}"}
        if not hello.get("ready"):
            proc.kill()
            conn.close()
            self.device = f"failed to start: {hello.get('error')}"
            return
        self._proc, self._conn, self._known = proc, conn, set()
        self.device = hello["device"]

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
            self._proc.kill()
            self._proc.wait(5)
            self._conn.close()
        self._proc = self._conn = None

    # ---- requests -----------------------------------------------------------------------------

    def execute(self, plan, args: list[Any], timeout: float) -> dict[str, Any]:
        """Run ``plan`` on ``args``: the worker's response (``ok``, outputs, timings...)."""
        with self._lock:
            if not self.wait_ready(self.start_timeout):
                if self._settled.is_set():  # it failed to start, or died idle: try again
                    self.restart()
                raise WorkerUnavailable(f"the worker is not running ({self.device})")
            if not self.process:
                return self._inline.execute({"plan_id": plan.plan_id, "plan": plan,
                                             "args": args})
            response = self._call(plan, args, timeout, send_plan=plan.plan_id not in self._known)
            if response.get("kind") == "MissingPlan":  # the worker forgot it: send it again
                response = self._call(plan, args, timeout, send_plan=True)
            return response

    def _call(self, plan, args: list[Any], timeout: float, send_plan: bool) -> dict[str, Any]:
        request = {"plan_id": plan.plan_id, "args": args, "plan": plan if send_plan else None}
        try:
            _send(self._conn, request)
            self._known.add(plan.plan_id)
            deadline = time.monotonic() + timeout
            while not self._conn.poll(0.05):
                if self._proc.poll() is not None:
                    raise EOFError
                if time.monotonic() > deadline:
                    self.restart()
                    raise WorkerTimeout(f"the execution took longer than {timeout:g} s; the "
                                        f"worker was restarted")
            return _recv(self._conn)
        except (EOFError, OSError):
            code = self._proc.poll() if self._proc is not None else None
            self.restart()
            raise WorkerCrashed(f"the GPU worker died while running this request (exit code "
                                f"{code}); it is restarting") from None


if __name__ == "__main__":
    _main(Connection(int(sys.argv[1])))
