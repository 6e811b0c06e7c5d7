"""Execution routes: POST /v1/execute (a definition or a plan id, and tensors as KServe-v2 JSON or
safetensors) and POST /v1/plans/{plan_id}/execute (raw safetensors for a plan made before)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from fusecut.service import openapi
from fusecut.service.bodies import read_body
from fusecut.service.core import Service
from fusecut.service.execute_bodies import (
    INLINE_BODY_BYTES,
    INLINE_VALUES,
    decode_execute,
    encode_execute,
)
from fusecut.service.models import ExecuteRequest, PlanOptionsModel
from fusecut.service.problems import Problem, validation_problem
from fusecut.service.processes.results import ExecutionResult
from fusecut.service.routes.dependencies import ServiceDep, client_of, require_api_key
from fusecut.service.routes.media import JSON, SAFETENSORS, media_type, require_media_type
from fusecut.service.routes.plans import PlanId
from fusecut.wire import safetensors
from fusecut.wire.tensors import NAMES, from_array, to_array

# the per-segment timings also go in an X-Fusecut-Segments header while they take at most this
MAX_SEGMENTS_HEADER_BYTES = 4096

M = TypeVar("M", bound=BaseModel)

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])

OUTPUTS = {200: {"description": "the outputs: KServe-v2 JSON for a JSON request, safetensors "
                                "otherwise",
                 "content": {JSON: {"schema": {"type": "object"}},
                             SAFETENSORS: {"schema": {"type": "string", "format": "binary"}}}},
           **openapi.problems(400, 401, 404, 413, 415, 422, 429, 500, 503, 504)}
EXECUTE_BODY = {"required": True, "content": {
    JSON: {"schema": openapi.schema_of(ExecuteRequest)},
    "multipart/form-data": {"schema": openapi.MULTIPART_EXECUTE}}}


@router.post("/execute", summary="Run a fusion on tensors", openapi_extra={
    "requestBody": EXECUTE_BODY, "description": openapi.EXECUTE_WAYS}, responses=OUTPUTS)
async def post_execute(request: Request, service: ServiceDep) -> Response:
    content_type = media_type(request)
    if content_type == JSON:
        return await execute_json(request, service)
    if content_type in ("multipart/form-data", SAFETENSORS):
        return await execute_safetensors(request, service, content_type,
                                         request.headers.get("x-fusecut-plan-id"))
    raise Problem(415, "unsupported media type",
                  f"send application/json (KServe-v2 tensors), multipart/form-data or "
                  f"application/octet-stream (safetensors), not {content_type or 'nothing'}")


@router.post("/plans/{plan_id}/execute", summary="Run a plan made before on tensors",
             openapi_extra={"requestBody": {"required": True, "content": {SAFETENSORS: {
                 "schema": {"type": "string", "format": "binary"}}}}}, responses=OUTPUTS)
async def post_plan_execute(request: Request, plan_id: PlanId, service: ServiceDep
                            ) -> Response:
    require_media_type(request, SAFETENSORS)
    return await execute_safetensors(request, service, SAFETENSORS, plan_id)


async def execute_json(request: Request, service: Service) -> Response:
    # Validated and decoded off the event loop (see execute_bodies), in a planner process when
    # big, else in a thread under the execution gate; the loop only turns numpy arrays into
    # tensors and back. The body limit bounds it (FUSECUT_MAX_JSON_BODY_BYTES).
    raw = await request.body()
    client = client_of(request)
    body = await service.off_loop(decode_execute, raw, service.settings, client=client,
                                  in_process=len(raw) > INLINE_BODY_BYTES,
                                  gate=service.exec_gate)
    tensors = await run_in_threadpool(lambda: {
        name: from_array(values, datatype) for name, (values, datatype) in body.arrays.items()})
    plan_id, result = await run(request, service, body.definition_text or body.definition_json,
                                body.plan_id, body.options_json, tensors, "json")
    outputs = await run_in_threadpool(lambda: [
        (name, to_array(t), NAMES[t.dtype]) for name, t in result.outputs])
    values = sum(v.size for _, v, _ in outputs)
    content = await service.off_loop(encode_execute, plan_id, result.backend, outputs,
                                     result.timings, client=client,
                                     in_process=values > INLINE_VALUES)
    return Response(content, media_type=JSON)


async def execute_safetensors(request: Request, service: Service, content_type: str,
                              plan_id: str | None) -> Response:
    definition: str | None = None
    options = PlanOptionsModel()
    if content_type == SAFETENSORS:
        raw = await read_body(request)
        if plan_id is None:
            raise Problem(422, "no plan", "an application/octet-stream body runs a plan made "
                                          "before (POST /v1/plan): POST it to "
                                          "/v1/plans/{plan_id}/execute, or name the plan in an "
                                          "X-Fusecut-Plan-Id header; or send "
                                          "multipart/form-data with a definition part")
    else:
        form = await read_form(request, service)
        part = form.get("tensors")
        if part is None or isinstance(part, str):
            raise Problem(422, "no tensors", "the multipart body needs a 'tensors' file part "
                                             "(safetensors)")
        raw = await part.read()
        plan_id = text_part(form, "plan_id") or plan_id
        definition = text_part(form, "definition")
        if text_part(form, "options"):
            options = parse_model(PlanOptionsModel, text_part(form, "options"))
    what_to_run(definition, plan_id)
    if definition is None:  # the plan's input count caps the tensors, before any is read
        max_tensors = await run_in_threadpool(service.plan_inputs, plan_id)
        if max_tensors is None:
            raise Problem(404, "unknown plan", f"no plan has id {plan_id!r}")
    else:  # a definition's inputs are known once it is parsed: its op limit bounds them
        max_tensors = service.settings.max_ops
    client = client_of(request)
    tensors = await service.decode_tensors(raw, max_tensors, client)
    del raw  # the body: the tensors are copies
    plan_id, result = await run(request, service, definition, plan_id,
                                options.model_dump_json(), tensors, "safetensors")
    # the timings go in the body (the header's __metadata__), and in a header only while it
    # stays small: one header grew with the plan (163 KB for 1,500 segments), past what
    # proxies and clients take (issue 45)
    segments = json.dumps(result.timings, separators=(",", ":"))
    content = await run_in_threadpool(  # a view, no copy
        safetensors.dump, dict(result.outputs),
        {"fusecut.plan_id": plan_id, "fusecut.backend": result.backend,
         "fusecut.segments": segments})
    headers = {"X-Fusecut-Plan-Id": plan_id, "X-Fusecut-Backend": result.backend}
    if len(segments) <= MAX_SEGMENTS_HEADER_BYTES:
        headers["X-Fusecut-Segments"] = segments
    return Response(content, media_type=SAFETENSORS, headers=headers)


async def read_form(request: Request, service: Service):
    """A multipart body's parts: its text parts (a definition, above all) as large as a
    POST /v1/plan body may be, not the framework's 1 MiB (a 15,000-op definition is 1.1 MB of
    wire JSON; the op limit is 20,000)."""
    limit = service.settings.max_plan_body_bytes
    try:
        return await request.form(max_part_size=limit, max_fields=100)
    except StarletteHTTPException as e:
        if e.status_code == 400 and "maximum size" in str(e.detail):
            raise Problem(413, "part too large",
                          f"a multipart text part (definition, plan_id, options) may take "
                          f"{limit:,} bytes (FUSECUT_MAX_PLAN_BODY_BYTES)") from None
        raise


def what_to_run(definition: str | None, plan_id: str | None) -> None:
    if plan_id is not None and definition is not None:
        raise Problem(422, "ambiguous request", "give a definition or a plan_id, not both")
    if plan_id is None and definition is None:
        raise Problem(422, "no definition", "give a definition or a plan_id")


async def run(request: Request, service: Service, definition: str | None,
              plan_id: str | None, options_json: str, tensors: dict[str, Any], wire: str
              ) -> tuple[str, ExecutionResult]:
    """Run the plan given, or the plan made (or found) for a definition: (its id, the
    result)."""
    service.check_size(tensors)
    what_to_run(definition, plan_id)
    client = client_of(request)
    if plan_id is not None:
        return plan_id, await service.execute(plan_id, tensors, wire, client)
    return await service.execute_definition(definition, options_json, tensors, wire, client,
                                            request.is_disconnected)


def parse_model(model: type[M], raw: bytes | str) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise validation_problem(list(e.errors())) from None


def text_part(form, name: str) -> str | None:
    value = form.get(name)
    if value is not None and not isinstance(value, str):
        raise Problem(422, "invalid request", f"multipart part {name!r} must be text, not a file")
    return value
