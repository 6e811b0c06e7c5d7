"""GET /dashboard: the recent plans, as a page (rendered by service.dashboard; cached and gated
by ``Service.dashboard``). It shows plan ids, definition names and ops: with an API key set, it
needs the key, as the /v1 routes do."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from fusecut.service import openapi
from fusecut.service.routes.dependencies import ServiceDep, client_of, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/dashboard", response_class=HTMLResponse, summary="Recent plans",
            responses=openapi.problems(401, 429, 503))
async def dashboard(request: Request, service: ServiceDep) -> HTMLResponse:
    return HTMLResponse(await service.dashboard(client_of(request)))
