"""The state behind the routes: settings, the plan store, the worker, and the plans held in memory.

Plans are keyed by (fusion id, input metadata, options, device profile); a stored plan is served
without solving, and rebuilt from its JSON (not solved again) when an execution needs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections import OrderedDict
from typing import Any

import torch
from starlette.concurrency import run_in_threadpool

from optimizer.ir.fusion import Fusion
from optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta
from optimizer.ir.nvtext import parse_text
from optimizer.ir.wire import (
    FusionJSON,
    fusion_from_json,
    fusion_id,
    fusion_to_json,
    meta_from_json,
    meta_to_json,
)
from optimizer.plan.plan import Plan, plan_key
from optimizer.plan.restore import restore_plan
from optimizer.planner import PlanOptions, make_plan
from optimizer.schedulers.profiles import get_profile
from runtime.tensor_wire import expand_declared_broadcasts
from runtime.tensors import meta_of
from runtime.worker import Worker, WorkerCrashed, WorkerTimeout, WorkerUnavailable
from service import metrics
from service.models import PlanOptionsModel
from service.problems import Problem
from service.settings import Settings
from service.store import PlanStore, StoredPlan

INT64_MAX = 2**63 - 1
HELD_PLANS = 64  # Plan objects kept in memory for executions
PARSED_TEXTS = 256  # parsed definition texts kept: a client that repeats one skips the parser


class Service:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = PlanStore(settings.db_path)
        self.worker = Worker(process=settings.worker)
        self.held: OrderedDict[str, Plan] = OrderedDict()
        self.parsed: OrderedDict[str, tuple[Fusion, list[InputMeta] | None]] = OrderedDict()
        self.plan_slots = asyncio.Semaphore(settings.max_concurrent_plans)
        self.exec_slots = asyncio.Semaphore(settings.max_concurrent_executions)

    # ---- definitions ---------------------------------------------------------------------------

    def parse(self, definition: str | FusionJSON) -> tuple[Fusion, list[InputMeta] | None]:
        """The fusion, and the input metadata of a text's ``inputs = [...]`` list if it has one."""
        limit = self.settings.max_ops
        if isinstance(definition, str):
            key = hashlib.sha256(definition.encode()).hexdigest()
            known = self.parsed.get(key)
            if known is None:  # fusions are not mutated once parsed, so they can be shared
                parsed = parse_text(definition, max_ops=limit)
                known = self.parsed[key] = (parsed.fusion, parsed.inputs)
                if len(self.parsed) > PARSED_TEXTS:
                    self.parsed.popitem(last=False)
            self.parsed.move_to_end(key)
            return known
        if len(definition.ops) > limit:
            raise Problem(413, "definition too large",
                          f"the definition has {len(definition.ops)} ops; the limit is {limit}")
        return fusion_from_json(definition, limit), None

    def options(self, model: PlanOptionsModel) -> PlanOptions:
        limit = model.time_limit_s if model.time_limit_s is not None else \
            self.settings.default_time_limit_s
        if limit > self.settings.max_solver_seconds:
            raise Problem(422, "solver time limit too long",
                          f"options.time_limit_s is {limit}; this service allows at most "
                          f"{self.settings.max_solver_seconds}")
        kwargs = model.model_dump(exclude={"time_limit_s", "kinds"})
        kwargs["device_overrides"] = model.device_overrides.model_dump(exclude_none=True)
        if model.kinds is not None:
            kwargs["kinds"] = tuple(model.kinds)
        return PlanOptions(time_limit_s=limit, **kwargs)

    # ---- plans ---------------------------------------------------------------------------------

    def _hold(self, plan: Plan) -> Plan:
        self.held[plan.plan_id] = plan
        self.held.move_to_end(plan.plan_id)
        while len(self.held) > HELD_PLANS:
            self.held.popitem(last=False)
        return plan

    async def plan(self, fusion: Fusion, metas: list[InputMeta], options: PlanOptions,
                   request_key: str | None = None) -> tuple[StoredPlan, str]:
        """(the stored plan, "hit" or "miss"); a miss solves and stores the plan."""
        check_sizes(fusion, metas, self.settings.max_plan_tensor_bytes)
        profile = get_profile(options.device, options.device_overrides)
        metas_json = [meta_to_json(m) for m in metas]
        pid = plan_key(fusion_id(fusion), metas_json, options.to_json(), profile.to_json())
        cached = self.store.get(pid)
        if cached is not None:
            if request_key:
                self.store.link(request_key, pid)
            metrics.PLANS.labels(options.segmenter, "hit").inc()
            return cached, "hit"
        async with self.plan_slots:
            plan = await run_in_threadpool(make_plan, fusion, metas, options)
        data = plan.to_json()
        too_big = [k for k, v in data["totals"].items()
                   if isinstance(v, (int, float)) and v > INT64_MAX]
        if too_big:  # sizes made inside the definition (broadcast_in_dim to fixed shapes)
            raise Problem(422, "sizes too large", f"the plan's totals.{too_big[0]} is over "
                                                  f"2**63 - 1; reduce the definition's shapes")
        where = non_finite(data)
        if where is not None:  # never store or send a plan that is not JSON
            raise Problem(422, "cannot plan", f"the plan's {where} is not a finite number; "
                                              f"check the options and input metadata")
        request = {"definition": fusion_to_json(fusion), "inputs": metas_json}
        stored = self.store.put(data, request, request_key)
        self._hold(plan)
        metrics.record_plan(data, "miss")
        return stored, "miss"

    async def plan_object(self, plan_id: str) -> Plan:
        """The Plan behind an id: held in memory, or rebuilt from the store."""
        held = self.held.get(plan_id)
        if held is not None:
            return held
        request, stored = self.store.request(plan_id), self.store.get(plan_id)
        if request is None or stored is None:
            raise Problem(404, "unknown plan", f"no plan has id {plan_id!r}")
        fusion = fusion_from_json(request["definition"], self.settings.max_ops)
        metas = [meta_from_json(m) for m in request["inputs"]]
        plan = await run_in_threadpool(restore_plan, fusion, metas, json.loads(stored.body))
        return self._hold(plan)

    async def plan_for_tensors(self, definition: str | FusionJSON, options: PlanOptionsModel,
                               tensors: dict[str, Any]) -> Plan:
        """The plan of a definition for these tensors (planned now unless stored)."""
        fusion, _ = self.parse(definition)
        check_names(fusion, tensors)
        tensors = expand_declared_broadcasts(fusion, tensors)
        metas: list[InputMeta] = []
        for name in fusion.inputs:
            value = tensors[name]
            if name in fusion.scalars:
                metas.append(ScalarMeta(fusion.scalars[name].dtype, scalar_value(name, value)))
            else:
                metas.append(meta_of(value))
        stored, _ = await self.plan(fusion, metas, self.options(options))
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
        async with self.exec_slots:
            try:
                response = await run_in_threadpool(self.worker.execute, plan, args,
                                                   self.settings.execute_timeout_s)
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


def check_sizes(fusion: Fusion, metas: list[InputMeta], limit: int) -> None:
    """Refuse tensor inputs whose logical size, in elements or bytes, leaves int64 or passes
    ``limit`` bytes, or whose strides reach past int64: naming the input and axis."""
    for name, meta in zip(fusion.inputs, metas):
        if not isinstance(meta, TensorMeta):
            continue
        numel, offset = 1, 0
        for axis, (extent, stride) in enumerate(zip(meta.shape, meta.strides)):
            numel *= extent
            offset += max(extent - 1, 0) * stride
            where = f"input {name} (shape {shape_text(meta.shape)}), axis {axis}"
            if numel > INT64_MAX or offset > INT64_MAX:
                raise Problem(422, "sizes too large", f"{where}: the extents or strides so "
                                                      f"far pass 2**63 - 1 elements")
            if numel * meta.dtype.itemsize > limit:
                raise Problem(422, "sizes too large",
                              f"{where}: {numel * meta.dtype.itemsize} bytes so far, over this "
                              f"service's limit of {limit} bytes per input")
        if (offset + 1) * meta.dtype.itemsize > INT64_MAX:
            raise Problem(422, "sizes too large", f"input {name}: its strides reach past "
                                                  f"2**63 - 1 bytes")


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape for a message, its long extents as powers of two where they are."""
    return "[" + ", ".join(f"2**{e.bit_length() - 1}" if e > 2**32 and e & (e - 1) == 0
                           else str(e) for e in shape) + "]"


def non_finite(value: Any, path: str = "plan") -> str | None:
    """The path of the first NaN or infinity in a JSON-like value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = non_finite(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if where is not None:
            return where
    return None


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
