"""The service's OpenAPI document: request and problem schemas under components, every error
answered as problem+json documented, and Swagger UI's files served from the package (no CDN; the
/docs page is service.routes.docs).

Swagger UI's files come from the ``swagger-ui-bundle`` package (Swagger UI is Apache-2.0, as is
that package).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from fusecut.service.models import ExecuteRequest, PlanOptionsModel, PlanRequest
from fusecut.service.problems import PROBLEM

REF = "#/components/schemas/{model}"
DOCS_ASSETS = "/docs/assets"


class ProblemDetails(BaseModel):
    """An error (RFC 9457)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    request_id: str | None = Field(None, description="on a 500: the id to find it in the log")
    errors: list[dict[str, Any]] | None = Field(None, description="invalid fields, up to 20")


# POST /v1/execute's multipart body: a safetensors part, and a definition or a plan id
MULTIPART_EXECUTE = {
    "type": "object", "required": ["tensors"],
    "oneOf": [{"required": ["definition"]}, {"required": ["plan_id"]}],
    "properties": {
        "definition": {"type": "string", "minLength": 1,
                       "description": "nvFuser Python text or wire JSON v1"},
        "plan_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "options": {"type": "string", "description": "PlanOptionsModel as JSON"},
        "tensors": {"type": "string", "format": "binary",
                    "description": "safetensors, one tensor per fusion input"}}}
EXECUTE_WAYS = (
    "Tensors travel as KServe-v2 JSON (`application/json`) or as a safetensors part of a "
    "`multipart/form-data` body, with the definition or the id of a plan made before. Raw "
    "safetensors (`application/octet-stream`) go to `POST /v1/plans/{plan_id}/execute` (this "
    "route also takes them with the plan id in an `X-Fusecut-Plan-Id` header).")

WHY = {400: "the request is malformed", 401: "the API key is missing or wrong",
       404: "no such plan", 405: "the method is not allowed (see the Allow header)",
       413: "the body, definition or tensors are over a limit",
       415: "the body's media type is not accepted", 422: "the request is invalid (the "
       "detail names the field, op, input or axis)",
       429: "this client has too many requests running or waiting (see Retry-After)",
       500: "a fusecut bug (with a request id)",
       503: "the service is busy, or a worker or planner is unavailable (see Retry-After)",
       504: "the execution timed out"}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Route ``responses`` entries: each status answered as problem+json."""
    schema = {"$ref": REF.format(model="ProblemDetails")}
    return {s: {"description": WHY[s], "content": {PROBLEM: {"schema": schema}}}
            for s in statuses}


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": REF.format(model=model.__name__)}


def install(app: FastAPI, keyed: tuple[str, ...] = ()) -> None:
    """Give ``app`` a complete OpenAPI document (``keyed``: the paths, and prefixes ending in
    "/", that need the API key) and Swagger UI's files, for an offline /docs."""

    def needs_key(path: str) -> bool:
        return any(path == k or (k.endswith("/") and path.startswith(k)) for k in keyed)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary,
                              routes=app.routes)
            _, top = models_json_schema(
                [(m, "validation") for m in (PlanRequest, ExecuteRequest, PlanOptionsModel)]
                + [(ProblemDetails, "serialization")], ref_template=REF)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(top.get("$defs", {}))
            # FastAPI's own 422 body is not what this service sends
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            for path, item in doc["paths"].items():
                for operation in item.values():
                    responses = operation.get("responses", {})
                    if "422" in responses and PROBLEM not in responses["422"].get("content", {}):
                        responses["422"] = problems(422)[422]
                    if needs_key(path):
                        operation["security"] = [{"apiKey": []}]
            if keyed:
                doc["components"]["securitySchemes"] = {"apiKey": {
                    "type": "http", "scheme": "bearer",
                    "description": "the service's FUSECUT_API_KEY"}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
    import swagger_ui_bundle

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path),
              name="docs-assets")
