"""What is too big is refused before it is made, naming the tensor and the limit: inputs of
impossible sizes (planned from metadata), results over the output and intermediate limits, and
bodies nested too deeply to parse. Run against the real ``fusecut serve``.

From the hostile-input reviews: issue 12 (defect 8), issue 19 (defects 5 and 6) and issue 32
(defect 9: the intermediate limit bounds the computed tensors alive at once, not each one).
"""

from __future__ import annotations

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
