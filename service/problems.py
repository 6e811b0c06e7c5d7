"""Errors as problem+json (RFC 9457): every failure the service answers names what was wrong.

``Problem`` is raised by the routes; ``install`` maps it, fusecut's own errors and request
validation errors to problem+json responses. ``EXECUTION_FAILURES`` is the one table of how each
kind of failed execution is answered (whichever worker ran it: inline, in a worker process, or
on a Ray executor replica). ``RequestIds`` gives every request an id (the
``X-Request-Id`` header) and turns anything unexpected into a problem+json 500 carrying it, with the
connection kept. ``BodyLimit`` refuses a body over the size limit before it is read whole.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from fusecut.optimizer.errors import DefinitionError, FusecutError, InputError, PlanError
from fusecut.service.processes.results import ExecutionFailure, FailureKind

log = logging.getLogger("fusecut.service")
PROBLEM = "application/problem+json"
TITLES = {DefinitionError: "invalid definition", InputError: "inputs do not match",
          PlanError: "cannot plan"}


class Problem(Exception):
    """An error answered as problem+json."""

    def __init__(self, status: int, title: str, detail: str,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.title, self.detail, self.extra = status, title, detail, extra
        self.headers = headers  # e.g. Retry-After on a 503


def problem_response(status: int, title: str, detail: str, instance: str | None = None,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


@dataclass(frozen=True)
class FailureResponse:
    """How a kind of failure is answered: its status and title; how soon to retry (a
    ``Retry-After`` header); and, where the failure's message is for the log only (it may hold
    internals), the detail the client is told instead."""

    status: int
    title: str
    retry_after_s: int | None = None
    detail: str | None = None


EXECUTION_FAILURES: dict[FailureKind, FailureResponse] = {
    FailureKind.INVALID_DEFINITION: FailureResponse(422, "cannot execute"),
    FailureKind.INPUTS_MISMATCH: FailureResponse(422, "inputs do not match"),
    FailureKind.CANNOT_EXECUTE: FailureResponse(422, "cannot execute"),
    FailureKind.RESULT_TOO_LARGE: FailureResponse(413, "result too large"),
    FailureKind.UNKNOWN_PLAN: FailureResponse(404, "unknown plan"),
    FailureKind.WORKER_CRASHED: FailureResponse(503, "worker crashed", retry_after_s=2),
    FailureKind.WORKER_TIMED_OUT: FailureResponse(504, "execution timed out"),
    FailureKind.WORKER_UNAVAILABLE: FailureResponse(503, "worker unavailable", retry_after_s=2),
    FailureKind.EXECUTOR_BUSY: FailureResponse(503, "busy", retry_after_s=1),
    # ("InternalError": this kind's name in the answers before, kept in the detail clients see)
    FailureKind.INTERNAL: FailureResponse(500, "execution failed", detail=(
        "the execution failed on an unexpected error (InternalError; the service's log has "
        "the details)")),
}


def execution_problem(failure: ExecutionFailure, plan_id: str) -> Problem:
    """The answer to an execution of plan ``plan_id`` that failed (a bug's message is
    logged)."""
    response = EXECUTION_FAILURES[failure.kind]
    if response.detail is not None:
        log.error("execution of plan %s failed: %s: %s", plan_id, failure.kind.value,
                  failure.message)
    headers = None if response.retry_after_s is None else {
        "Retry-After": str(response.retry_after_s)}
    return Problem(response.status, response.title, response.detail or failure.message,
                   headers=headers)


def validation_problem(errors: list[dict[str, Any]]) -> Problem:
    """A 422 naming the first invalid field (pydantic's ``loc``), listing up to 20. A part of
    the location that is no field name (the form a union's value was read as, like "wire
    JSON") is shown in parentheses: ``definition (wire JSON).inputs``."""
    listed = [{"loc": [str(x) for x in err.get("loc", ())], "msg": err.get("msg", "")}
              for err in errors][:20]
    first = listed[0] if listed else {"loc": [], "msg": "invalid body"}
    where = ""
    for part in (x for x in first["loc"] if x not in ("body", "path")):
        where += f" ({part})" if " " in part else f".{part}" if where else part
    where = where or "body"
    given = errors[0].get("input") if errors else None
    got = f" (got {given[:40]!r})" if isinstance(given, str) else ""
    return Problem(422, "invalid request", f"{where}: {first['msg']}{got}", errors=listed)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem+json."""

    @app.exception_handler(Problem)
    async def on_problem(request: Request, e: Problem):
        return problem_response(e.status, e.title, e.detail, request.url.path, e.headers,
                                **e.extra)

    @app.exception_handler(FusecutError)
    async def on_fusecut_error(request: Request, e: FusecutError):
        title = next((t for cls, t in TITLES.items() if isinstance(e, cls)), "invalid request")
        return problem_response(422, title, str(e), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, e: RequestValidationError):
        p = validation_problem(list(e.errors()))
        return problem_response(p.status, p.title, p.detail, request.url.path, **p.extra)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, e: StarletteHTTPException):
        # keep the exception's headers: a 405 carries Allow
        return problem_response(e.status_code, str(e.detail), str(e.detail), request.url.path,
                                headers=getattr(e, "headers", None))



class BodyLimit:
    """Pure ASGI middleware: refuse bodies over ``limit`` bytes (or the path's own limit, or
    the media type's, whichever is lower), by the Content-Length header before reading, or as
    they stream."""

    def __init__(self, app, limit: int, per_path: dict[str, int] | None = None,
                 per_media: dict[str, int] | None = None):
        self.app, self.default, self.per_path = app, limit, per_path or {}
        self.per_media = {k.encode(): v for k, v in (per_media or {}).items()}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        limit = self.per_path.get(scope.get("path", ""), self.default)
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if media in self.per_media and self.per_media[media] < limit:
            limit = self.per_media[media]
        detail = f"the body is over the limit of {limit} bytes"
        if media == b"application/json" and media in self.per_media and \
                limit == self.per_media[media]:
            detail += " for JSON (send large tensors as safetensors)"
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await problem_response(413, "request too large", detail,
                                          scope.get("path"))(scope, receive, send)
        seen = 0
        started = refused = False

        async def counted_receive():
            # Over the limit: answer 413 now, tell the app the client left, drop what it sends.
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit and not refused:
                    refused = True
                    if not started:
                        await problem_response(413, "request too large", detail,
                                               scope.get("path"))(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except Exception:
            if not refused:  # errors after a refusal are the app noticing the "disconnect"
                raise


REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")


class RequestIds:
    """Pure ASGI middleware: an id per request (the client's ``X-Request-Id`` when it is a sane
    token, else a new one), sent back in the ``X-Request-Id`` header; an exception escaping the
    app is logged with that id and answered as a problem+json 500 naming it. Answering it here,
    instead of in Starlette's error middleware, which re-raises into the server, keeps the
    keep-alive connection open."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"")
        request_id = given.decode() if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # the client left mid-request: nobody to answer
            return
        except Exception:  # a fusecut bug: say so, with the id to find it in the log
            log.exception("unhandled error on %s (request id %s)", scope.get("path"),
                          request_id)
            if started:  # the status line is gone: nothing truthful can be sent now
                raise
            # the exception's text stays in the log: it may hold internals (paths, raw bytes)
            response = problem_response(500, "internal error",
                                        f"an unexpected error (a fusecut bug); the service's "
                                        f"log has it under request id {request_id}",
                                        scope.get("path"), request_id=request_id)
            await response(scope, receive, send_with_id)
