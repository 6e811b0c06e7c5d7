"""``fusecut ray-serve`` on a local Ray (issue 20): two planning replicas behind Serve's HTTP
proxy and one execute replica (the CPU path), sharing a real PostgreSQL cache, answer /v1/plan
and /v1/execute as a plain ``fusecut serve`` does.

One Ray cluster for the module (its start is the cost: ~20-30 s on 2 cores), with a 100 MB
object store; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from benchmarks.common import source_pythonpath
from fusecut.optimizer.ir import fusion_to_json
from fusecut.wire.tensors import dump_safetensors, load_safetensors
from tests.conftest import CORPUS
from tests.server import ROOT, Server, free_port
from tests.service.test_service import SMALL, SMALL_FUSION, small_args, small_metas

pytest.importorskip("ray.serve", reason="the 'ray' extra (make venv installs it)")
START_TIMEOUT_S = 240


class RayServe:
    def __init__(self, cache_url: str, workdir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "ray-serve.log"
        env = dict(os.environ, FUSECUT_DEFAULT_TIME_LIMIT_S="2",
                   PYTHONPATH=source_pythonpath(os.environ.get("PYTHONPATH", "")))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fusecut.cli", "ray-serve", "--port", str(self.port),
             "--cache", cache_url, "--num-cpus", "4", "--object-store-mb", "100",
             "--plan-replicas", "2", "--plan-cpus", "1", "--execute-replicas", "1"],
            env=env, cwd=ROOT, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)

    def wait_replicas(self, n: int) -> set[str]:
        """Wait until ``n`` planning replicas have answered /readyz through the proxy."""
        seen: set[str] = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(seen) < n:
            assert self.proc.poll() is None, self.log.read_text()[-4000:]
            assert time.monotonic() < deadline, (seen, self.log.read_text()[-4000:])
            try:
                r = httpx.get(f"{self.url}/readyz", timeout=10)
                if r.status_code == 200:
                    seen.add(r.json()["replica"])
                    continue
            except httpx.TransportError:
                pass
            time.sleep(1)
        return seen

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def ray_and_plain(postgres, tmp_path_factory):
    work = tmp_path_factory.mktemp("ray")
    ray = RayServe(postgres.create_database("ray_serve"), work)
    plain = Server(work / "plain.sqlite").launch()
    try:
        plain.wait_ready(120)
        replicas = ray.wait_replicas(2)
        yield ray, plain, replicas
    finally:
        plain.stop()
        ray.stop()
    assert ray.proc.returncode == 0, ray.log.read_text()[-3000:]  # a clean stop


def without_timings(value):
    """A plan's JSON without its wall-clock fields (the rest is deterministic)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_two_planning_replicas_answer_behind_the_proxy(ray_and_plain):
    ray, _, replicas = ray_and_plain
    assert len(replicas) == 2
    state = httpx.get(f"{ray.url}/readyz", timeout=10).json()
    assert state["worker"] == "up" and state["device"] == "cpu"
    assert state["cache"]["backend"] == "postgresql" and state["cache"]["state"] == "ok"


def test_plans_equal_a_plain_service(ray_and_plain):
    ray, plain, _ = ray_and_plain
    requests = [{"definition": SMALL, "inputs": small_metas(4, 6)},
                {"definition": fusion_to_json(SMALL_FUSION), "inputs": small_metas(5, 3),
                 "options": {"segmenter": "greedy"}},
                {"definition": (CORPUS / "softmax_fwd.py").read_text()}]
    for body in requests:
        on_ray = httpx.post(f"{ray.url}/v1/plan", json=body, timeout=120)
        direct = httpx.post(f"{plain.url}/v1/plan", json=body, timeout=120)
        assert on_ray.status_code == direct.status_code == 200, (on_ray.text, direct.text)
        assert without_timings(on_ray.json()) == without_timings(direct.json())
        plan_id = on_ray.json()["plan_id"]
        for _ in range(4):  # by id, through either replica: the shared cache
            got = httpx.get(f"{ray.url}/v1/plans/{plan_id}", timeout=30)
            assert got.status_code == 200 and got.json() == on_ray.json()
    bad = httpx.post(f"{ray.url}/v1/plan", json={"definition": SMALL}, timeout=60)
    assert bad.status_code == 422 and bad.json()["title"] == "no input metadata"


def test_executions_equal_a_plain_service(ray_and_plain):
    ray, plain, _ = ray_and_plain
    negate = {"definition": "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True]"
                            ", dtype=DataType.Float)\n    fd.add_output(fd.ops.neg(T0))\n",
              "inputs": [{"name": "T0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    on_ray = httpx.post(f"{ray.url}/v1/execute", json=negate, timeout=120)
    direct = httpx.post(f"{plain.url}/v1/execute", json=negate, timeout=120)
    assert on_ray.status_code == direct.status_code == 200, on_ray.text
    assert on_ray.json()["outputs"] == direct.json()["outputs"]
    assert on_ray.json()["outputs"][0]["data"] == [-1.0, -2.0, -3.0]
    args = small_args(6, 10)
    tensors = dump_safetensors({"T0": args[0], "T1": args[1], "S2": torch.tensor(args[2])})
    results = []
    for url in (ray.url, plain.url):
        r = httpx.post(f"{url}/v1/execute", data={"definition": SMALL}, timeout=120,
                       files={"tensors": ("t.safetensors", tensors)})
        assert r.status_code == 200, r.text
        results.append(load_safetensors(r.content))
    assert results[0].keys() == results[1].keys()
    for name in results[0]:
        assert torch.equal(results[0][name], results[1][name])


def test_ctrl_c_stops_a_local_cluster_at_once_and_quietly(tmp_path):
    # issue 45, new-user item 10: stopping took long and ended in an error from Ray (Ctrl-C
    # reaches Ray's own processes too: Serve's controller was gone when serve.shutdown() asked
    # it to stop, "Task ServeController.graceful_shutdown failed")
    port = free_port()
    log = tmp_path / "ray-serve.log"
    env = dict(os.environ, PYTHONPATH=source_pythonpath())
    proc = subprocess.Popen(
        [sys.executable, "-m", "fusecut.cli", "ray-serve", "--port", str(port), "--cache",
         str(tmp_path / "plans.sqlite"), "--num-cpus", "2", "--object-store-mb", "100",
         "--plan-replicas", "1", "--plan-cpus", "0.5", "--execute-replicas", "1"],
        env=env, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group, as a terminal's job is
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole group
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert time.monotonic() - start < 30
        after = log.read_text().split("Deleting app", 1)[-1]
        assert "failed" not in after and "Error" not in after, after[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
