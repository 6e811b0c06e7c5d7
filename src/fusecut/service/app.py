"""The fusecut HTTP service (FastAPI): plan without tensors, execute with tensors.

    uvicorn --factory service.app:create_app      # or: fusecut serve

Routes: POST /v1/plan, GET /v1/plans/{plan_id}, POST /v1/execute, POST
/v1/plans/{plan_id}/execute, GET /metrics, GET /healthz, GET /readyz, GET /dashboard. Errors are
problem+json (RFC 9457) naming the field, op or tensor.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import socket
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Path, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from fusecut.service import metrics, openapi, problems
from fusecut.service.bodies import read_body
from fusecut.service.core import Service
from fusecut.service.dashboard import render, render_recent
from fusecut.service.execute_bodies import (
    INLINE_BODY_BYTES,
    INLINE_VALUES,
    decode_execute,
    encode_execute,
)
from fusecut.service.models import ExecuteRequest, PlanOptionsModel, PlanRequest
from fusecut.service.problems import Problem, validation_problem
from fusecut.service.security import CrossOrigin, SecurityHeaders, allowed_origins, key_matches
from fusecut.service.settings import Settings
from fusecut.wire import safetensors
from fusecut.wire.tensors import NAMES, from_array, load_safetensors, to_array

JSON = "application/json"
REPLICA = f"{socket.gethostname()}:{os.getpid()}"
SAFETENSORS = "application/octet-stream"
PLAN_ID = r"^[0-9a-f]{32}$"
M = TypeVar("M", bound=BaseModel)


def create_app(settings: Settings | None = None, worker=None) -> FastAPI:
    settings = settings or Settings.from_env()
    service = Service(settings, worker)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        # Everything imported so far (torch, OR-Tools, pydantic models) lives as long as the
        # process: keep it out of the collector's full passes, which would stall requests.
        gc.collect()
        gc.freeze()
        yield
        service.stop()

    app = FastAPI(title="fusecut", version="0.1.0", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  summary="Segmentation and rematerialization optimizer for GPU fusions")
    openapi.install(app, secured=settings.api_key is not None)
    app.state.service = service
    problems.install(app)
    app.add_middleware(problems.BodyLimit, limit=settings.max_body_bytes,
                       per_path={"/v1/plan": min(settings.max_plan_body_bytes,
                                                    settings.max_body_bytes)})
    # (each middleware added wraps the ones before it)
    if settings.cors_origins:  # preflights and response headers for the allowed origins
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["X-Fusecut-Plan-Id", "X-Fusecut-Backend",
                                           "X-Fusecut-Segments", "X-Fusecut-Cache",
                                           "X-Request-Id", "Retry-After"])
    app.add_middleware(CrossOrigin, allowed=allowed_origins(settings.cors_origins))
    app.add_middleware(problems.RequestIds)  # outside BodyLimit: its 413s carry an id too
    app.add_middleware(SecurityHeaders)  # on every answer, 500s included
    app.add_middleware(metrics.CountRequests)

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        if not key_matches(request.headers.get("authorization", ""), settings.api_key):
            raise Problem(401, "unauthorized", "this service needs 'Authorization: Bearer "
                                               "<api key>'",
                          headers={"WWW-Authenticate": "Bearer"})

    def client_of(request: Request) -> str:
        """Who a request is from, for the per-client limits: its API key, else its address."""
        key = request.headers.get("authorization")
        if key:
            return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
        return "addr:" + (request.client.host if request.client else "?")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    # ---- planning ------------------------------------------------------------------------------

    plan_body = {"required": True, "content": {JSON: {"schema": openapi.schema_of(PlanRequest)}}}

    @v1.post("/plan", summary="Plan a fusion (no tensors)", openapi_extra={
        "requestBody": plan_body}, responses={
                  200: {"description": "the Plan JSON", "content": {JSON: {"schema": {
                      "type": "object"}}}},
                  **openapi.problems(400, 401, 413, 415, 422, 429, 500, 503)})
    async def post_plan(request: Request) -> Response:
        # A repeated request is answered from the hash of its bytes (hashlib lets go of the
        # GIL); anything else is validated, parsed and planned in a planner process, so a huge
        # or hostile body stalls no other request.
        require_media_type(request, JSON)
        raw = await request.body()
        raw_key = "raw:" + await run_in_threadpool(lambda: hashlib.sha256(raw).hexdigest())
        cached, outcome = await service.plan_request(raw, raw_key, client_of(request),
                                                     request.is_disconnected)
        return Response(cached.body, media_type=JSON, headers={"X-Fusecut-Cache": outcome})

    @v1.get("/plans/{plan_id}", summary="A plan made before", responses={
        200: {"description": "the Plan JSON", "content": {JSON: {"schema": {"type": "object"}}}},
        **openapi.problems(401, 404, 422, 500)})
    async def get_plan(plan_id: str = Path(pattern=PLAN_ID,
                                           description="a plan id: 32 hex digits")) -> Response:
        stored = await run_in_threadpool(service.store.get, plan_id)
        if stored is None:
            raise Problem(404, "unknown plan", f"no plan has id {plan_id!r}")
        return Response(stored.body, media_type=JSON)

    # ---- execution -----------------------------------------------------------------------------

    async def resolve(request: Request, definition: str | None, plan_id: str | None,
                      options_json: str, tensors: dict[str, Any]) -> str:
        """The id of the plan to run: given, or made (or found) for a definition."""
        service.check_size(tensors)
        if plan_id is not None and definition is not None:
            raise Problem(422, "ambiguous request", "give a definition or a plan_id, not both")
        if plan_id is not None:
            return plan_id
        if definition is None:
            raise Problem(422, "no definition", "give a definition or a plan_id")
        return await service.plan_for_tensors(definition, options_json, tensors,
                                              client_of(request), request.is_disconnected)

    outputs_doc = {200: {"description": "the outputs: KServe-v2 JSON for a JSON request, "
                                        "safetensors otherwise",
                         "content": {JSON: {"schema": {"type": "object"}},
                                     SAFETENSORS: {"schema": {"type": "string",
                                                              "format": "binary"}}}},
                   **openapi.problems(400, 401, 404, 413, 415, 422, 429, 500, 503, 504)}
    execute_body = {"required": True, "content": {
        JSON: {"schema": openapi.schema_of(ExecuteRequest)},
        "multipart/form-data": {"schema": openapi.MULTIPART_EXECUTE}}}

    @v1.post("/execute", summary="Run a fusion on tensors", openapi_extra={
        "requestBody": execute_body, "description": openapi.EXECUTE_WAYS}, responses=outputs_doc)
    async def post_execute(request: Request) -> Response:
        content_type = media_type(request)
        if content_type == JSON:
            return await execute_json(request)
        if content_type in ("multipart/form-data", SAFETENSORS):
            return await execute_safetensors(request, content_type,
                                             request.headers.get("x-fusecut-plan-id"))
        raise Problem(415, "unsupported media type",
                      f"send application/json (KServe-v2 tensors), multipart/form-data or "
                      f"application/octet-stream (safetensors), not {content_type or 'nothing'}")

    @v1.post("/plans/{plan_id}/execute", summary="Run a plan made before on tensors",
             openapi_extra={"requestBody": {"required": True, "content": {SAFETENSORS: {
                 "schema": {"type": "string", "format": "binary"}}}}}, responses=outputs_doc)
    async def post_plan_execute(request: Request, plan_id: str = Path(
            pattern=PLAN_ID, description="a plan id: 32 hex digits")) -> Response:
        require_media_type(request, SAFETENSORS)
        return await execute_safetensors(request, SAFETENSORS, plan_id)

    async def execute_json(request: Request) -> Response:
        # Validated and decoded off the event loop (see execute_bodies), in a planner process
        # when big; the loop only turns numpy arrays into tensors and back.
        raw = await request.body()
        client = client_of(request)
        body = await service.off_loop(decode_execute, raw, settings, client=client,
                                      in_process=len(raw) > INLINE_BODY_BYTES)
        tensors = await run_in_threadpool(lambda: {
            name: from_array(values, datatype) for name, (values, datatype) in body.arrays.items()})
        plan_id = await resolve(request, body.definition_text or body.definition_json,
                                body.plan_id, body.options_json, tensors)
        response = await service.execute(plan_id, tensors, "json", client)
        outputs = await run_in_threadpool(lambda: [
            (name, to_array(t), NAMES[t.dtype]) for name, t in response["outputs"]])
        values = sum(v.size for _, v, _ in outputs)
        content = await service.off_loop(encode_execute, plan_id, response["backend"],
                                         outputs, response["timings"], client=client,
                                         in_process=values > INLINE_VALUES)
        return Response(content, media_type=JSON)

    async def execute_safetensors(request: Request, content_type: str,
                                  plan_id: str | None) -> Response:
        definition: str | None = None
        options = PlanOptionsModel()
        if content_type == SAFETENSORS:
            raw = await read_body(request)
            if plan_id is None:
                raise Problem(422, "no plan", "an application/octet-stream body runs a plan "
                                              "made before (POST /v1/plan): POST it to "
                                              "/v1/plans/{plan_id}/execute, or name the plan in "
                                              "an X-Fusecut-Plan-Id header; or send "
                                              "multipart/form-data with a definition part")
        else:
            form = await request.form()
            part = form.get("tensors")
            if part is None or isinstance(part, str):
                raise Problem(422, "no tensors", "the multipart body needs a 'tensors' file "
                                                 "part (safetensors)")
            raw = await part.read()
            plan_id = text_part(form, "plan_id") or plan_id
            definition = text_part(form, "definition")
            if text_part(form, "options"):
                options = parse_model(PlanOptionsModel, text_part(form, "options"))
        tensors = await run_in_threadpool(load_safetensors, raw)
        client = client_of(request)
        plan_id = await resolve(request, definition, plan_id, options.model_dump_json(), tensors)
        response = await service.execute(plan_id, tensors, "safetensors", client)
        outputs = dict(response["outputs"])
        content = await run_in_threadpool(safetensors.dump, outputs)  # a view, no copy
        return Response(content, media_type=SAFETENSORS,
                        headers={"X-Fusecut-Plan-Id": plan_id,
                                 "X-Fusecut-Backend": response["backend"],
                                 "X-Fusecut-Segments": json.dumps(response["timings"])})

    app.include_router(v1)

    # ---- operations ----------------------------------------------------------------------------

    metrics_auth = [Depends(authorize)] if settings.metrics_need_key else []

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
             dependencies=metrics_auth, responses={
                 200: {"description": "Prometheus text format", "content": {
                     "text/plain": {"schema": {"type": "string"}}}},
                 **(openapi.problems(401) if metrics_auth else {})})
    async def get_metrics() -> Response:
        metrics.WORKER_UP.set(1 if service.ready else 0)
        metrics.record_devices(service.worker)
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)

    @app.get("/healthz", summary="The service answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="A worker is up (and whether the plan cache works)")
    async def readyz() -> JSONResponse:
        w = service.worker
        cache = await run_in_threadpool(service.store.status)
        # a failing cache is "degraded", not unready: plans are still made and returned
        status = "not ready" if not w.ready else "ready" if cache["state"] == "ok" else \
            "degraded"
        body = {"status": status, "replica": REPLICA,  # which replica behind a balancer
                "worker": "up" if w.ready else "down", "device": w.device,
                "worker_pid": w.pid, "worker_restarts": w.restarts,
                "workers": w.snapshot(), "planner_pids": service.planners.pids,
                "plans_stored": cache["plans"], "cache": cache}
        return JSONResponse(body, status_code=200 if w.ready else 503)

    @app.get("/dashboard", response_class=HTMLResponse, summary="Recent plans")
    async def dashboard(request: Request) -> HTMLResponse:
        worker = {"device": service.worker.device, "up": service.ready}
        page = await service.off_loop(render_recent, settings.cache_location,
                                      settings.recent_plans, worker, client=client_of(request))
        if page is None:  # a cache only the service's process can read (":memory:")
            page = await run_in_threadpool(lambda: render(
                service.store.recent(settings.recent_plans), worker))
        return HTMLResponse(page)

    @app.get("/", include_in_schema=False)
    async def index() -> dict[str, Any]:
        return {"service": "fusecut", "docs": "/docs", "dashboard": "/dashboard",
                "routes": ["/v1/plan", "/v1/plans/{plan_id}", "/v1/execute",
                           "/v1/plans/{plan_id}/execute", "/metrics", "/healthz", "/readyz"]}

    return app


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def require_media_type(request: Request, expected: str) -> None:
    given = media_type(request)
    if given != expected:
        raise Problem(415, "unsupported media type",
                      f"send {expected}, not {given or 'nothing'}")


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

