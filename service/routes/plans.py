"""Planning routes: POST /v1/plan (a plan from a definition and input metadata, no tensors) and
GET /v1/plans/{plan_id} (a plan made before)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from fusecut.optimizer.plan.plan import request_key
from fusecut.service import openapi
from fusecut.service.models import PlanRequest
from fusecut.service.problems import Problem
from fusecut.service.routes.dependencies import ServiceDep, client_of, require_api_key
from fusecut.service.routes.media import JSON, require_media_type

PlanId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="a plan id: 32 hex digits")]

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


@router.post("/plan", summary="Plan a fusion (no tensors)", openapi_extra={
    "requestBody": {"required": True, "content": {JSON: {
        "schema": openapi.schema_of(PlanRequest)}}}}, responses={
    200: {"description": "the Plan JSON", "content": {JSON: {"schema": {"type": "object"}}}},
    **openapi.problems(400, 401, 413, 415, 422, 429, 500, 503)})
async def post_plan(request: Request, service: ServiceDep) -> Response:
    # A repeated request is answered from the hash of its bytes (hashlib lets go of the GIL);
    # anything else is validated, parsed and planned in a planner process, so a huge or hostile
    # body stalls no other request.
    require_media_type(request, JSON)
    raw = await request.body()
    raw_key = "raw:" + await run_in_threadpool(request_key, raw)
    cached, outcome = await service.plan_request(raw, raw_key, client_of(request),
                                                 request.is_disconnected)
    return Response(cached.body, media_type=JSON, headers={"X-Fusecut-Cache": outcome})


@router.get("/plans/{plan_id}", summary="A plan made before", responses={
    200: {"description": "the Plan JSON", "content": {JSON: {"schema": {"type": "object"}}}},
    **openapi.problems(401, 404, 422, 500)})
async def get_plan(plan_id: PlanId, service: ServiceDep) -> Response:
    stored = await run_in_threadpool(service.store.get, plan_id)
    if stored is None:
        raise Problem(404, "unknown plan", f"no plan has id {plan_id!r}")
    return Response(stored.body, media_type=JSON)
