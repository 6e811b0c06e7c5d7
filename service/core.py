"""The state behind the routes: settings, the plan store, the workers and the planners.

Plans are keyed by (fusecut version, fusion id, input metadata, options, device profile); a stored
plan is served without solving. An execution names its plan by id: a worker that does not hold the
plan rebuilds it from the JSON texts of its request and of the plan (not solved again), kept in
memory beside the plan when this process made it (``Sources``), else read from the cache. The cache
never fails a request (issue 32: with PostgreSQL down, a full disk or an evicted plan, executions
were 404s): a plan the cache cannot hand back is planned again when the request carries its
definition. Everything heavy runs in a planner process (parsing, planning, serializing) or a worker
process (rebuilding plans, running them): the service's own process moves bytes and small
summaries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import Any

import torch
from starlette.concurrency import run_in_threadpool

from fusecut.runtime.tensors import from_torch_dtype
from fusecut.service import metrics
from fusecut.service.admission import Gate
from fusecut.service.cache.store import PlanStore, StoredPlan, read_plan
from fusecut.service.dashboard import render, render_recent
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
from fusecut.wire.tensors import load_safetensors

log = logging.getLogger("fusecut.service")
KNOWN_EXECUTIONS = 4096  # execution requests remembered with the plan that serves them
SOURCE_ITEMS = 256  # plans whose sources (request and plan texts) are kept in memory, at most
SOURCE_BYTES = 128 * 1024 * 1024  # and their texts' bytes together, at most
Disconnected = Callable[[], Awaitable[bool]]  # whether a request's client has gone
# The dashboard: one page rendered at a time, behind its own gate (never the plans'), and
# DASHBOARD_QUEUED more renders waiting; the page is cached until this replica stores a plan,
# or for DASHBOARD_MAX_AGE_S (plans other replicas store in a shared cache)
DASHBOARD_QUEUED = 8
DASHBOARD_MAX_AGE_S = 10.0
# failures after which the worker that ran the execution was restarted
RESTARTED = (FailureKind.WORKER_CRASHED, FailureKind.WORKER_TIMED_OUT)


class Sources:
    """What an execution needs of the plans this process made or read, kept in memory beside
    the plan cache (bounded, least recently used first out): the texts a worker rebuilds a
    plan from, and the plan's input count (a body's tensors are capped at it)."""

    def __init__(self, items: int = SOURCE_ITEMS, max_bytes: int = SOURCE_BYTES):
        self.items, self.max_bytes = items, max_bytes
        self._texts: OrderedDict[str, tuple[PlanSource, int | None]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def put(self, plan_id: str, source: PlanSource, inputs: int | None = None) -> None:
        """Keep ``source``, and the input count if known (else it is counted when asked)."""
        size = len(source[0]) + len(source[1])
        if size > self.max_bytes // 2:  # one plan would push out all the others
            return
        with self._lock:
            old = self._texts.pop(plan_id, None)
            if old is not None:
                self._bytes -= len(old[0][0]) + len(old[0][1])
            self._texts[plan_id] = (source, inputs)
            self._bytes += size
            while len(self._texts) > self.items or self._bytes > self.max_bytes:
                _, (dropped, _) = self._texts.popitem(last=False)
                self._bytes -= len(dropped[0]) + len(dropped[1])

    def get(self, plan_id: str) -> tuple[PlanSource, int | None] | None:
        with self._lock:
            found = self._texts.get(plan_id)
            if found is not None:
                self._texts.move_to_end(plan_id)
            return found

    def forget(self, plan_id: str) -> None:
        with self._lock:
            old = self._texts.pop(plan_id, None)
            if old is not None:
                self._bytes -= len(old[0][0]) + len(old[0][1])


def input_count(request: str) -> int:
    """How many inputs the request that made a plan gives (its JSON text)."""
    return len(json.loads(request)["inputs"])


class Service:
    def __init__(self, settings: Settings, worker=None):
        """``worker``: what runs executions (a WorkerPool by default; Ray Serve passes a
        handle on its execute deployment). The execution gate lets as many run at once as it
        has workers, and ``max_queued_executions`` wait."""
        self.settings = settings
        s = settings
        self.store = PlanStore(s.cache_location, s.cache_max_bytes, s.cache_memory_items,
                               timeout_s=s.cache_timeout_s)
        self.worker = worker or WorkerPool(parse_gpus(s.gpus), s.worker, s.workers_per_device)
        self.flights: SingleFlight[tuple[StoredPlan, str]] = SingleFlight()
        self.planners = PlannerPool()
        self.plan_gate = Gate("plan", s.max_concurrent_plans, s.max_queued_plans, s.queue_wait_s,
                              s.max_requests_per_client)
        self.exec_gate = Gate("execution", len(self.worker), s.max_queued_executions,
                              s.queue_wait_s, s.max_requests_per_client)
        # the dashboard (issue 32: rendered behind the plan gate, a burst of it turned plans
        # into 503s): its own gate, one render shared by concurrent requests, a cached page
        self.page_gate = Gate("dashboard render", 1, DASHBOARD_QUEUED, s.queue_wait_s,
                              s.max_requests_per_client)
        self.pages: SingleFlight[str] = SingleFlight()
        self.plans_stored = 0  # plans this replica stored: a new one, a new page
        self._page: tuple[tuple[Any, ...], float, str] | None = None
        # (definition, options, input metadata) of executions -> plan id: a repeated execution
        # goes straight to a worker
        self.known: OrderedDict[str, tuple[str, str]] = OrderedDict()  # (plan id, segmenter)
        self.known_lock = threading.Lock()
        # what executions need of plans, beside the cache (its memory layer's size, at most
        # SOURCE_ITEMS: 0 keeps none)
        self.sources = Sources(min(s.cache_memory_items, SOURCE_ITEMS))

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
                       disconnected: Disconnected | None = None, gate: Gate | None = None,
                       planner_gate: Gate | None = None):
        """``fn(*args)`` in a planner process, under ``planner_gate`` (the plan gate unless
        given), or, for a small job, in a thread, under ``gate`` if given: CPU work on
        untrusted input never runs on the event loop. Its refusals are raised as Problems; it
        is cancelled if ``disconnected()`` says its client left, or if it runs past its
        deadline."""
        if not in_process:
            async with gate.slot(client) if gate is not None else nullcontext():
                result = await run_in_threadpool(refusing, fn, *args)
        else:
            s = self.settings
            async with (planner_gate or self.plan_gate).slot(client):
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

        stored, outcome, _ = await self._stored(await plan(), lambda: plan(False))
        await run_in_threadpool(self.store.link, raw_key, stored.plan_id)
        return stored, outcome

    async def _stored(self, result: Planned, replan: Callable[[], Awaitable[Planned]]
                      ) -> tuple[StoredPlan, str, PlanSource | None]:
        """The plan a planner answered with, stored if new: (the stored plan, "hit"/"miss",
        and for a "miss" the texts a worker rebuilds it from, also kept in ``sources``). A
        "hit" the cache no longer has (damaged, evicted or unreachable since) is planned after
        all, by ``replan()``."""
        stored = None
        if result.cache == "hit":
            stored = await run_in_threadpool(self.store.get, result.plan_id)
            if stored is None:
                result = await replan()
        if stored is None:
            stored = await run_in_threadpool(
                self.store.put_bytes, result.plan_id, result.fusion_id, result.segmenter,
                result.body, result.request, result.request_key or None)
            # what an execution needs, whether or not the cache took it
            source = (result.request, await run_in_threadpool(stored.body.decode))
            self.sources.put(result.plan_id, source, result.inputs)
            self.plans_stored += 1
            metrics.record_plan(result.metrics, "miss")
            return stored, "miss", source
        if result.request_key:
            await run_in_threadpool(self.store.link, result.request_key, stored.plan_id)
        metrics.PLANS.labels(stored.segmenter, "hit").inc()
        return stored, "hit", None

    async def plan_for_tensors(self, definition: str, options_json: str,
                               tensors: dict[str, Any], client: str = "",
                               disconnected: Disconnected | None = None) -> str:
        """The id of the plan of a definition (nvFuser text or wire JSON text) for these
        tensors, planned now (in a planner process) unless stored."""
        plan_id, _ = await self._plan_for_tensors(definition, options_json, tensors, client,
                                                  disconnected)
        return plan_id

    async def _plan_for_tensors(self, definition: str, options_json: str,
                                tensors: dict[str, Any], client: str = "",
                                disconnected: Disconnected | None = None,
                                fresh: bool = False) -> tuple[str, PlanSource | None]:
        """As ``plan_for_tensors``; with ``fresh``, planned now whatever is stored. With the
        id, the texts a worker rebuilds the plan from when it was planned now (None when it
        was found)."""
        given = {name: describe(name, t) for name, t in tensors.items()}
        key = hashlib.sha256(json.dumps([definition, options_json, given],
                                        sort_keys=True).encode()).hexdigest()
        with self.known_lock:
            known = None if fresh else self.known.get(key)
        if known is not None:
            plan_id, segmenter = known
            metrics.PLANS.labels(segmenter, "hit").inc()
            return plan_id, None

        def plan(use_cache: bool = True) -> Awaitable[Planned]:
            return self.off_loop(plan_for_tensors, definition, given, options_json,
                                 self.settings, use_cache, client=client,
                                 disconnected=disconnected)

        stored, _, source = await self._stored(await plan(not fresh), lambda: plan(False))
        with self.known_lock:
            self.known[key] = (stored.plan_id, stored.segmenter)
            while len(self.known) > KNOWN_EXECUTIONS:
                self.known.popitem(last=False)
        return stored.plan_id, source

    # ---- the dashboard -------------------------------------------------------------------------

    async def dashboard(self, client: str = "") -> str:
        """The dashboard's page: the one rendered last while no plan was stored since (and it
        is younger than DASHBOARD_MAX_AGE_S), else rendered now, in a planner process under
        the dashboard's own gate, once for concurrent requests."""
        key = (self.plans_stored, self.worker.device, self.ready)
        page = self._page
        if page is not None and page[0] == key and \
                time.monotonic() - page[1] < DASHBOARD_MAX_AGE_S:
            return page[2]
        text, _ = await self.pages.run(repr(key), lambda: self._render(key, client))
        return text

    async def _render(self, key: tuple[Any, ...], client: str) -> str:
        s = self.settings
        worker = {"device": self.worker.device, "up": self.ready}
        rendered = time.monotonic()
        page = await self.off_loop(render_recent, s.cache_location, s.recent_plans, worker,
                                   client=client, planner_gate=self.page_gate)
        if page is None:  # a cache only the service's process can read (":memory:")
            async with self.page_gate.slot(client):
                page = await run_in_threadpool(
                    lambda: render(self.store.recent(s.recent_plans), worker))
        self._page = (key, rendered, page)
        return page

    # ---- executions ----------------------------------------------------------------------------

    def check_size(self, tensors: dict[str, Any]) -> None:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        if total > self.settings.max_tensor_bytes:
            raise Problem(413, "tensors too large", f"the inputs hold {total} bytes; the limit "
                                                    f"is {self.settings.max_tensor_bytes}")

    def plan_source(self, plan_id: str) -> PlanSource | None:
        """The texts a worker rebuilds plan ``plan_id`` from (read in a worker's thread): from
        memory, else from the cache; None if neither has it."""
        kept = self.sources.get(plan_id)
        if kept is not None:
            return kept[0]
        found = read_plan(self.settings.cache_location, plan_id)
        if found is None:
            request, stored = self.store.request(plan_id), self.store.get(plan_id)  # ":memory:"
            if request is None or stored is None:
                return None
            found = json.dumps(request), stored.body.decode()
        self.sources.put(plan_id, found)
        return found

    def plan_inputs(self, plan_id: str) -> int | None:
        """How many inputs plan ``plan_id`` takes (call it in a thread); None if no plan has
        that id."""
        kept = self.sources.get(plan_id)
        if kept is not None and kept[1] is not None:
            return kept[1]
        source = kept[0] if kept is not None else self.plan_source(plan_id)
        if source is None:
            return None
        count = input_count(source[0])
        self.sources.put(plan_id, source, count)
        return count

    async def decode_tensors(self, raw: memoryview | bytes, max_tensors: int,
                             client: str = "") -> dict[str, torch.Tensor]:
        """A safetensors body's tensors, at most ``max_tensors`` of them, decoded in a thread
        under the execution gate (the admission of the work it is for): a hostile header
        costs no more than ``max_tensors`` allow, and no more such decodes run at once than
        executions do."""
        async with self.exec_gate.slot(client):
            return await run_in_threadpool(load_safetensors, raw, max_tensors)

    async def execute(self, plan_id: str, tensors: dict[str, torch.Tensor], wire: str,
                      client: str = "") -> ExecutionResult:
        """Run plan ``plan_id`` on a worker: named outputs, backend, per-segment timings. A
        failure is raised as its Problem (service.problems.EXECUTION_FAILURES)."""
        answer = await self._run(plan_id, tensors, wire, client)
        return self._answered(answer, plan_id)

    async def execute_definition(self, definition: str, options_json: str,
                                 tensors: dict[str, torch.Tensor], wire: str,
                                 client: str = "",
                                 disconnected: Disconnected | None = None
                                 ) -> tuple[str, ExecutionResult]:
        """Plan (unless known) and run a definition on tensors: (the plan id, the result). A
        plan the cache cannot hand back to the worker (evicted, damaged, or the cache is down)
        is planned again, not a 404: the request carries all it needs."""
        plan_id, source = await self._plan_for_tensors(definition, options_json, tensors,
                                                      client, disconnected)
        answer = await self._run(plan_id, tensors, wire, client, source)
        if isinstance(answer, ExecutionFailure) and answer.kind is FailureKind.UNKNOWN_PLAN:
            log.warning("plan %s could not be read back from the cache; planning it again",
                        plan_id)
            plan_id, source = await self._plan_for_tensors(definition, options_json, tensors,
                                                          client, disconnected, fresh=True)
            answer = await self._run(plan_id, tensors, wire, client, source)
        return plan_id, self._answered(answer, plan_id)

    async def _run(self, plan_id: str, tensors: dict[str, torch.Tensor], wire: str,
                   client: str, source: PlanSource | None = None
                   ) -> ExecutionResult | ExecutionFailure:
        """Run plan ``plan_id`` on a worker; a worker that does not hold it is sent
        ``source`` if given, else what ``plan_source`` finds."""
        s = self.settings
        job = Job(plan_id, tensors, wire, s.max_output_bytes, s.max_intermediate_bytes)
        async with self.exec_gate.slot(client):
            # the least-loaded worker, one holding the plan among equals
            return await self.worker.execute(
                job, (lambda: source) if source is not None else
                (lambda: self.plan_source(plan_id)), s.execute_timeout_s)

    def _answered(self, answer: ExecutionResult | ExecutionFailure, plan_id: str
                  ) -> ExecutionResult:
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
