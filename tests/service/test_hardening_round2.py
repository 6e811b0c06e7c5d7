"""The service under a hostile probe, round 2 (issue 19): each defect the probe found, run
against the real ``fusecut serve`` (tests/server.py), a test that failed before its fix.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from benchmarks.fusiongen import generate
from fusecut.optimizer.ir import parse_text
from fusecut.runtime.reference import run_reference
from fusecut.wire.tensors import dump_safetensors, load_safetensors
from tests.server import Server
from tests.service.test_hardening import healthz_latencies_during
from tests.service.test_service import assert_problem, heavy_definition, metric_samples

TLS = Path(__file__).parents[1] / "data" / "tls"
NEG = """
def f(fd):
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    T1 = fd.ops.neg(T0)
    fd.add_output(T1)
"""
NVFUSER = {"float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
           "float8_e8m0fnu": "Float8_e8m0fnu", "uint64": "UInt64", "complex64": "ComplexFloat",
           "complex128": "ComplexDouble", "float4_e2m1fn_x2": "Float4_e2m1fn_x2",
           "float4_e2m1fn": "Float4_e2m1fn"}


def passthrough(dtype: str) -> str:
    """A definition that copies an input of ``dtype`` (nvFuser's name for it) and casts it."""
    return (f"def passthrough(fd):\n"
            f"    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
            f"dtype=DataType.{NVFUSER[dtype]})\n"
            f"    T1 = fd.ops.set(T0)\n"
            f"    T2 = fd.ops.cast(T0, dtype=DataType.Double)\n"
            f"    fd.add_output(T1)\n    fd.add_output(T2)\n")


def readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=30).json()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def workers_up(url: str) -> dict:
    """/readyz once every worker runs (the service is ready as soon as one does)."""
    wait_for(lambda: all(w["up"] for w in readyz(url)["workers"]), 60, "the workers are down")
    return readyz(url)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# ---- defect 1: a tiny safetensors tensor killed the worker ------------------------------------

@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
def test_tiny_tensors_of_any_dtype_are_a_422_and_the_worker_lives(http, dtype):
    plan = http.post("/v1/plan", json={"definition": NEG, "inputs": [
        {"shape": [4], "dtype": "float32"}]}).json()
    before = workers_up(str(http.base_url).rstrip("/"))
    body = dump_safetensors({"T0": torch.zeros(4, dtype=dtype)})
    response = http.post(f"/v1/plans/{plan['plan_id']}/execute", content=body,
                         headers={"content-type": "application/octet-stream"})
    assert_problem(response, 422, "T0", str(dtype).removeprefix("torch."), "float32")
    after = http.get("/readyz").json()
    alive = [(w["pid"], w["up"]) for w in after["workers"]]  # not restarted
    assert alive == [(w["pid"], w["up"]) for w in before["workers"]]
    assert after["worker_restarts"] == before["worker_restarts"]


# ---- defect 2: float8, uint64, complex and fp4 inputs gave 500 --------------------------------

@pytest.mark.parametrize("dtype", list(NVFUSER))
def test_every_nvfuser_dtype_plans_and_its_segments_print_back(http, dtype):
    response = http.post("/v1/plan", json={"definition": passthrough(dtype),
                                           "inputs": [{"shape": [4], "dtype": dtype}]})
    assert response.status_code == 200, response.text
    for segment in response.json()["segments"]:
        reparsed = parse_text(segment["definition_py"])  # the printed repro reads back
        assert reparsed.fusion.tensors["T0"].dtype.value == dtype
        if dtype != "float4_e2m1fn":  # torch has no tensors of it: no inputs list
            assert [m.dtype.value for m in reparsed.inputs] == [dtype]


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "uint64",
                                   "complex64"])
def test_extended_dtypes_execute_through_safetensors(http, dtype):
    x = torch.arange(1, 5, dtype=torch.float64).to(getattr(torch, dtype))
    response = http.post("/v1/execute", files={"tensors": ("t", dump_safetensors({"T0": x}))},
                         data={"definition": passthrough(dtype)})
    assert response.status_code == 200, response.text
    got = load_safetensors(response.content)
    want = run_reference(parse_text(passthrough(dtype)).fusion, [x])
    assert got["T1"].dtype == x.dtype
    assert torch.equal(got["T1"].view(torch.uint8), want[0].view(torch.uint8))
    torch.testing.assert_close(got["T2"], want[1])


def test_outputs_a_wire_cannot_carry_are_refused_before_running(http):
    # complex128 has no safetensors dtype, uint64 no KServe-v2 one
    x = torch.arange(4, dtype=torch.float64)
    copy = passthrough("complex128").replace("DataType.ComplexDouble", "DataType.Double")
    complex_out = copy.replace("T1 = fd.ops.set(T0)",
                               "T1 = fd.ops.cast(T0, dtype=DataType.ComplexDouble)")
    response = http.post("/v1/execute", data={"definition": complex_out},
                         files={"tensors": ("t", dump_safetensors({"T0": x}))})
    assert_problem(response, 422, "T1", "complex128", "safetensors")
    uint_out = copy.replace("T1 = fd.ops.set(T0)", "T1 = fd.ops.cast(T0, dtype=DataType.UInt64)")
    response = http.post("/v1/execute", json={"definition": uint_out, "inputs": [
        {"name": "T0", "shape": [4], "datatype": "FP64", "data": [0, 1, 2, 3]}]})
    assert_problem(response, 422, "T1", "uint64", "JSON")


# ---- defect 3 (the service's side): cancelled planning jobs -----------------------------------

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


# ---- defect 4: the dashboard and a big plan's execution held the event loop -------------------

def test_a_20000_op_plan_stalls_no_request_on_the_dashboard_or_when_run(server):
    text = generate(19_990, seed=0, rows=8, cols=8)
    made = httpx.post(f"{server.url}/v1/plan", timeout=300, json={
        "definition": text, "options": {"segmenter": "greedy", "time_limit_s": 5}})
    assert made.status_code == 200, made.text[:300]
    plan_id = made.json()["plan_id"]
    latencies, page = healthz_latencies_during(
        server.url, lambda: httpx.get(f"{server.url}/dashboard", timeout=300))
    assert page.status_code == 200 and plan_id in page.text
    assert max(latencies) < 0.1, max(latencies)
    parsed = parse_text(text)
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(m.shape, generator=g).to(getattr(torch, m.dtype.value))
            for m in parsed.inputs]
    body = dump_safetensors(dict(zip(parsed.fusion.inputs, args)))
    latencies, response = healthz_latencies_during(server.url, lambda: httpx.post(
        f"{server.url}/v1/plans/{plan_id}/execute", content=body, timeout=300,
        headers={"content-type": "application/octet-stream"}))
    assert response.status_code == 200, response.text[:300]
    assert max(latencies) < 0.1, max(latencies)
    got = load_safetensors(response.content)
    want = run_reference(parsed.fusion, args)
    for name, expected in zip(parsed.fusion.outputs, want):
        torch.testing.assert_close(got[name], expected)


# ---- defect 5: results of any size ------------------------------------------------------------

def test_results_over_the_limits_are_refused_naming_the_tensor(http):
    before = http.get("/readyz").json()["worker_restarts"]
    broadcast = ("def spread(fd):\n"
                 "    T0 = fd.define_tensor(shape=[1, 1], contiguity=[None, None], "
                 "dtype=DataType.Float)\n"
                 "    T1 = fd.ops.broadcast_in_dim(T0, shape=[16384, 16384], "
                 "broadcast_dims=[0, 1])\n"
                 "    T2 = fd.ops.set(T1)\n    fd.add_output(T2)\n")
    response = http.post("/v1/execute", json={"definition": broadcast, "inputs": [
        {"name": "T0", "shape": [1, 1], "datatype": "FP32", "data": [1.5]}]})
    assert_problem(response, 413, "T2", "16384, 16384", "1073741824 bytes", "limit")
    huge = ("def huge(fd):\n"
            "    T0 = fd.define_tensor(shape=[1, 1], contiguity=[None, None], "
            "dtype=DataType.Float)\n"
            "    T1 = fd.ops.broadcast_in_dim(T0, shape=[131072, 131072], broadcast_dims=[0, 1])\n"
            "    T2 = fd.ops.mul(T1, T1)\n"
            "    T3 = fd.ops.sum(T2, dims=[0, 1], keepdim=False)\n    fd.add_output(T3)\n")
    response = http.post("/v1/execute", files={"tensors": ("t", dump_safetensors(
        {"T0": torch.ones(1, 1)}))}, data={"definition": huge})
    assert_problem(response, 413, "T1", "131072, 131072", "68719476736 bytes", "limit")
    assert http.get("/readyz").json()["worker_restarts"] == before


# ---- defect 6: a deep safetensors header ------------------------------------------------------

def test_deeply_nested_bodies_are_a_422(http):
    plan = http.post("/v1/plan", json={"definition": NEG, "inputs": [
        {"shape": [4], "dtype": "float32"}]}).json()
    header = b"[" * 100_000 + b"]" * 100_000
    body = len(header).to_bytes(8, "little") + header
    response = http.post(f"/v1/plans/{plan['plan_id']}/execute", content=body,
                         headers={"content-type": "application/octet-stream"})
    assert_problem(response, 422, "safetensors", "nests too deeply")
    deep = b'{"definition": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for route in ("/v1/plan", "/v1/execute"):
        assert_problem(http.post(route, content=deep,
                                 headers={"content-type": "application/json"}), 422)


# ---- defect 8: children outlived the service --------------------------------------------------

def test_children_die_with_the_service_and_a_clean_stop_leaks_nothing(tmp_path):
    for how in (signal.SIGKILL, signal.SIGTERM):
        with Server(tmp_path / f"plans-{how.name}.sqlite") as server:  # stopped on a failure
            wait_for(lambda server=server: readyz(server.url)["planner_pids"], 60, "no planner")
            state = workers_up(server.url)
            children = [w["pid"] for w in state["workers"]] + state["planner_pids"]
            assert len(children) >= 3 and all(map(alive, children))
            if how is signal.SIGKILL:
                server.proc.kill()
                server.proc.wait(10)
                server.proc = None
            else:
                server.stop()
                log = server.log.read_text()
                assert "leaked" not in log and "Traceback" not in log, log[-2000:]
            try:
                wait_for(lambda children=children: not any(map(alive, children)), 5,
                         f"children outlived the service after {how.name}: "
                         f"{[p for p in children if alive(p)]}")
            finally:
                for pid in filter(alive, children):  # leave no orphan behind a failure
                    os.kill(pid, signal.SIGKILL)


# ---- defect 10: int64 scalars out of range ----------------------------------------------------

SCALAR = """
def f(fd):
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
    S1 = fd.define_scalar(None, dtype=DataType.Int)
    T2 = fd.ops.add(T0, S1)
    fd.add_output(T2)
"""


def test_scalar_values_must_fit_their_dtype(http):
    def plan(value, dtype="int64"):
        return http.post("/v1/plan", json={"definition": SCALAR.replace(
            "dtype=DataType.Int)\n    T2", "dtype=DataType.Int32)\n    T2")
            if dtype == "int32" else SCALAR, "inputs": [{"shape": [4], "dtype": "int64"},
                                                        {"dtype": dtype, "value": value}]})

    for value in (2**63, 2**64, -(2**63) - 1):
        assert_problem(plan(value), 422, str(value), "int64")
    for value in (2**31, -(2**31) - 1):
        assert_problem(plan(value, "int32"), 422, str(value), "int32")
    assert_problem(plan(1.5), 422, "integer")
    for value in (2**63 - 1, -(2**63)):
        assert plan(value).status_code == 200
    literal = SCALAR.replace("fd.define_scalar(None,", "fd.define_scalar(-9223372036854775808,")
    response = http.post("/v1/plan", json={"definition": literal,
                                           "inputs": [{"shape": [4], "dtype": "int64"}]})
    assert response.status_code == 200, response.text
    listed = SCALAR + "\ninputs = [torch.randint(0, 9, (4,)), -9223372036854775808]\n"
    assert http.post("/v1/plan", json={"definition": listed}).status_code == 200
    too_big = SCALAR + "\ninputs = [torch.randint(0, 9, (4,)), 9223372036854775808]\n"
    assert_problem(http.post("/v1/plan", json={"definition": too_big}), 422, "64 bits")


# ---- defect 13: the schema says what is required ----------------------------------------------

def test_the_schema_says_what_is_required(http):
    doc = http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert {"minLength": 1, "type": "string"} in \
        schemas["PlanRequest"]["properties"]["definition"]["anyOf"]
    assert_problem(http.post("/v1/plan", json={"definition": ""}), 422, "definition")
    assert schemas["ExecuteRequest"]["oneOf"] == [{"required": ["definition"]},
                                                  {"required": ["plan_id"]}]
    execute = doc["paths"]["/v1/execute"]["post"]["requestBody"]["content"]
    assert "application/octet-stream" not in execute  # it needs a plan id: the next route
    assert execute["multipart/form-data"]["schema"]["required"] == ["tensors"]
    by_id = doc["paths"]["/v1/plans/{plan_id}/execute"]["post"]
    assert [p["name"] for p in by_id["parameters"] if p["required"]] == ["plan_id"]
    assert list(by_id["requestBody"]["content"]) == ["application/octet-stream"]
    x = torch.randn(4)
    plan = http.post("/v1/plan", json={"definition": NEG, "inputs": [
        {"shape": [4], "dtype": "float32"}]}).json()
    for route, headers in ((f"/v1/plans/{plan['plan_id']}/execute", {}),
                           ("/v1/execute", {"x-fusecut-plan-id": plan["plan_id"]})):
        response = http.post(route, content=dump_safetensors({"T0": x}), headers={
            "content-type": "application/octet-stream", **headers})
        assert response.status_code == 200, response.text
        torch.testing.assert_close(load_safetensors(response.content)["T1"], -x)


# ---- defect 14: read timeouts -----------------------------------------------------------------

def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_sent_requests_are_dropped(tmp_path):
    with Server(tmp_path / "plans.sqlite", read_timeout_s=1) as server:
        port = int(server.url.rsplit(":", 1)[1])
        baseline = open_fds(server.proc.pid)
        halves = [b"", b"GET /healthz HT", b"POST /v1/plan HTTP/1.1\r\nhost: x\r\n",
                  b"POST /v1/plan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"definition\": "]
        sockets = []
        for k in range(200):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(halves[k % len(halves)])
            sockets.append(s)
        with httpx.Client(base_url=server.url) as http:  # others are served meanwhile
            assert http.get("/healthz").status_code == 200
        time.sleep(1.5)  # the read timeout, and a margin for timers on a busy machine
        deadline = time.monotonic() + 10
        for s in sockets:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            answer = b""
            while chunk := s.recv(4096):  # the server closes the connection: b""
                answer += chunk
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]
            s.close()
        wait_for(lambda: open_fds(server.proc.pid) <= baseline + 2, 5,
                 "the dropped connections' descriptors stayed open")
        # a slow but steady client is not dropped: 2.5 s, a byte every 0.5 s
        with socket.create_connection(("127.0.0.1", port)) as s:
            request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            for k in range(0, len(request), 7):
                s.sendall(request[k:k + 7])
                time.sleep(0.5)
            s.settimeout(10)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")


# ---- defect 15: bounded queues, 429/503 with Retry-After, one slow execution ------------------

def heavy_request(url: str) -> httpx.Response:
    """An execution of seconds on the CPU path (a plan made quickly: greedy)."""
    return httpx.post(f"{url}/v1/execute", timeout=120,
                      files={"tensors": ("t", dump_safetensors({"T0": torch.rand(4_000_000)}))},
                      data={"definition": heavy_definition(),
                            "options": json.dumps({"segmenter": "greedy"})})


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_executing(url: str) -> None:
    """Until a worker has spent 0.3 s of CPU since the call: an execution is running."""
    pids = [w["pid"] for w in workers_up(url)["workers"]]
    before = {pid: cpu_seconds(pid) for pid in pids}
    wait_for(lambda: any(cpu_seconds(p) > before[p] + 0.3 for p in pids), 60,
             "no worker started the execution")


def in_thread(call) -> tuple[threading.Thread, dict]:
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(r=call()))
    thread.start()
    return thread, answer


def test_a_small_execution_does_not_wait_behind_a_slow_one(server):
    slow, answer = in_thread(lambda: heavy_request(server.url))
    wait_until_executing(server.url)  # on one of the two workers
    start = time.monotonic()
    small = httpx.post(f"{server.url}/v1/execute", timeout=60, json={
        "definition": NEG, "inputs": [{"name": "T0", "shape": [2], "datatype": "FP32",
                                       "data": [1, 2]}]})
    took = time.monotonic() - start
    assert small.status_code == 200 and small.json()["outputs"][0]["data"] == [-1, -2]
    # answered on the other worker: with one, it waited for the slow one to end
    assert slow.is_alive(), f"the small execution waited {took:.1f} s, for the slow one"
    slow.join(120)
    assert answer["r"].status_code == 200, answer["r"].text


def test_queues_are_bounded_and_say_when_to_retry(tmp_path):
    with Server(tmp_path / "plans.sqlite", workers_per_device=1,
                max_queued_executions=1) as server:
        first = in_thread(lambda: heavy_request(server.url))
        wait_until_executing(server.url)
        # two more while it runs: one waits for the worker, the other is refused (which is
        # which depends on whose planning ends first: each plans its own definition)
        second = in_thread(lambda: heavy_request(server.url))
        third = heavy_request(server.url)
        second[0].join(120)
        answers = sorted([second[1]["r"], third], key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [200, 503], [r.text for r in answers]
        assert_problem(answers[1], 503, "waiting")
        assert int(answers[1].headers["retry-after"]) >= 1
        first[0].join(120)
        assert first[1]["r"].status_code == 200, first[1]["r"].text
    with Server(tmp_path / "per-client.sqlite", max_requests_per_client=1) as server:
        thread, answer = in_thread(lambda: heavy_request(server.url))
        wait_until_executing(server.url)
        refused = heavy_request(server.url)
        assert_problem(refused, 429, "this client")
        assert int(refused.headers["retry-after"]) >= 1
        thread.join(120)
        assert answer["r"].status_code == 200


# ---- defect 16: who may call, and what browsers are told --------------------------------------

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
