"""A FusionDefinition planned and run on a service (``remote=URL``), as wire JSON: the service
takes it without a word in its log (issue 45, new-user item 5: every ``fd.plan(...,
remote=URL)`` made the service log a Pydantic serializer warning, from hashing the request)."""

from __future__ import annotations

import warnings

import torch

from fusecut import DataType, FusionDefinition
from fusecut.service.models import PlanRequest
from tests.server import Server


def definition() -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s = fd.define_scalar(2.0, dtype=DataType.Double)
        fd.add_output(fd.ops.mul(fd.ops.exp(t0), s))
    return fd


def test_a_wire_json_request_serializes_without_warnings():
    from fusecut.optimizer.ir.wire import fusion_to_json

    body = PlanRequest.model_validate({"definition": fusion_to_json(definition().fusion),
                                       "inputs": [{"shape": [4, 8], "dtype": "float32"}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert body.model_dump_json()


def test_remote_plans_leave_no_warning_in_the_log(tmp_path):
    fd, x = definition(), torch.rand(4, 8)
    with Server(tmp_path / "plans.sqlite") as server:
        plan = fd.plan([x], remote=server.url)
        (y,) = fd.execute([x], remote=server.url)
    assert plan.plan_id and torch.allclose(y, torch.exp(x) * 2)
    log = server.log.read_text()
    assert "Warning" not in log and "PydanticSerializationUnexpectedValue" not in log, log[-2000:]
