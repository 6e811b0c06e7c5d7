"""Prometheus metrics of the service (prometheus-client, Prometheus naming).

Labels are bounded: segmenter, kind, backend, cache outcome, route template and status class;
never a fusion or plan id. With ``PROMETHEUS_MULTIPROC_DIR`` set (``fusecut serve --workers N``
sets it), every uvicorn worker process writes its samples there and ``/metrics`` aggregates them.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from starlette.routing import Match, Mount

if TYPE_CHECKING:
    from fusecut.service.processes.results import ExecutionResult

disable_created_metrics()  # the *_created series add nothing a dashboard uses

PLANS = Counter("fusecut_plans_total", "Plans served", ["segmenter", "cache"])
PLANNED_BYTES = Counter("fusecut_planned_io_bytes_total",
                        "Global-memory bytes of the plans made", ["segmenter"])
LOWER_BOUND_BYTES = Counter("fusecut_lower_bound_io_bytes_total",
                            "Lower-bound bytes of the fusions planned")
BASELINE_BYTES = Counter("fusecut_greedy_baseline_io_bytes_total",
                         "Bytes the greedy (nvFuser-style) plan would have moved")
SAVED_BYTES = Counter("fusecut_saved_io_bytes_total", "Greedy bytes minus planned bytes",
                      ["segmenter"])
SEGMENTS = Counter("fusecut_segments_total", "Segments planned", ["kind"])
SOLVER_SECONDS = Histogram("fusecut_solver_seconds", "Wall time of planning", ["segmenter"],
                           buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30,
                                    60))
COMPILE_SECONDS = Counter("fusecut_compile_seconds_total", "NVRTC compile time")
COMPILES = Counter("fusecut_kernel_compiles_total", "Kernels compiled by NVRTC")
COMPILE_CACHE_HITS = Counter("fusecut_kernel_cache_hits_total",
                             "Kernel binaries found in the memory or disk cache")
EXECUTE_SECONDS = Histogram("fusecut_execute_seconds", "Device time of executions",
                            ["backend"], buckets=(1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1,
                                                  0.5, 1, 5, 30))
EXECUTE_BYTES = Counter("fusecut_execute_io_bytes_total", "Bytes moved by executed segments",
                        ["backend"])
BANDWIDTH = Histogram("fusecut_achieved_bandwidth_bytes_per_second",
                      "Bytes moved per second of device time, per execution", ["backend"],
                      buckets=(1e9, 1e10, 1e11, 5e11, 1e12, 2e12, 3e12, 4e12, 5e12))
WORKER_RESTARTS = Counter("fusecut_worker_restarts_total", "GPU worker restarts")
PLANS_CANCELLED = Counter("fusecut_plans_cancelled_total",
                          "Planning jobs cancelled: their client went away, or their deadline "
                          "passed", ["reason"])
for _reason in ("disconnected", "deadline"):  # exported at 0 before the first: a dashboard
    PLANS_CANCELLED.labels(_reason)            # shows "none" rather than "no data"
HTTP = Counter("fusecut_http_requests_total", "HTTP requests", ["route", "status"])
HTTP_SECONDS = Histogram("fusecut_http_request_seconds", "Time to answer an HTTP request",
                         ["route"], buckets=(5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                                             0.25, 0.5, 1, 2.5, 5, 10, 30))
WORKER_UP = Gauge("fusecut_worker_up", "1 while the GPU worker runs", multiprocess_mode="max")
DEVICE_EXECUTIONS = Counter("fusecut_device_executions_total", "Executions run, per device "
                            "worker (fusecut serve --gpus)", ["device"])
DEVICE_SECONDS = Counter("fusecut_device_execute_seconds_total",
                         "Device time of the executions, per device worker", ["device"])
DEVICE_QUEUE = Gauge("fusecut_device_queue", "Executions running or waiting, per device worker",
                     ["device"], multiprocess_mode="livesum")
DEVICE_UP = Gauge("fusecut_device_worker_up", "1 while the device's worker runs", ["device"],
                  multiprocess_mode="max")
CACHE_ERRORS = Counter("fusecut_cache_errors_total", "Plan cache operations that failed or "
                       "found a damaged plan (the request was served without the cache)",
                       ["operation"])
for _operation in ("get", "put", "link", "damaged"):  # exported at 0 before any failure
    CACHE_ERRORS.labels(_operation)
CACHE_EVICTIONS = Counter("fusecut_cache_evictions_total",
                          "Plans evicted from the cache by its size bound")
CACHE_QUARANTINED = Counter("fusecut_cache_quarantined_total",
                            "Corrupt cache files moved aside (and fresh ones started)")
CACHE_DEGRADED = Gauge("fusecut_cache_degraded", "1 while the plan cache fails",
                       multiprocess_mode="max")
CACHE_BYTES = Gauge("fusecut_cache_bytes", "Bytes counted against the cache's size bound",
                    multiprocess_mode="max")


class CountRequests:
    """Pure ASGI middleware: count requests by route template and status class, and time them;
    the time also goes back in a ``Server-Timing`` header (W3C), so a client can tell the
    server's share of a latency from the network's."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500
        counted = False
        entry = dict(scope)  # as it came: routing rewrites a mounted app's path

        def count() -> None:
            nonlocal counted
            if not counted:
                counted = True
                route = route_template(scope, entry)
                HTTP.labels(route, f"{status // 100}xx").inc()
                HTTP_SECONDS.labels(route).observe(time.perf_counter() - start)

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                spent = f"app;dur={(time.perf_counter() - start) * 1e3:.3f}".encode()
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"server-timing", spent)]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # Counted before the last body goes out: a file response closes its file in a
                # worker thread after it, and a client's next request could see no count yet.
                count()
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            count()  # a request that failed before its response ended


def route_template(scope, entry) -> str:
    """The route a request went to, as its template (``/v1/plans/{plan_id}``); "unmatched"
    for a path no route serves. FastAPI's own routes (the OpenAPI document) and mounted apps
    (the docs' assets) leave no route in the scope: they are matched again here, with the
    scope as it came in (``entry``)."""
    route = scope.get("route")
    if route is None:
        router = getattr(scope.get("app"), "router", None)
        route = next((r for r in getattr(router, "routes", ())
                      if r.matches(entry)[0] is Match.FULL), None)
    if isinstance(route, Mount):
        return f"{route.path}/{{path}}"
    return getattr(route, "path", "unmatched")


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus text format (aggregated over processes if configured)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def record_plan(plan: dict, cache: str) -> None:
    """Count a plan, from its summary (service.planning.plan_summary)."""
    segmenter = plan["segmenter"]
    PLANS.labels(segmenter, cache).inc()
    if cache != "miss":
        return
    totals, base = plan["totals"], plan["baseline"]
    PLANNED_BYTES.labels(segmenter).inc(totals["io_bytes"])
    LOWER_BOUND_BYTES.inc(totals["lower_bound_bytes"])
    BASELINE_BYTES.inc(base["io_bytes"])
    SAVED_BYTES.labels(segmenter).inc(max(base["io_bytes"] - totals["io_bytes"], 0))
    SOLVER_SECONDS.labels(segmenter).observe(plan["solver"]["wall_s"])
    for kind, count in plan["segment_kinds"].items():
        SEGMENTS.labels(kind).inc(count)


def record_devices(worker) -> None:
    """Each device worker's queue and state (a WorkerPool's, or Ray's execute handle's)."""
    for slot in worker.snapshot():
        DEVICE_QUEUE.labels(slot["device"]).set(slot["pending"])
        DEVICE_UP.labels(slot["device"]).set(1 if slot["up"] else 0)


def record_execution(result: ExecutionResult) -> None:
    backend = result.backend
    seconds = sum(t["seconds"] for t in result.timings)
    if result.device is not None:
        DEVICE_EXECUTIONS.labels(result.device).inc()
        DEVICE_SECONDS.labels(result.device).inc(seconds)
    moved = sum(t["bytes"] for t in result.timings)
    EXECUTE_SECONDS.labels(backend).observe(seconds)
    EXECUTE_BYTES.labels(backend).inc(moved)
    if seconds > 0:
        BANDWIDTH.labels(backend).observe(moved / seconds)
    COMPILES.inc(result.compiles)
    COMPILE_SECONDS.inc(result.compile_seconds)
    COMPILE_CACHE_HITS.inc(result.cache_hits)
