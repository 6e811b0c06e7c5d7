"""Media types of the bodies the routes take and send, and the check of a request's."""

from __future__ import annotations

from fastapi import Request

from fusecut.service.problems import Problem

JSON = "application/json"
SAFETENSORS = "application/octet-stream"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def require_media_type(request: Request, expected: str) -> None:
    given = media_type(request)
    if given != expected:
        raise Problem(415, "unsupported media type",
                      f"send {expected}, not {given or 'nothing'}")
