"""The state behind the routes: settings, the plan store, the worker, and the plans held in memory.

Plans are keyed by (fusion id, input metadata, options, device profile); a stored plan is served
without solving, and rebuilt from its JSON (not solved again) when an execution needs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch
from starlette.concurrency import run_in_threadpool

from optimizer.ir.fusion import Fusion
from optimizer.ir.inputs import InputMeta, ScalarMeta
from optimizer.ir.nvtext import parse_text
from optimizer.ir.wire import (
    FusionJSON,
    fusion_from_json,
    fusion_id,
    meta_from_json,
    meta_to_json,
)
from optimizer.plan.plan import Plan, plan_key
from optimizer.plan.restore import restore_plan
from optimizer.planner import PlanOptions, make_plan
from optimizer.schedulers.profiles import get_profile
from runtime.tensor_wire import expand_declared_broadcasts
from runtime.tensors import meta_of
from runtime.worker import WorkerCrashed, WorkerTimeout, WorkerUnavailable
from runtime.worker_pool import WorkerPool, WorkersBusy, parse_gpus
from service import metrics
from service.models import PlanOptionsModel
from service.planning import (
    Refusal,
    check_sizes,
    parse_definition,
    plan_body,
    plan_options,
    plan_summary,
    refusing,
    serialize,
    start_planners,
    warm_up,
)
from service.problems import Problem
from service.settings import Settings
from service.singleflight import SingleFlight
from service.store import PlanStore, StoredPlan

Parsed = tuple[Fusion, list[InputMeta] | None, str | None]  # see Service.parse
HELD_PLANS = 64  # Plan objects kept in memory for executions
PARSED_TEXTS = 256  # parsed definition texts kept: a client that repeats one skips the parser


class Service:
    def __init__(self, settings: Settings, worker=None):
        """``worker``: what runs executions (a WorkerPool by default; Ray Serve passes a
        handle on its execute deployment)."""
        self.settings = settings
        self.store = PlanStore(settings.cache_location, settings.cache_max_bytes,
                               settings.cache_memory_items)
        self.worker = worker or WorkerPool(parse_gpus(settings.gpus), settings.worker,
                                           settings.max_queued_executions)
        self.flights: SingleFlight[tuple[StoredPlan, str]] = SingleFlight()
        self.held: OrderedDict[str, Plan] = OrderedDict()
        self.parsed: OrderedDict[str, Parsed] = OrderedDict()
        self.parsed_lock = threading.Lock()
        self.plan_slots = asyncio.Semaphore(settings.max_concurrent_plans)
        self.planners = start_planners(settings)

    def start(self) -> None:
        """Start the worker, and (without waiting for it) one planner process."""
        self.worker.start()
        self.planners.submit(warm_up)

    def stop(self) -> None:
        self.planners.shutdown(wait=False, cancel_futures=True)
        self.worker.stop()
        self.store.close()

    # ---- definitions ---------------------------------------------------------------------------

    def parse(self, definition: str | FusionJSON) -> Parsed:
        """The fusion, the input metadata of a text's ``inputs = [...]`` list if it has one, and
        the text's definition function name."""
        limit = self.settings.max_ops
        if isinstance(definition, str):
            key = hashlib.sha256(definition.encode()).hexdigest()
            with self.parsed_lock:  # parse runs in threads
                known = self.parsed.get(key)
                if known is not None:
                    self.parsed.move_to_end(key)
                    return known
            parsed = parse_text(definition, max_ops=limit)
            known = (parsed.fusion, parsed.inputs, parsed.function_name)
            with self.parsed_lock:  # fusions are not mutated once parsed: they can be shared
                self.parsed[key] = known
                if len(self.parsed) > PARSED_TEXTS:
                    self.parsed.popitem(last=False)
            return known
        return parse_definition(definition, limit)

    def options(self, model: PlanOptionsModel) -> PlanOptions:
        return plan_options(model, self.settings)

    # ---- plans ---------------------------------------------------------------------------------

    def _hold(self, plan: Plan) -> Plan:
        self.held[plan.plan_id] = plan
        self.held.move_to_end(plan.plan_id)
        while len(self.held) > HELD_PLANS:
            self.held.popitem(last=False)
        return plan

    async def plan(self, fusion: Fusion, metas: list[InputMeta], options: PlanOptions,
                   request_key: str | None = None, name: str | None = None
                   ) -> tuple[StoredPlan, str]:
        """(the stored plan, "hit" or "miss"); a miss solves and stores the plan."""
        def key() -> tuple[list[dict[str, Any]], str]:  # the fusion id converts all of it
            check_sizes(fusion, metas, self.settings.max_plan_tensor_bytes)
            profile = get_profile(options.device, options.device_overrides)
            metas_json = [meta_to_json(m) for m in metas]
            return metas_json, plan_key(fusion_id(fusion), metas_json, options.to_json(),
                                        profile.to_json())

        metas_json, pid = await run_in_threadpool(key)
        cached = await run_in_threadpool(self.store.get, pid)
        if cached is None:
            async def make() -> tuple[StoredPlan, str]:
                async with self.plan_slots:
                    plan = await run_in_threadpool(make_plan, fusion, metas, options)
                    # serializing a large plan takes as long as planning: off the loop too
                    data, body, request = await run_in_threadpool(serialize, plan, metas_json,
                                                                  name)
                stored = await run_in_threadpool(self.store.put_bytes, data["plan_id"],
                                                 data["fusion_id"], data["segmenter"], body,
                                                 request)
                self._hold(plan)
                metrics.record_plan(plan_summary(data), "miss")
                return stored, "miss"

            (cached, outcome), shared = await self.flights.run("plan:" + pid, make)
            if not shared:
                if request_key:
                    await run_in_threadpool(self.store.link, request_key, pid)
                return cached, outcome
        if request_key:
            await run_in_threadpool(self.store.link, request_key, pid)
        metrics.PLANS.labels(options.segmenter, "hit").inc()
        return cached, "hit"

    async def off_loop(self, fn, *args, in_process: bool = True):
        """``fn(*args)`` in a planner process (or, for a small job, a thread): CPU work on
        untrusted input never runs on the event loop. Its refusals are raised as Problems."""
        if not in_process:
            result = await run_in_threadpool(refusing, fn, *args)
        else:
            async with self.plan_slots:
                try:
                    result = await asyncio.get_running_loop().run_in_executor(
                        self.planners, refusing, fn, *args)
                except BrokenProcessPool:  # a planner died (out of memory?): start new ones
                    self.planners = start_planners(self.settings)
                    raise Problem(503, "planner crashed", "the planner process died on this "
                                                          "request; it has been restarted"
                                  ) from None
        if isinstance(result, Refusal):
            raise Problem(result.status, result.title, result.detail, **result.extra)
        return result

    async def plan_request(self, raw: bytes, raw_key: str) -> tuple[StoredPlan, str]:
        """POST /v1/plan: (the stored plan, "hit"/"miss"). A repeated body is answered by
        ``raw_key``, the hash of its bytes; anything else is planned in a planner process,
        once for concurrent identical bodies."""
        stored = self.store.remembered(raw_key) or \
            await run_in_threadpool(self.store.by_request, raw_key)
        if stored is None:
            (stored, outcome), shared = await self.flights.run(
                raw_key, lambda: self._plan_body(raw, raw_key))
            if not shared:
                return stored, outcome
        metrics.PLANS.labels(stored.segmenter, "hit").inc()
        return stored, "hit"

    async def _plan_body(self, raw: bytes, raw_key: str) -> tuple[StoredPlan, str]:
        result = await self.off_loop(plan_body, raw, self.settings)
        stored = None
        if result.cache == "hit":  # a planner found it stored
            stored = await run_in_threadpool(self.store.get, result.plan_id)
            if stored is None:  # damaged, evicted or unreachable since: plan it after all
                result = await self.off_loop(plan_body, raw, self.settings, False)
        if stored is None:
            stored = await run_in_threadpool(
                self.store.put_bytes, result.plan_id, result.fusion_id, result.segmenter,
                result.body, result.request, result.request_key)
            metrics.record_plan(result.metrics, "miss")
        else:
            await run_in_threadpool(self.store.link, result.request_key, stored.plan_id)
            metrics.PLANS.labels(stored.segmenter, "hit").inc()
        await run_in_threadpool(self.store.link, raw_key, stored.plan_id)
        return stored, result.cache

    async def plan_object(self, plan_id: str) -> Plan:
        """The Plan behind an id: held in memory, or rebuilt from the store."""
        held = self.held.get(plan_id)
        if held is not None:
            return held
        request = await run_in_threadpool(self.store.request, plan_id)
        stored = await run_in_threadpool(self.store.get, plan_id)
        if request is None or stored is None:
            raise Problem(404, "unknown plan", f"no plan has id {plan_id!r}")
        fusion = fusion_from_json(request["definition"], self.settings.max_ops)
        metas = [meta_from_json(m) for m in request["inputs"]]
        plan = await run_in_threadpool(restore_plan, fusion, metas, json.loads(stored.body))
        return self._hold(plan)

    async def plan_for_tensors(self, definition: str | FusionJSON, options: PlanOptionsModel,
                               tensors: dict[str, Any]) -> Plan:
        """The plan of a definition for these tensors (planned now unless stored)."""
        fusion, _, function_name = await run_in_threadpool(self.parse, definition)
        check_names(fusion, tensors)
        tensors = expand_declared_broadcasts(fusion, tensors)
        metas: list[InputMeta] = []
        for name in fusion.inputs:
            value = tensors[name]
            if name in fusion.scalars:
                metas.append(ScalarMeta(fusion.scalars[name].dtype, scalar_value(name, value)))
            else:
                metas.append(meta_of(value))
        stored, _ = await self.plan(fusion, metas, self.options(options), name=function_name)
        return await self.plan_object(stored.plan_id)

    # ---- executions ----------------------------------------------------------------------------

    def check_size(self, tensors: dict[str, Any]) -> None:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        if total > self.settings.max_tensor_bytes:
            raise Problem(413, "tensors too large", f"the inputs hold {total} bytes; the limit "
                                                    f"is {self.settings.max_tensor_bytes}")

    async def execute(self, plan: Plan, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Run ``plan`` on the worker: outputs, backend, per-segment timings."""
        fusion = plan.fusion
        check_names(fusion, tensors)
        tensors = expand_declared_broadcasts(fusion, tensors)
        args = [scalar_value(n, tensors[n]) if n in fusion.scalars else tensors[n]
                for n in fusion.inputs]
        try:  # the least-loaded worker; each runs one at a time, behind a bounded queue
            response = await self.worker.execute(plan, args, self.settings.execute_timeout_s)
        except WorkersBusy as e:
            raise Problem(503, "workers busy", str(e),
                          headers={"Retry-After": str(e.retry_after_s)}) from None
        except WorkerCrashed as e:
            metrics.WORKER_RESTARTS.inc()
            raise Problem(503, "worker crashed", str(e)) from None
        except WorkerTimeout as e:
            metrics.WORKER_RESTARTS.inc()
            raise Problem(504, "execution timed out", str(e)) from None
        except WorkerUnavailable as e:
            raise Problem(503, "worker unavailable", str(e)) from None
        if not response["ok"]:
            kind = response["kind"]
            if kind in ("DefinitionError", "InputError", "PlanError"):
                raise Problem(422, "inputs do not match" if kind == "InputError" else
                              "cannot execute", response["message"])
            raise Problem(500, "execution failed", f"{kind}: {response['message']}")
        metrics.record_execution(response)
        return response


def check_names(fusion: Fusion, tensors: dict[str, Any]) -> None:
    missing = [n for n in fusion.inputs if n not in tensors]
    extra = sorted(set(tensors) - set(fusion.inputs))
    if missing or extra:
        raise Problem(422, "inputs do not match",
                      f"the definition's inputs are {list(fusion.inputs)}; missing {missing}, "
                      f"unexpected {extra}")


def scalar_value(name: str, value: torch.Tensor) -> Any:
    """A scalar input travels as a one-element tensor."""
    if value.numel() != 1:
        raise Problem(422, "inputs do not match", f"scalar input {name} must be a one-element "
                                                  f"tensor, got shape {list(value.shape)}")
    return value.item()
