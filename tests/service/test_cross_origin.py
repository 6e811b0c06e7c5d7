"""A page elsewhere cannot use a visitor's browser to call the service: bodies of a form's media
types are refused, other origins get a 403 (allowed ones CORS headers), so do requests naming
the service by a host name it does not answer to (DNS rebinding), and every answer carries the
security headers a browser needs.

From the hostile-input reviews of issue 19 (defect 16) and issue 32 (defect 10).
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

        # issue 32, defect 10: a page whose name resolves here (DNS rebinding) sends its own
        # name in Host, and its origin then looked like the service's own
        port = server.url.rsplit(":", 1)[1]
        rebound = {"host": f"attacker.example:{port}"}
        evil = http.post("/v1/execute", headers={**rebound,
                                                 "origin": f"http://attacker.example:{port}"},
                         **form)
        assert_problem(evil, 403, "attacker.example", "FUSECUT_ALLOWED_HOSTS")
        for route in ("/v1/plans/" + "0" * 32, "/dashboard", "/metrics"):  # GETs: no Origin
            assert_problem(http.get(route, headers=rebound), 403, "attacker.example")
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert http.get("/healthz", headers={"host": host}).status_code == 200, host
        assert http.post("/v1/execute", headers={"origin": f"http://localhost:{port}",
                                                 "host": f"localhost:{port}"}, **form
                         ).status_code == 200


def test_allowed_hosts_extend_the_loopback_names():
    import asyncio

    from fusecut.service.app import create_app
    from fusecut.service.security import allowed_hosts, host_name
    from fusecut.service.settings import Settings

    assert allowed_hosts("") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("*") is None
    assert [host_name(h) for h in ("a.example:80", "[::1]:8000", "[::1]", "B.example")] == \
        ["a.example", "::1", "::1", "b.example"]
    for setting, host, status in (("fusecut, fusecut-2", "fusecut-2:8000", 200),
                                  ("fusecut", "other:8000", 403), ("*", "other:8000", 200)):
        app = create_app(Settings(db_path=":memory:", allowed_hosts=setting, worker=False))
        assert asyncio.run(status_of(app, host)) == status, (setting, host)


async def status_of(app, host: str) -> int:
    """The status of GET /healthz on ``app`` (not started: no workers) with this Host."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url=f"http://{host}") as client:
        return (await client.get("/healthz")).status_code
