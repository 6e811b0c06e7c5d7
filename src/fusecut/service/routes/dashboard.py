"""GET /dashboard: the recent plans, as a page (rendered by service.dashboard)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from fusecut.service.dashboard import render, render_recent
from fusecut.service.routes.dependencies import ServiceDep, client_of

router = APIRouter()


@router.get("/dashboard", response_class=HTMLResponse, summary="Recent plans")
async def dashboard(request: Request, service: ServiceDep) -> HTMLResponse:
    s = service.settings
    worker = {"device": service.worker.device, "up": service.ready}
    page = await service.off_loop(render_recent, s.cache_location, s.recent_plans, worker,
                                  client=client_of(request))
    if page is None:  # a cache only the service's process can read (":memory:")
        page = await run_in_threadpool(lambda: render(service.store.recent(s.recent_plans),
                                                      worker))
    return HTMLResponse(page)
