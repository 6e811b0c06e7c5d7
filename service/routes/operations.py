"""Operations routes: GET /metrics (Prometheus), /healthz (the service answers), /readyz (a
worker is up) and / (where things are).

``metrics`` is a router of its own: whether /metrics needs the API key is a setting
(FUSECUT_METRICS_NEED_KEY), applied where create_app includes it.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from fusecut.service import metrics as service_metrics
from fusecut.service.routes.dependencies import ServiceDep

REPLICA = f"{socket.gethostname()}:{os.getpid()}"  # which replica answered, behind a balancer

metrics = APIRouter()
router = APIRouter()


@metrics.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format", "content": {
                 "text/plain": {"schema": {"type": "string"}}}}})
async def get_metrics(service: ServiceDep) -> Response:
    service_metrics.WORKER_UP.set(1 if service.ready else 0)
    service_metrics.record_devices(service.worker)
    content, media_type = service_metrics.exposition()
    return Response(content, media_type=media_type)


@router.get("/healthz", summary="The service answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="A worker is up (and whether the plan cache works)")
async def readyz(service: ServiceDep) -> JSONResponse:
    w = service.worker
    cache = await run_in_threadpool(service.store.status)
    # a failing cache is "degraded", not unready: plans are still made and returned
    status = "not ready" if not w.ready else "ready" if cache["state"] == "ok" else "degraded"
    body = {"status": status, "replica": REPLICA,
            "worker": "up" if w.ready else "down", "device": w.device,
            "worker_pid": w.pid, "worker_restarts": w.restarts,
            "workers": w.snapshot(), "planner_pids": service.planners.pids,
            "plans_stored": cache["plans"], "cache": cache}
    return JSONResponse(body, status_code=200 if w.ready else 503)


@router.get("/", include_in_schema=False)
async def index() -> dict[str, Any]:
    return {"service": "fusecut", "docs": "/docs", "dashboard": "/dashboard",
            "routes": ["/v1/plan", "/v1/plans/{plan_id}", "/v1/execute",
                       "/v1/plans/{plan_id}/execute", "/metrics", "/healthz", "/readyz"]}
