"""What an execution sends back, and what it may be sent (issue 45): the per-segment timings of
a safetensors response travel in the body (its ``__metadata__``), never in one header that grows
with the plan (163 KB for 1,500 segments: the SDK's default ``Client.execute`` then reported the
service unreachable after the execution ran, and proxies fail at 40-75 segments); a multipart
body's definition part may be as large as the service's own limits allow (the framework's 1 MiB
part limit refused a 15,000-op definition, 1.1 MB of wire JSON, with a 400)."""

from __future__ import annotations

import httpx
import pytest
import torch

import fusecut
from fusecut.service.routes.executions import MAX_SEGMENTS_HEADER_BYTES
from fusecut.wire.safetensors import metadata
from tests.server import Server


def chain(n: int, segments: bool = False) -> str:
    """A chain of ``n`` negations (every other one a forced segment boundary)."""
    lines = ["def fusion(fd):",
             "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)"]
    for i in range(1, n + 1):
        op = "segment_set" if segments and i % 2 == 0 else "neg"
        lines.append(f"    T{i} = fd.ops.{op}(T{i - 1})")
    lines.append(f"    fd.add_output(T{n})")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("responses") / "plans.sqlite",
                default_time_limit_s=1) as s:
        yield s


def test_timings_of_many_segments_come_in_the_body_not_one_huge_header(server):
    x = torch.randn(16)
    with fusecut.Client(server.url, timeout=300) as client:
        plan = client.plan(chain(400, segments=True), [x])
        assert len(plan.segments) >= 150, len(plan.segments)
        result = client.execute(plan, [x])  # safetensors: the default
    assert len(result.timings) == len(plan.segments)
    assert torch.equal(result.outputs[0], x)  # an even number of negations
    tensors = dump_of(x)
    response = httpx.post(f"{server.url}/v1/plans/{plan.plan_id}/execute", content=tensors,
                          headers={"content-type": "application/octet-stream"}, timeout=300)
    assert response.status_code == 200, response.text
    size = sum(len(k) + len(v) for k, v in response.headers.raw)
    assert size < 2 * MAX_SEGMENTS_HEADER_BYTES, size
    assert "x-fusecut-segments" not in response.headers  # it would not fit
    assert response.headers["x-fusecut-plan-id"] == plan.plan_id
    import json

    assert len(json.loads(metadata(response.content)["fusecut.segments"])) == len(plan.segments)


def test_a_few_segments_keep_their_header(server):
    x = torch.randn(16)
    with fusecut.Client(server.url, timeout=300) as client:
        plan = client.plan(chain(4, segments=True), [x])
        response = httpx.post(f"{server.url}/v1/plans/{plan.plan_id}/execute",
                              content=dump_of(x),
                              headers={"content-type": "application/octet-stream"})
    assert response.status_code == 200, response.text
    assert len(response.headers["x-fusecut-segments"]) <= MAX_SEGMENTS_HEADER_BYTES


def test_a_definition_part_over_one_mib_is_accepted(server):
    text = chain(15_000)
    x = torch.randn(8)
    with fusecut.Client(server.url, timeout=300) as client:
        result = client.execute(text, [x])  # multipart: the definition as wire JSON, 1.1 MB
    assert torch.equal(result.outputs[0], x)  # an even number of negations


def test_a_definition_part_past_the_plan_body_limit_is_a_413_naming_it(server):
    files = {"tensors": ("t.safetensors", dump_of(torch.randn(4)), "application/octet-stream")}
    response = httpx.post(f"{server.url}/v1/execute", files=files,
                          data={"definition": "x" * (17 * 1024 * 1024)}, timeout=120)
    assert response.status_code == 413, response.text
    problem = response.json()
    assert "FUSECUT_MAX_PLAN_BODY_BYTES" in problem["detail"], problem


def dump_of(x: torch.Tensor) -> bytes:
    from fusecut.wire.tensors import dump_safetensors

    return dump_safetensors({"T0": x})
