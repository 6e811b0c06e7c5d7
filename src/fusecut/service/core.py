"""The state behind the routes: settings, the plan store, the workers and the planners.

Plans are keyed by (fusion id, input metadata, options, device profile); a stored plan is served
without solving. An execution names its plan by id: a worker that does not hold the plan
rebuilds it from the stored JSON (not solved again). Everything heavy runs in a planner process
(parsing, planning, serializing) or a worker process (rebuilding plans, running them): the
service's own process moves bytes and small summaries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from starlette.concurrency import run_in_threadpool

from fusecut.runtime.tensors import from_torch_dtype
from fusecut.service import metrics
from fusecut.service.admission import Gate
from fusecut.service.cache.store import PlanStore, StoredPlan, read_plan
from fusecut.service.planning import Planned, Refusal, plan_body, plan_for_tensors, refusing
from fusecut.service.problems import Problem, execution_problem
from fusecut.service.processes.planners import (
    JobCancelled,
    PlannerCrashed,
    PlannerFailed,
    PlannerPool,
)
from fusecut.service.processes.results import ExecutionFailure, ExecutionResult, FailureKind
from fusecut.service.processes.worker import Job, PlanSource
from fusecut.service.processes.worker_pool import WorkerPool, parse_gpus
from fusecut.service.settings import Settings
from fusecut.service.singleflight import SingleFlight

log = logging.getLogger("fusecut.service")
KNOWN_EXECUTIONS = 4096  # execution requests remembered with the plan that serves them
Disconnected = Callable[[], Awaitable[bool]]  # whether a request's client has gone
# failures after which the worker that ran the execution was restarted
RESTARTED = (FailureKind.WORKER_CRASHED, FailureKind.WORKER_TIMED_OUT)


class Service:
    def __init__(self, settings: Settings, worker=None):
        """``worker``: what runs executions (a WorkerPool by default; Ray Serve passes a
        handle on its execute deployment). The execution gate lets as many run at once as it
        has workers, and ``max_queued_executions`` wait."""
        self.settings = settings
        s = settings
        self.store = PlanStore(s.cache_location, s.cache_max_bytes, s.cache_memory_items)
        self.worker = worker or WorkerPool(parse_gpus(s.gpus), s.worker, s.workers_per_device)
        self.flights: SingleFlight[tuple[StoredPlan, str]] = SingleFlight()
        self.planners = PlannerPool()
        self.plan_gate = Gate("plan", s.max_concurrent_plans, s.max_queued_plans, s.queue_wait_s,
                              s.max_requests_per_client)
        self.exec_gate = Gate("execution", len(self.worker), s.max_queued_executions,
                              s.queue_wait_s, s.max_requests_per_client)
        # (definition, options, input metadata) of executions -> plan id: a repeated execution
        # goes straight to a worker
        self.known: OrderedDict[str, tuple[str, str]] = OrderedDict()  # (plan id, segmenter)
        self.known_lock = threading.Lock()

    def start(self) -> None:
        """Start the workers, and (without waiting for it) one planner process."""
        self.worker.start()
        self.planners.start()

    def stop(self) -> None:
        self.planners.stop()
        self.worker.stop()
        self.store.close()

    @property
    def ready(self) -> bool:
        return self.worker.ready

    # ---- planning ------------------------------------------------------------------------------

    async def off_loop(self, fn, *args, in_process: bool = True, client: str = "",
                       disconnected: Disconnected | None = None):
        """``fn(*args)`` in a planner process (or, for a small job, a thread): CPU work on
        untrusted input never runs on the event loop. Its refusals are raised as Problems; it
        is cancelled if ``disconnected()`` says its client left, or if it runs past its
        deadline."""
        if not in_process:
            result = await run_in_threadpool(refusing, fn, *args)
        else:
            s = self.settings
            async with self.plan_gate.slot(client):
                try:
                    result = await self.planners.run(
                        refusing, fn, *args, cancelled=disconnected, grace_s=s.plan_grace_s,
                        deadline_s=s.max_solver_seconds + s.plan_grace_s)
                except JobCancelled as e:
                    metrics.PLANS_CANCELLED.labels(e.reason).inc()
                    if e.reason == "disconnected":
                        raise Problem(499, "client closed request", "the client went away; "
                                      "its planning job was cancelled") from None
                    raise Problem(503, "planning timed out",
                                  f"the planning job ran {s.plan_grace_s:g} s past its time "
                                  f"limit and was cancelled; lower options.time_limit_s or "
                                  f"the definition's size", headers={"Retry-After": "1"}
                                  ) from None
                except PlannerCrashed as e:
                    log.error("%s", e)
                    raise Problem(503, "planner crashed", "the planner process died on this "
                                  "request (out of memory?); it has been restarted",
                                  headers={"Retry-After": "1"}) from None
                except PlannerFailed:
                    raise Problem(500, "internal error", "planning failed on an unexpected "
                                  "error (a fusecut bug; the service's log has the details)"
                                  ) from None
        if isinstance(result, Refusal):
            raise Problem(result.status, result.title, result.detail, **result.extra)
        return result

    async def plan_request(self, raw: bytes, raw_key: str, client: str = "",
                           disconnected: Disconnected | None = None) -> tuple[StoredPlan, str]:
        """POST /v1/plan: (the stored plan, "hit"/"miss"). A repeated body is answered by
        ``raw_key``, the hash of its bytes; anything else is planned in a planner process,
        once for concurrent identical bodies."""
        stored = self.store.remembered(raw_key) or \
            await run_in_threadpool(self.store.by_request, raw_key)
        if stored is not None:
            metrics.PLANS.labels(stored.segmenter, "hit").inc()
            return stored, "hit"
        while True:
            try:
                (stored, outcome), shared = await self.flights.run(
                    raw_key, lambda: self._plan_body(raw, raw_key, client, disconnected))
            except Problem as e:  # the client of the request it waited on went away: not this
                if e.status == 499 and disconnected is not None and not await disconnected():
                    continue
                raise
            if shared:
                metrics.PLANS.labels(stored.segmenter, "hit").inc()
                return stored, "hit"
            return stored, outcome

    async def _plan_body(self, raw: bytes, raw_key: str, client: str,
                         disconnected: Disconnected | None) -> tuple[StoredPlan, str]:
        def plan(use_cache: bool = True) -> Awaitable[Planned]:
            return self.off_loop(plan_body, raw, self.settings, use_cache, client=client,
                                 disconnected=disconnected)

        stored, outcome = await self._stored(await plan(), lambda: plan(False))
        await run_in_threadpool(self.store.link, raw_key, stored.plan_id)
        return stored, outcome

    async def _stored(self, result: Planned, replan: Callable[[], Awaitable[Planned]]
                      ) -> tuple[StoredPlan, str]:
        """The plan a planner answered with, stored if new: (the stored plan, "hit"/"miss").
        A "hit" the cache no longer has (damaged, evicted or unreachable since) is planned
        after all, by ``replan()``."""
        stored = None
        if result.cache == "hit":
            stored = await run_in_threadpool(self.store.get, result.plan_id)
            if stored is None:
                result = await replan()
        if stored is None:
            stored = await run_in_threadpool(
                self.store.put_bytes, result.plan_id, result.fusion_id, result.segmenter,
                result.body, result.request, result.request_key or None)
            metrics.record_plan(result.metrics, "miss")
            return stored, "miss"
        if result.request_key:
            await run_in_threadpool(self.store.link, result.request_key, stored.plan_id)
        metrics.PLANS.labels(stored.segmenter, "hit").inc()
        return stored, "hit"

    async def plan_for_tensors(self, definition: str, options_json: str,
                               tensors: dict[str, Any], client: str = "",
                               disconnected: Disconnected | None = None) -> str:
        """The id of the plan of a definition (nvFuser text or wire JSON text) for these
        tensors, planned now (in a planner process) unless stored."""
        given = {name: describe(name, t) for name, t in tensors.items()}
        key = hashlib.sha256(json.dumps([definition, options_json, given],
                                        sort_keys=True).encode()).hexdigest()
        with self.known_lock:
            known = self.known.get(key)
        if known is not None:
            plan_id, segmenter = known
            metrics.PLANS.labels(segmenter, "hit").inc()
            return plan_id

        def plan(use_cache: bool = True) -> Awaitable[Planned]:
            return self.off_loop(plan_for_tensors, definition, given, options_json,
                                 self.settings, use_cache, client=client,
                                 disconnected=disconnected)

        stored, _ = await self._stored(await plan(), lambda: plan(False))
        with self.known_lock:
            self.known[key] = (stored.plan_id, stored.segmenter)
            while len(self.known) > KNOWN_EXECUTIONS:
                self.known.popitem(last=False)
        return stored.plan_id

    # ---- executions ----------------------------------------------------------------------------

    def check_size(self, tensors: dict[str, Any]) -> None:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        if total > self.settings.max_tensor_bytes:
            raise Problem(413, "tensors too large", f"the inputs hold {total} bytes; the limit "
                                                    f"is {self.settings.max_tensor_bytes}")

    def plan_source(self, plan_id: str) -> PlanSource | None:
        """The texts a worker rebuilds plan ``plan_id`` from (read in a worker's thread); None
        if no plan has that id."""
        found = read_plan(self.settings.cache_location, plan_id)
        if found is not None:
            return found
        request, stored = self.store.request(plan_id), self.store.get(plan_id)  # ":memory:"
        if request is None or stored is None:
            return None
        return json.dumps(request), stored.body.decode()

    async def execute(self, plan_id: str, tensors: dict[str, torch.Tensor], wire: str,
                      client: str = "") -> ExecutionResult:
        """Run plan ``plan_id`` on a worker: named outputs, backend, per-segment timings. A
        failure is raised as its Problem (service.problems.EXECUTION_FAILURES)."""
        s = self.settings
        job = Job(plan_id, tensors, wire, s.max_output_bytes, s.max_intermediate_bytes)
        async with self.exec_gate.slot(client):
            # the least-loaded worker, one holding the plan among equals
            answer = await self.worker.execute(job, lambda: self.plan_source(plan_id),
                                               s.execute_timeout_s)
        if isinstance(answer, ExecutionFailure):
            if answer.kind in RESTARTED:
                metrics.WORKER_RESTARTS.inc()
            raise execution_problem(answer, plan_id)
        metrics.record_execution(answer)
        return answer


def describe(name: str, value: torch.Tensor) -> dict[str, Any]:
    """What planning needs of an execution's tensor: shape, strides, dtype, and the value of a
    one-element tensor (it may be a scalar input)."""
    given: dict[str, Any] = {"shape": list(value.shape), "strides": list(value.stride()),
                             "dtype": from_torch_dtype(value.dtype).value}
    if value.numel() == 1 and not value.is_complex():  # scalar inputs are real
        given["value"] = value.item()
    return given
