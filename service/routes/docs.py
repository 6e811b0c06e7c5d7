"""GET /docs: Swagger UI on the service's OpenAPI document, its files served from the package
(service.openapi mounts them), nothing loaded from elsewhere."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from fusecut.service.openapi import DOCS_ASSETS
from fusecut.service.security import DOCS_POLICY

router = APIRouter()


@router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    page = get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} API",
                               swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")
    page.headers["content-security-policy"] = DOCS_POLICY
    return page
