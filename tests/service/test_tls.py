"""HTTPS (``fusecut serve --ssl-certfile --ssl-keyfile``), with the API key required on /metrics
too, and every route counted under its template in the request metrics.

From the hostile-input review of issue 19 (defect 16).
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from tests.server import Server
from tests.service.test_service import assert_problem, metric_samples
from tests.service.workloads import NEG

TLS = Path(__file__).parents[1] / "data" / "tls"


def test_https_the_key_on_metrics_and_route_labels(tmp_path):
    key = {"authorization": "Bearer k3y"}
    with Server(tmp_path / "plans.sqlite", tls=(TLS / "cert.pem", TLS / "key.pem"),
                api_key="k3y", metrics_need_key=1) as server:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(TLS / "cert.pem"))
        with httpx.Client(base_url=server.url, verify=context, timeout=60) as http:
            assert http.get("/healthz").json() == {"status": "ok"}
            plan = http.post("/v1/plan", headers=key, json={"definition": NEG, "inputs": [
                {"shape": [4], "dtype": "float32"}]})
            assert plan.status_code == 200
            assert_problem(http.get("/metrics"), 401, "Bearer")
            http.get("/openapi.json")
            http.get("/docs/assets/swagger-ui.css")
            http.get("/no/such/route")
            text = http.get("/metrics", headers=key).text
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it is refused
            httpx.get(f"{server.url}/healthz", timeout=10)
    # FastAPI's own routes and the docs' assets were counted as "unmatched"
    routes = {dict(labels)["route"] for (name, labels) in metric_samples(text)
              if name == "fusecut_http_requests_total"}
    assert {"/openapi.json", "/docs/assets/{path}", "/metrics", "unmatched"} <= routes
