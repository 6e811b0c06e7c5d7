"""A real Prometheus scrapes the service (issue 12): after plans and executions, every PromQL
expression of the Grafana dashboard (docker/grafana/dashboards/fusecut.json) returns data.

CI installs Debian's ``prometheus`` (.ci/run); there, a missing binary fails the test. Elsewhere
it skips, saying why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from fusecut.wire.tensors import to_json
from tests.helpers import require_installed
from tests.server import ROOT, Server, free_port
from tests.service.test_service import SMALL, small_args, small_metas

DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "fusecut.json"
RATE_WINDOW = "30s"  # for Grafana's $__rate_interval: 30 scrapes at 1 s


def dashboard_queries() -> list[str]:
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str) and node["expr"].strip():
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def prometheus_binary() -> str:
    return require_installed(shutil.which("prometheus"), "prometheus", "prometheus")


class Prometheus:
    def __init__(self, binary: str, target: str, workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: fusecut\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus did not start: {self.log.read_text()[-3000:]}")

    def query(self, expr: str) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = response.json()
        assert body.get("status") == "success", (expr, body)
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def drive(url: str) -> None:
    """Plans (a miss and a hit) and executions (a plan and a run of the CPU backend)."""
    with httpx.Client(base_url=url, timeout=120) as http:
        for rows in (6, 6, 8):
            assert http.post("/v1/plan", json={"definition": SMALL,
                                               "inputs": small_metas(rows)}).status_code == 200
        args = small_args(5, 10)
        body = {"definition": SMALL, "inputs": [
            to_json("T0", args[0]), to_json("T1", args[1]),
            {"name": "S2", "shape": [], "datatype": "FP64", "data": [args[2]]}]}
        for _ in range(2):
            response = http.post("/v1/execute", json=body)
            assert response.status_code == 200, response.text


def test_every_dashboard_query_returns_data(tmp_path):
    binary = prometheus_binary()
    queries = dashboard_queries()
    assert len(queries) >= 10
    with Server(tmp_path / "plans.sqlite") as server:
        prom = Prometheus(binary, server.url.removeprefix("http://"), tmp_path)
        try:
            prom.wait_ready()
            drive(server.url)
            # wait for scrapes after the traffic: the rates need two samples that include it
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen = prom.query("count_over_time(fusecut_execute_seconds_count[1m])")
                if seen and min(float(s["value"][1]) for s in seen) >= 3:
                    break
                time.sleep(0.5)
            drive(server.url)  # more traffic inside the window, so rates are not all zero
            time.sleep(3)
            empty = []
            for expr in queries:
                result = prom.query(expr.replace("$__rate_interval", RATE_WINDOW))
                if not result:
                    empty.append(expr)
            assert not empty, f"dashboard queries with no data: {empty}"
        finally:
            prom.stop()
