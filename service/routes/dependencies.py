"""What routes take from a request: the service, the caller's right to call (the API key), and
who the caller is (for the per-client limits)."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, Request

from fusecut.service.core import Service
from fusecut.service.problems import Problem
from fusecut.service.security import key_matches


def service_of(request: Request) -> Service:
    """The app's Service (create_app puts it on ``app.state``)."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(service_of)]


def require_api_key(request: Request, service: ServiceDep) -> None:
    """Refuse a request without the service's API key, when it has one (FUSECUT_API_KEY)."""
    api_key = service.settings.api_key
    if api_key is None:
        return
    if not key_matches(request.headers.get("authorization", ""), api_key):
        raise Problem(401, "unauthorized", "this service needs 'Authorization: Bearer "
                                           "<api key>'",
                      headers={"WWW-Authenticate": "Bearer"})


def client_of(request: Request) -> str:
    """Who a request is from, for the per-client limits: its API key when the service has one
    (the key is checked first), else its address. Without a key to check, a client could name
    itself anew with each made-up Authorization header (issue 32)."""
    key = request.headers.get("authorization")
    if key and service_of(request).settings.api_key is not None:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return "addr:" + (request.client.host if request.client else "?")
