"""What is too big is refused before it is made, naming the tensor and the limit: inputs of
impossible sizes (planned from metadata), results over the output and intermediate limits, and
bodies nested too deeply to parse. Run against the real ``fusecut serve``.

From the hostile-input reviews: issue 12 (defect 8), issue 19 (defects 5 and 6) and issue 32
(defect 3: safetensors headers capped at the plan's input count, KServe JSON bodies at their own
limit; defect 7: integers and sizes no header may hold; defect 9: the intermediate limit bounds
the computed tensors alive at once, not each one).
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import torch

from fusecut.wire.tensors import dump_safetensors
from tests.server import Server
from tests.service.test_service import SMALL, assert_problem, small_metas
from tests.service.workloads import NEG


def planned_bytes(http) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(http.get("/metrics").text)
               if f.name == "fusecut_planned_io_bytes" for s in f.samples)


@pytest.mark.parametrize("t0, mentions", [
    ({"shape": [2**62, 2**62], "dtype": "float16"}, ["T0", "axis 0", "2**63 - 1"]),
    ({"shape": [2**70, 10], "dtype": "float16"}, ["T0", "axis 0", "2**63 - 1"]),
    ({"shape": [2**20, 2**21], "dtype": "float16"}, ["T0", "axis 1", "limit"]),
    ({"shape": [6, 10], "strides": [2**62, 2**62], "dtype": "float16"}, ["T0", "2**63 - 1"]),
])
def test_impossible_sizes_are_a_422_naming_input_and_axis(http, t0, mentions):
    before = planned_bytes(http)
    response = http.post("/v1/plan", json={"definition": SMALL,
                                           "inputs": [t0, *small_metas()[1:]]})
    assert_problem(response, 422, *mentions)
    assert planned_bytes(http) == before  # nothing absurd reached the metrics
    fine = http.post("/v1/plan", json={"definition": SMALL, "inputs": small_metas(1024, 4096)})
    assert fine.status_code == 200 and 0 < planned_bytes(http) < 1e12


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


def many_alive(n: int = 20, chain: bool = False) -> str:
    """``n`` tensors of 512 KiB made from one 4-byte input: all alive at once until a chain of
    adds reads them (or, with ``chain``, each made from the one before: two alive at once)."""
    lines = ["def many(fd):",
             "    T0 = fd.define_tensor(shape=[1, 1], contiguity=[None, None], "
             "dtype=DataType.Float)",
             "    T1 = fd.ops.broadcast_in_dim(T0, shape=[256, 512], broadcast_dims=[0, 1])",
             "    S2 = fd.define_scalar(1.5, dtype=DataType.Double)"]
    names: list[str] = []
    for i in range(n):
        lines.append(f"    T{10 + i} = fd.ops.mul({names[-1] if chain and names else 'T1'}, S2)")
        names.append(f"T{10 + i}")
    total = names[-1]
    if not chain:
        total = names[0]
        for i, name in enumerate(names[1:]):
            lines.append(f"    A{i} = fd.ops.add({total}, {name})")
            total = f"A{i}"
    lines += [f"    R = fd.ops.sum({total}, dims=[0, 1], keepdim=False)", "    fd.add_output(R)"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("segmenter", ["greedy", "cpsat"])
def test_the_intermediate_limit_bounds_the_tensors_alive_at_once(segmenter):
    from fusecut.optimizer.ir.nvtext import parse_text
    from fusecut.optimizer.planner import PlanOptions, make_plan
    from fusecut.runtime.tensors import meta_of
    from fusecut.service.processes.limits import ResultTooLarge, check_result_sizes

    def planned(text: str):
        return make_plan(parse_text(text).fusion, [meta_of(torch.ones(1, 1))],
                         PlanOptions(segmenter=segmenter))

    with pytest.raises(ResultTooLarge, match="alive at once") as refused:
        check_result_sizes(planned(many_alive()), 1 << 30, 4_000_000)
    assert "4000000" in str(refused.value) and "[256, 512] float32" in str(refused.value)
    check_result_sizes(planned(many_alive(chain=True)), 1 << 30, 4_000_000)  # 20, in turn


def test_tensors_alive_at_once_over_the_limit_are_a_413(tmp_path):
    with Server(tmp_path / "plans.sqlite", max_intermediate_bytes=4_000_000) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        one = {"name": "T0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
        refused = http.post("/v1/execute", json={"definition": many_alive(), "inputs": [one]})
        assert_problem(refused, 413, "alive at once", "4000000")
        ran = http.post("/v1/execute", json={"definition": many_alive(chain=True),
                                             "inputs": [one]})
        assert ran.status_code == 200, ran.text


def safetensors_body(header: bytes | dict, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


def neg_plan(http) -> str:
    made = http.post("/v1/plan", json={"definition": NEG, "inputs": [
        {"shape": [4], "dtype": "float32"}]})
    assert made.status_code == 200, made.text
    return made.json()["plan_id"]


def test_headers_with_integers_or_sizes_past_int64_are_a_422(http):
    # issue 32, defect 7: both were 500s (ValueError past 4,300 digits, TypeError at 2**63)
    plan_id = neg_plan(http)
    route = f"/v1/plans/{plan_id}/execute"
    octets = {"content-type": "application/octet-stream"}
    t0 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    digits = b'{"__metadata__": {"n": ' + b"9" * 5000 + b'}, "T0": ' + \
        json.dumps(t0).encode() + b"}"
    assert_problem(http.post(route, content=safetensors_body(digits, bytes(16)),
                             headers=octets), 422, "5000 digits")
    for shape in ([0, 2**63], [2**62, 2**62, 0]):
        header = {"T0": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
        assert_problem(http.post(route, content=safetensors_body(header), headers=octets), 422,
                       "T0", "2**63 - 1")
    form = {"files": {"tensors": ("t", safetensors_body(digits, bytes(16)))},
            "data": {"definition": NEG}}
    assert_problem(http.post("/v1/execute", **form), 422, "digits")


def test_tensor_counts_past_the_plans_inputs_are_refused_before_decoding(http):
    # issue 32, defect 3: a 68 MB header of 1.2M zero-size tensors took the service to 6.2 GB
    plan_id = neg_plan(http)
    octets = {"content-type": "application/octet-stream"}
    many = {f"x{k}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
            for k in range(40_000)}
    body = safetensors_body({"T0": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                             **many})
    assert len(body) > 2_000_000
    assert_problem(http.post(f"/v1/plans/{plan_id}/execute", content=body, headers=octets),
                   422, "header of", "at most 1 tensor")
    small = safetensors_body({"T0": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                              **dict(list(many.items())[:3])})
    assert_problem(http.post(f"/v1/plans/{plan_id}/execute", content=small, headers=octets),
                   422, "4 tensors", "the plan takes 1 input")
    assert_problem(http.post(f"/v1/plans/{'f' * 32}/execute", content=body, headers=octets),
                   404, "f" * 32)
    fine = http.post(f"/v1/plans/{plan_id}/execute", headers=octets,
                     content=dump_safetensors({"T0": torch.arange(4.0)}))
    assert fine.status_code == 200, fine.text


def test_kserve_json_bodies_have_their_own_limit(server):
    # issue 32, defect 3: a 40 MB KServe body grew a planner process by 914 MB
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/execute HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                  b"content-type: application/json\r\ncontent-length: 40000000\r\n\r\n{")
        status, body = read_response(s)
    assert status.startswith(b"HTTP/1.1 413"), status
    assert b"33554432" in body and b"safetensors" in body


def read_response(s: socket.socket) -> tuple[bytes, bytes]:
    """(the status line and headers, the body) of one response read from a raw socket."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(65536)
        assert chunk, answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, body
        body += chunk
    return head, body
