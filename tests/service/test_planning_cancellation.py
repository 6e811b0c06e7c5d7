"""A planning job is cancelled (its planner process killed and replaced) when its client leaves
or when it runs past its deadline, and the cancellations are counted; a planner that dies idle
is reaped and replaced, never handed a job.

From the hostile-input reviews of issue 19 (defect 3, the service's side) and issue 32 (defect
12).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.fusiongen import generate
from tests.server import Server
from tests.service.probes import alive, readyz, wait_for
from tests.service.test_service import assert_problem, metric_samples
from tests.service.workloads import NEG


def test_a_planning_job_whose_client_left_is_cancelled(tmp_path):
    # CP-SAT on 1,500 ops uses its whole time limit (30 s); the client gives up after 1.5 s
    body = {"definition": generate(1500, seed=3, rows=64, cols=64),
            "options": {"time_limit_s": 30}}
    with Server(tmp_path / "plans.sqlite", max_concurrent_plans=1) as server:
        wait_for(lambda: readyz(server.url)["planner_pids"], 60, "no planner started")
        (busy,) = readyz(server.url)["planner_pids"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/plan", json=body, timeout=1.5)
        wait_for(lambda: not alive(busy), 3, "the planner kept planning for a client that left")
        wait_for(lambda: readyz(server.url)["planner_pids"], 60, "no planner replaced it")
        samples = metric_samples(httpx.get(f"{server.url}/metrics").text)
        assert samples[("fusecut_plans_cancelled_total", (("reason", "disconnected"),))] == 1
        small = {"definition": NEG, "inputs": [{"shape": [4], "dtype": "float32"}]}
        assert httpx.post(f"{server.url}/v1/plan", json=small, timeout=60).status_code == 200


def test_a_planning_job_past_its_deadline_is_cancelled(tmp_path):
    # no grace: a job is cancelled as soon as its time limit has passed, and parsing and
    # binding 4,000 ops alone takes longer than 0.05 s
    with Server(tmp_path / "plans.sqlite", plan_grace_s=0) as server:
        start = time.monotonic()
        response = httpx.post(f"{server.url}/v1/plan", timeout=60, json={
            "definition": generate(4000, seed=1, rows=8, cols=8),
            "options": {"time_limit_s": 0.05, "segmenter": "greedy"}})
        assert_problem(response, 503, "time limit", "cancelled")
        assert response.headers["retry-after"] and time.monotonic() - start < 5
        samples = metric_samples(httpx.get(f"{server.url}/metrics").text)
        assert samples[("fusecut_plans_cancelled_total", (("reason", "deadline"),))] == 1
        small = {"definition": NEG, "inputs": [{"shape": [4], "dtype": "float32"}]}
        assert httpx.post(f"{server.url}/v1/plan", json=small, timeout=60).status_code == 200


def test_planners_that_died_idle_are_reaped_and_replaced(tmp_path):
    # issue 32, defect 12: each dead idle planner was handed a job (a 503 "planner crashed")
    # and stayed a zombie
    def small(n: int) -> dict:
        return {"definition": NEG, "inputs": [{"shape": [n], "dtype": "float32"}]}

    with Server(tmp_path / "plans.sqlite") as server:
        wait_for(lambda: readyz(server.url)["planner_pids"], 60, "no planner started")
        assert httpx.post(f"{server.url}/v1/plan", json=small(1), timeout=60).status_code == 200
        dead = readyz(server.url)["planner_pids"]
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(pid) for pid in dead), 5, "the planners lived")
        for n in range(2, 6):
            made = httpx.post(f"{server.url}/v1/plan", json=small(n), timeout=60)
            assert made.status_code == 200, made.text
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in dead), 5,
                 "the dead planners were left zombies")
        assert readyz(server.url)["planner_pids"] and \
            not set(dead) & set(readyz(server.url)["planner_pids"])
