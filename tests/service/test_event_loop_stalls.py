"""No request stalls the others: big bodies, big definitions, concurrent big plans, big
executions and a 20,000-op plan's dashboard and run leave /healthz answering within 0.15 s, its
latencies measured from another process (tests/healthz_poller.py). Run against the real
``fusecut serve``.

From the hostile-input reviews: issue 12 (defect 1) and issue 19 (defect 4).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from benchmarks.fusiongen import generate
from fusecut.optimizer.ir import parse_text
from fusecut.runtime.reference import run_reference
from fusecut.wire.tensors import dump_safetensors, load_safetensors
from tests.service.probes import healthz_latencies_during
from tests.service.test_service import assert_problem
from tests.service.workloads import kserve_body

# an answer later than this is a stall: the least of the stalls these tests guard held the loop
# 0.2-0.3 s; an unloaded /healthz answers in milliseconds, and full runs on two cores have read
# 0.107 and 0.152 s with no stall (once each, in different tests)
STALL_LIMIT_S = 0.15


def latencies_during(url: str, request):
    """``healthz_latencies_during``, measured again once when an answer came later than the
    limit. A stall the service causes comes back on every run of the same request; a loaded
    machine's scheduling delay (the 0.152 s above) does not come twice."""
    latencies, result = healthz_latencies_during(url, request)
    if max(latencies, default=0.0) >= STALL_LIMIT_S:
        latencies, result = healthz_latencies_during(url, request)
    return latencies, result


def chain_text(n: int) -> str:
    body = "".join(f"    T{i + 1} = fd.ops.neg(T{i})\n" for i in range(n))
    return ("def chain(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            f"{body}    fd.add_output(T{n})\n")


def test_the_latencies_are_the_services_not_this_process(server):
    # This process stalls, as a collector's pass does (100-300 ms late in the suite), while the
    # service idles: none of it may read as the service stalling.
    import random

    numbers = list(range(1_000_000))
    random.Random(0).shuffle(numbers)
    done = threading.Event()

    def hold_the_gil() -> None:
        while not done.is_set():
            sorted(numbers)  # one C call: 0.3 s without letting another thread run

    holder = threading.Thread(target=hold_the_gil)
    holder.start()
    try:
        latencies, _ = latencies_during(server.url, lambda: time.sleep(1))
    finally:
        done.set()
        holder.join()
    assert len(latencies) >= 10 and max(latencies) < STALL_LIMIT_S, max(latencies)


def test_big_bodies_and_definitions_stall_no_other_request(server):
    post = lambda content: httpx.post(f"{server.url}/v1/plan", content=content,  # noqa: E731
                                      headers={"content-type": "application/json"}, timeout=120)
    entry = json.dumps({"shape": [4, 4], "dtype": "float32"})
    cases = {
        # 57 MB: refused by its Content-Length, before a byte of it is parsed
        "57 MB of inputs entries": (1_600_000, 413, "limit"),
        # under the plan body limit: parsed (seconds of work) in a planner process
        "15 MB of inputs entries": (420_000, 422, "inputs"),
    }
    for name, (n, status, mention) in cases.items():
        raw = (f'{{"definition": {json.dumps(chain_text(1))}, "inputs": ['
               + ", ".join([entry] * n) + "]}").encode()
        latencies, response = latencies_during(server.url, lambda raw=raw: post(raw))
        assert_problem(response, status, mention)
        assert len(latencies) >= 3 and max(latencies) < STALL_LIMIT_S, (name, max(latencies))
    # 20,000 ops: parsed and bound in a planner process (the inputs do not fit: rank 2 for 1)
    big = json.dumps({"definition": chain_text(20_000),
                      "inputs": [{"shape": [4, 4], "dtype": "float32"}]}).encode()
    latencies, response = latencies_during(server.url, lambda: post(big))
    assert_problem(response, 422, "T0")
    assert len(latencies) >= 10 and max(latencies) < STALL_LIMIT_S, max(latencies)


def test_four_concurrent_4000_op_plans_stall_no_other_request(server):
    # issue 12: four concurrent 4,000-op plans pushed /healthz to 938 ms. Each is parsed,
    # planned (1 s limit) and serialized in a planner process.
    bodies = [json.dumps({"definition": generate(4000, seed=seed),
                          "options": {"time_limit_s": 1, "segmenter": "greedy"}}).encode()
              for seed in range(4)]

    def plan_all(bodies):
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda raw: httpx.post(
                f"{server.url}/v1/plan", content=raw, timeout=120,
                headers={"content-type": "application/json"}), bodies))

    # four small plans first: the four planner processes start (importing for a second each, on
    # this 2-core machine) before the measurement, as they do once in a service's life
    plan_all([json.dumps({"definition": chain_text(2 + k), "inputs": [
        {"shape": [4], "dtype": "float32"}]}).encode() for k in range(4)])
    latencies, responses = latencies_during(server.url, lambda: plan_all(bodies))
    assert [r.status_code for r in responses] == [200] * 4, [r.text[:200] for r in responses]
    assert len(latencies) >= 10 and max(latencies) < STALL_LIMIT_S, max(latencies)


def test_big_execute_bodies_stall_no_other_request(server):
    # A KServe-JSON execute body is validated, decoded and answered away from the event loop:
    # before, its 2M values held the loop for seconds (pydantic, torch.tensor, json.dumps).
    n = 2_000_000
    # bodies encoded beforehand, so that the polling spans the request alone
    good = json.dumps(kserve_body([k % 1000 for k in range(n)])).encode()  # ~10 MB
    bad = json.dumps(kserve_body([1, 2**64] * (n // 2))).encode()
    post = lambda raw: httpx.post(f"{server.url}/v1/execute", content=raw,  # noqa: E731
                                  headers={"content-type": "application/json"}, timeout=120)
    latencies, response = latencies_during(server.url, lambda: post(good))
    assert response.status_code == 200, response.text[:300]
    out = response.json()["outputs"][0]
    assert out["shape"] == [n] and out["data"][:3] == [0, -1, -2] and out["data"][-1] == -999
    assert len(latencies) >= 10 and max(latencies) < STALL_LIMIT_S, max(latencies)
    # bad data is refused as before, naming the value and the datatype's range
    latencies, response = latencies_during(server.url, lambda: post(bad))
    assert_problem(response, 422, "out of the range of INT64")
    assert len(latencies) >= 3 and max(latencies) < STALL_LIMIT_S, max(latencies)


def test_big_safetensors_bodies_stall_no_other_request(server):
    # 100 MB in, read by numpy copies that let the event loop's thread run (the safetensors
    # package held the GIL for 0.2-0.3 s of it), and passed to the worker process out of band.
    # A small output: the big request is what is tested.
    rows, cols = 25_000, 1000
    definition = ("def column_sums(fd):\n"
                  "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
                  "dtype=DataType.Float)\n"
                  "    fd.add_output(fd.ops.sum(T0, dims=[0], keepdim=False, "
                  "dtype=DataType.Null))\n")
    plan = httpx.post(f"{server.url}/v1/plan", timeout=60, json={
        "definition": definition, "inputs": [{"shape": [rows, cols], "dtype": "float32"}]}).json()
    x = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) % 7
    body = dump_safetensors({"T0": x})
    post = lambda: httpx.post(f"{server.url}/v1/execute", content=body,  # noqa: E731
                              headers={"content-type": "application/octet-stream",
                                       "x-fusecut-plan-id": plan["plan_id"]}, timeout=120)
    latencies, response = latencies_during(server.url, post)
    assert response.status_code == 200, response.text[:300]
    torch.testing.assert_close(load_safetensors(response.content)["T1"], x.sum(0))
    assert len(latencies) >= 10 and max(latencies) < STALL_LIMIT_S, max(latencies)


def test_a_20000_op_plan_stalls_no_request_on_the_dashboard_or_when_run(server):
    text = generate(19_990, seed=0, rows=8, cols=8)
    made = httpx.post(f"{server.url}/v1/plan", timeout=300, json={
        "definition": text, "options": {"segmenter": "greedy", "time_limit_s": 5}})
    assert made.status_code == 200, made.text[:300]
    plan_id = made.json()["plan_id"]
    latencies, page = latencies_during(
        server.url, lambda: httpx.get(f"{server.url}/dashboard", timeout=300))
    assert page.status_code == 200 and plan_id in page.text
    assert max(latencies) < STALL_LIMIT_S, max(latencies)
    parsed = parse_text(text)
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(m.shape, generator=g).to(getattr(torch, m.dtype.value))
            for m in parsed.inputs]
    body = dump_safetensors(dict(zip(parsed.fusion.inputs, args)))
    latencies, response = latencies_during(server.url, lambda: httpx.post(
        f"{server.url}/v1/plans/{plan_id}/execute", content=body, timeout=300,
        headers={"content-type": "application/octet-stream"}))
    assert response.status_code == 200, response.text[:300]
    assert max(latencies) < STALL_LIMIT_S, max(latencies)
    got = load_safetensors(response.content)
    want = run_reference(parsed.fusion, args)
    for name, expected in zip(parsed.fusion.outputs, want):
        torch.testing.assert_close(got[name], expected)
