"""The fusecut HTTP service (FastAPI): plan without tensors, execute with tensors.

    uvicorn --factory fusecut.service.app:create_app      # or: fusecut serve

The routes are in service.routes (POST /v1/plan, GET /v1/plans/{plan_id}, POST /v1/execute,
POST /v1/plans/{plan_id}/execute, GET /metrics, /healthz, /readyz, /dashboard, /docs); the state
behind them is service.core.Service. Errors are problem+json (RFC 9457) naming the field, op or
tensor.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager, suppress

from fastapi import Depends, FastAPI

from fusecut.service import metrics, openapi, problems
from fusecut.service.core import Service
from fusecut.service.routes import dashboard, docs, executions, operations, plans
from fusecut.service.routes.dependencies import require_api_key
from fusecut.service.security import (
    AllowedHosts,
    CrossOrigin,
    SecurityHeaders,
    allowed_hosts,
    allowed_origins,
)
from fusecut.service.settings import Settings
from fusecut.version import __version__

EXPOSED_HEADERS = ["X-Fusecut-Plan-Id", "X-Fusecut-Backend", "X-Fusecut-Segments",
                   "X-Fusecut-Cache", "X-Request-Id", "Retry-After"]


def create_app(settings: Settings | None = None, worker=None) -> FastAPI:
    """The service's ASGI app. ``worker`` runs executions: a WorkerPool on the devices of
    ``settings`` by default; Ray Serve passes a handle on its execute deployment."""
    settings = settings or Settings.from_env()
    app = FastAPI(title="fusecut", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  summary="Segmentation and rematerialization optimizer for GPU fusions")
    app.state.service = Service(settings, worker)
    # what needs the API key, when there is one: the /v1 routes, the dashboard (it shows plan
    # ids, names and ops), and /metrics if so set
    keyed = ("/v1/", "/dashboard", *(["/metrics"] if settings.metrics_need_key else []))
    openapi.install(app, keyed if settings.api_key is not None else ())
    problems.install(app)
    app.add_middleware(problems.BodyLimit, limit=settings.max_body_bytes,
                       per_path={"/v1/plan": min(settings.max_plan_body_bytes,
                                                    settings.max_body_bytes)},
                       per_media={"application/json": settings.max_json_body_bytes})
    # (each middleware added wraps the ones before it)
    if settings.cors_origins:  # preflights and response headers for the allowed origins
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=EXPOSED_HEADERS)
    app.add_middleware(CrossOrigin, allowed=allowed_origins(settings.cors_origins))
    app.add_middleware(AllowedHosts, allowed=allowed_hosts(settings.allowed_hosts))
    app.add_middleware(problems.RequestIds)  # outside BodyLimit: its 413s carry an id too
    app.add_middleware(SecurityHeaders)  # on every answer, 500s included
    app.add_middleware(metrics.CountRequests)

    app.include_router(docs.router)
    app.include_router(plans.router)  # (the /v1 routers need the API key, if there is one)
    app.include_router(executions.router)
    metrics_key = [Depends(require_api_key)] if settings.metrics_need_key else []  # (keyed)
    app.include_router(operations.metrics, dependencies=metrics_key,
                       responses=openapi.problems(401) if metrics_key else None)
    app.include_router(operations.router)
    app.include_router(dashboard.router)
    return app


@asynccontextmanager
async def lifespan(app: FastAPI):
    service: Service = app.state.service
    service.start()
    # Everything imported so far (torch, OR-Tools, pydantic models) lives as long as the
    # process: keep it out of the collector's full passes, which would stall requests.
    gc.collect()
    gc.freeze()
    announcing = asyncio.create_task(announce_ready(service))
    yield
    announcing.cancel()
    with suppress(asyncio.CancelledError):
        await announcing
    service.stop()


async def announce_ready(service: Service, every_s: float = 0.1) -> None:
    """One line once /readyz says ready (uvicorn's "Application startup complete" comes
    seconds before the workers are up), saying where to look next (issue 45, new-user item 9).
    In uvicorn's log, at its info level."""
    while not service.ready:
        await asyncio.sleep(every_s)
    logging.getLogger("uvicorn.error").info(
        "fusecut %s is ready (GET /readyz): the API and its schemas at /docs, recent plans at "
        "/dashboard", __version__)
