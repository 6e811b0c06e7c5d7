"""A page elsewhere cannot use a visitor's browser to call the service: bodies of a form's media
types are refused, other origins get a 403 (allowed ones CORS headers), and every answer carries
the security headers a browser needs.

From the hostile-input review of issue 19 (defect 16).
"""

from __future__ import annotations

import json

import httpx
import torch

from fusecut.wire.tensors import dump_safetensors
from tests.server import Server
from tests.service.test_service import assert_problem
from tests.service.workloads import NEG


def test_media_types_origins_and_security_headers(tmp_path):
    allowed = "https://notebook.example"
    with Server(tmp_path / "plans.sqlite", cors_origins=allowed) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        body = json.dumps({"definition": NEG, "inputs": [{"shape": [4], "dtype": "float32"}]})
        for media_type in ("text/plain", "application/x-www-form-urlencoded",
                           "multipart/form-data; boundary=x"):
            assert_problem(http.post("/v1/plan", content=body,
                                     headers={"content-type": media_type}), 415, "json")
        assert http.post("/v1/plan", content=body, headers={
            "content-type": "application/json; charset=utf-8"}).status_code == 200
        # a page elsewhere cannot use a visitor's browser to run things here
        form = {"files": {"tensors": ("t", dump_safetensors({"T0": torch.ones(4)}))},
                "data": {"definition": NEG}}
        evil = http.post("/v1/execute", headers={"origin": "https://evil.example"}, **form)
        assert_problem(evil, 403, "evil.example", "FUSECUT_CORS_ORIGINS")
        assert "access-control-allow-origin" not in evil.headers
        assert http.get("/metrics", headers={"origin": "https://evil.example"}
                        ).status_code == 403
        assert http.post("/v1/execute", headers={"origin": server.url}, **form
                         ).status_code == 200  # the service's own pages (/docs)
        ok = http.post("/v1/execute", headers={"origin": allowed}, **form)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed
        preflight = http.options("/v1/plan", headers={
            "origin": allowed, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == allowed
        assert http.options("/v1/plan", headers={
            "origin": "https://evil.example", "access-control-request-method": "POST"}
        ).status_code == 403
        for route in ("/healthz", "/dashboard", "/docs", "/v1/plans/" + "0" * 32):
            response = http.get(route)
            assert response.headers["x-content-type-options"] == "nosniff", route
            assert response.headers["x-frame-options"] == "DENY", route
        dashboard = http.get("/dashboard").headers["content-security-policy"]
        assert "default-src 'none'" in dashboard and "script-src" not in dashboard
        docs = http.get("/docs").headers["content-security-policy"]
        assert "script-src 'self'" in docs and "frame-ancestors 'none'" in docs
