"""What is too big is refused before it is made, naming the tensor and the limit: inputs of
impossible sizes (planned from metadata), results over the output and intermediate limits, and
bodies nested too deeply to parse. Run against the real ``fusecut serve``.

From the hostile-input reviews: issue 12 (defect 8) and issue 19 (defects 5 and 6).
"""

from __future__ import annotations

import pytest
import torch

from fusecut.wire.tensors import dump_safetensors
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
