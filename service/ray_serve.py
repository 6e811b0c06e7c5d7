"""fusecut on Ray Serve (``fusecut ray-serve``): the same HTTP API, its replicas placed by Ray.

Two deployments:
- ``Planner``: the HTTP ingress (service.app, unchanged) on N CPU replicas, fixed or autoscaled
  between bounds. Each plans in its own planner processes and answers cached plans itself.
- ``Executor``: the GPU workers, ``num_gpus`` per replica (Ray sets CUDA_VISIBLE_DEVICES; the
  worker process inherits it). A planner replica's ``/v1/execute`` decodes the request, makes
  or finds the plan, and sends the plan and tensors to an executor replica through Serve's
  handle; Serve routes among executor replicas.

Both share the plan cache given by ``--cache`` (PostgreSQL: replicas on several machines). Ray
is an optional dependency (the ``ray`` extra); nothing here is imported by ``fusecut serve``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from fusecut import environment
from fusecut.service.processes.results import (
    ExecutionFailure,
    FailureKind,
    Outcome,
    unknown_plan,
)
from fusecut.service.processes.worker import Job, PlanSource, SourceOf
from fusecut.service.processes.worker_pool import WorkerPool, parse_gpus

APP_NAME = "fusecut"
STATUS_EVERY_S = 2.0  # how often a planner replica asks an executor how its worker is


def settings_env() -> dict[str, str]:
    """The FUSECUT_* settings of this process, for the replicas (on any node)."""
    return environment.snapshot()


class Executor:
    """An execute replica: a worker pool (workers per GPU Ray gave this replica) behind an
    admission gate, as ``fusecut serve``'s (planner replicas send to it together)."""

    def __init__(self, env: dict[str, str]):
        os.environ.update(env)
        from fusecut.service.admission import Gate
        from fusecut.service.settings import Settings

        s = Settings.from_env()
        self.pool = WorkerPool(parse_gpus(s.gpus), s.worker, s.workers_per_device)
        self.gate = Gate("execution", len(self.pool), s.max_queued_executions, s.queue_wait_s)
        self.pool.start()
        self.pool.wait_ready(300)

    async def execute(self, job: Job, source: PlanSource, timeout: float) -> Outcome:
        """The pool's answer, as ``fusecut serve``'s worker gives it: failures are values, so
        they reach the planner replica as they are (Ray would wrap an exception)."""
        from fusecut.service.problems import Problem

        try:
            async with self.gate.slot(""):
                return await self.pool.execute(job, lambda: source, timeout)
        except Problem as e:  # the gate's 503: this replica's queue is full
            return ExecutionFailure(FailureKind.EXECUTOR_BUSY, e.detail)

    def status(self) -> dict[str, Any]:
        p = self.pool
        return {"ready": p.ready, "device": p.device, "pid": p.pid, "restarts": p.restarts,
                "workers": p.snapshot()}

    def check_health(self) -> None:  # Serve replaces a replica whose workers are all gone
        if not self.pool.ready and all(s.worker.settled for s in self.pool.slots):
            self.pool.start()
            raise RuntimeError(f"no worker is running: {self.pool.device}")


class RemoteWorker:
    """What runs executions for a planner replica: the Executor deployment, through its
    handle. It has the interface of a WorkerPool (service.core.Service.worker)."""

    def __init__(self, handle, size: int):
        self.handle = handle
        self.size = size  # executions a planner replica lets run at once
        self._status: dict[str, Any] = {"ready": False, "device": "starting", "pid": None,
                                        "restarts": 0, "workers": []}
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._poll, daemon=True, name="fusecut-executor-status").start()

    def _poll(self) -> None:
        while True:
            try:
                self._status = self.handle.status.remote().result(timeout_s=30)
            except Exception as e:  # the executor is (re)starting: not ready until it answers
                self._status = {**self._status, "ready": False,
                                "device": f"executor unavailable: {type(e).__name__}"}
            if self._stop.wait(STATUS_EVERY_S):
                return

    def stop(self) -> None:
        self._stop.set()

    ready = property(lambda self: bool(self._status["ready"]))
    device = property(lambda self: self._status["device"])
    pid = property(lambda self: self._status["pid"])
    restarts = property(lambda self: self._status["restarts"])

    def snapshot(self) -> list[dict[str, Any]]:
        return self._status["workers"]

    def __len__(self) -> int:
        return self.size

    async def execute(self, job: Job, source: SourceOf, timeout: float) -> Outcome:
        # the plan's texts travel with every job: the executor's workers may not hold it
        texts = await asyncio.to_thread(source)
        if texts is None:
            return unknown_plan(job.plan_id)
        return await self.handle.execute.remote(job, texts, timeout)


class BytesBodies:
    """ASGI middleware: response bodies as bytes. Serve pickles a replica's ASGI messages to
    its proxy, and a memoryview (the service's zero-copy safetensors body) does not pickle."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def send_bytes(message):
            if isinstance(message.get("body"), memoryview):
                message = {**message, "body": bytes(message["body"])}
            await send(message)

        await self.app(scope, receive, send_bytes if scope["type"] == "http" else send)


class Planner:
    """A planner replica: service.app with its executions sent to the Executor deployment."""

    def __init__(self, executor, env: dict[str, str], execute_replicas: int = 1):
        os.environ.update(env)
        self.executor = executor
        self.execute_replicas = execute_replicas

    def __serve_build_asgi_app__(self):
        from fusecut.service.app import create_app
        from fusecut.service.settings import Settings

        settings = Settings.from_env()
        # as many at once as the executors run (each replica's workers on one device, at least)
        size = self.execute_replicas * settings.workers_per_device
        app = create_app(settings, worker=RemoteWorker(self.executor, size))
        app.add_middleware(BytesBodies)
        return app


def build(plan_replicas: int, min_replicas: int | None, max_replicas: int | None,
          plan_cpus: float, execute_replicas: int, execute_gpus: float,
          env: dict[str, str]):
    """The Serve application: Planner replicas (autoscaled if bounds are given) bound to the
    Executor deployment."""
    from ray import serve

    executor = serve.deployment(
        Executor, name="Executor", num_replicas=execute_replicas,
        ray_actor_options={"num_gpus": execute_gpus, "num_cpus": 0.5},
        max_ongoing_requests=64, health_check_period_s=5)
    if min_replicas is not None or max_replicas is not None:
        lo = min_replicas if min_replicas is not None else 1
        scaling: dict[str, Any] = {"autoscaling_config": {
            "min_replicas": lo, "max_replicas": max(lo, max_replicas or plan_replicas),
            "initial_replicas": max(lo, min(plan_replicas, max_replicas or plan_replicas)),
            "target_ongoing_requests": 8}}
    else:
        scaling = {"num_replicas": plan_replicas}
    planner = serve.deployment(
        serve.ingress()(Planner), name="Planner", ray_actor_options={"num_cpus": plan_cpus},
        max_ongoing_requests=256, **scaling)
    return planner.bind(executor.bind(env), env, execute_replicas)


def run(address: str | None, host: str, port: int, plan_replicas: int,
        min_replicas: int | None, max_replicas: int | None, plan_cpus: float,
        execute_replicas: int, execute_gpus: float | None, num_cpus: int | None,
        object_store_mb: int, ready) -> None:
    """Connect to the cluster at ``address`` (or start a local one), deploy, call ``ready(url)``
    and serve until interrupted; then remove the application (and a local cluster)."""
    import signal

    if not address:  # a local cluster of one node: keep Ray's own traffic on the loopback
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (read on import)
    import ray
    from ray import serve

    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(num_cpus=num_cpus, object_store_memory=object_store_mb * 1024**2,
                 include_dashboard=False, logging_level="WARNING")
    if execute_gpus is None:  # one per execute replica where the cluster has GPUs
        execute_gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        quiet = {"log_level": "WARNING", "enable_access_log": False}  # /metrics counts requests
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
        app = build(plan_replicas, min_replicas, max_replicas, plan_cpus, execute_replicas,
                    execute_gpus, settings_env())
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config=quiet)
        ready(f"http://{host}:{port}", execute_gpus)
        stop.wait()
    finally:
        try:
            serve.delete(APP_NAME)
            if address:  # a cluster of one's own goes with ray.shutdown(), Serve with it
                serve.shutdown()
        finally:
            ray.shutdown()
