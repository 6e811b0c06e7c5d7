"""POST /v1/plan with symbolic extents (issue 44): a -1 in an input's shape is an extent of any
size. The plan is searched once, at a stand-in size, says where it holds (``valid_for``), and
runs by its id on tensors of any size of that extent (rebound to them, no search). A -1 on an
extent the plan turns on, a pattern broken at run time, or a hint without a -1 is a 422 naming
the input and axis."""

from __future__ import annotations

import httpx
import pytest
import torch

import fusecut
from tests.server import Server

# exp of every element and each row's sum of them: rows free, the row's length fixed
ROW_SUMS = """def fusion(fd):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    T1 = fd.ops.exp(T0)
    T2 = fd.ops.sum(T1, dims=[1])
    fd.add_output(T1)
    fd.add_output(T2)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("symbolic") / "plans.sqlite",
                default_time_limit_s=2) as s:
        yield s


def plan(server, shape, **extra) -> httpx.Response:
    body = {"definition": ROW_SUMS, "inputs": [{"dtype": "float32", "shape": shape}], **extra}
    return httpx.post(f"{server.url}/v1/plan", json=body, timeout=120)


def test_a_symbolic_plan_says_where_it_holds_and_is_one_entry(server):
    first = plan(server, [-1, 64])
    assert first.status_code == 200, first.text
    data = first.json()
    assert data["symbolic"] == [[0, 0]]
    assert data["valid_for"] == [{"input": "T0", "shape": [{"min": 2, "max": None}, 64]}]
    again = plan(server, [-1, 64])
    assert again.json()["plan_id"] == data["plan_id"]
    assert again.headers["x-fusecut-cache"] == "hit"
    # the stand-in size planned concretely is another plan: it holds for that size only
    concrete = plan(server, [1024, 64]).json()
    assert concrete["plan_id"] != data["plan_id"] and "valid_for" not in concrete
    # another stand-in searches again, but says the same
    hinted = plan(server, [-1, 64], size_hint=300).json()
    assert hinted["plan_id"] != data["plan_id"]
    assert hinted["valid_for"] == data["valid_for"]


@pytest.mark.parametrize("rows", [2, 3, 1500])
def test_a_symbolic_plan_runs_by_its_id_on_any_number_of_rows(server, rows):
    plan_id = plan(server, [-1, 64]).json()["plan_id"]
    x = torch.randn(rows, 64)
    with fusecut.Client(server.url, timeout=300) as client:  # the SDK takes -1 in metadata
        view = client.plan(ROW_SUMS, [{"dtype": "float32", "shape": [-1, 64]}])
        assert view.plan_id == plan_id
        result = client.execute(view, [x])
    exp, sums = result.outputs
    torch.testing.assert_close(exp, torch.exp(x))
    torch.testing.assert_close(sums, torch.exp(x).sum(1))


def test_a_run_off_the_pattern_is_a_422_naming_the_axis(server):
    with fusecut.Client(server.url, timeout=300) as client:
        view = client.plan(ROW_SUMS, [{"dtype": "float32", "shape": [-1, 64]}])
        with pytest.raises(fusecut.ServiceError) as e:
            client.execute(view, [torch.randn(5, 32)])
        assert e.value.status == 422
        assert "T0 axis 1" in str(e.value) and "extent 64, got 32" in str(e.value)
        with pytest.raises(fusecut.ServiceError) as e:
            client.execute(view, [torch.randn(1, 64)])
        assert e.value.status == 422 and "at least 2, got 1" in str(e.value)


@pytest.mark.parametrize("body, says", [
    ({"inputs": [{"dtype": "float32", "shape": [1000, -1]}]}, "T0 axis 1"),
    ({"inputs": [{"dtype": "float32", "shape": [-1, 64], "strides": [64, 1]}]},
     "takes no strides"),
    ({"inputs": [{"dtype": "float32", "shape": [8, 64]}], "size_hint": 16}, "size_hint"),
    ({"inputs": [{"dtype": "float32", "shape": [-2, 64]}]}, "negative extent"),
])
def test_a_symbolic_request_that_cannot_hold_is_a_422_naming_why(server, body, says):
    response = httpx.post(f"{server.url}/v1/plan", json={"definition": ROW_SUMS, **body},
                          timeout=120)
    assert response.status_code == 422, response.text
    assert says in response.json()["detail"], response.json()


def test_a_worker_rebinds_a_symbolic_plan_once_a_shape(monkeypatch):
    import json

    import fusecut.optimizer.plan.rebind as rebind
    from fusecut.service.planning import plan_body
    from fusecut.service.processes.results import ExecutionResult
    from fusecut.service.processes.worker import Job, _Runner
    from fusecut.service.settings import Settings

    body = {"definition": ROW_SUMS, "inputs": [{"dtype": "float32", "shape": [-1, 64]}]}
    planned = plan_body(json.dumps(body).encode(), Settings(db_path=":memory:"), False)
    source = (planned.request, planned.body.decode())
    binds = []
    real = rebind.bind_symbolic
    monkeypatch.setattr(rebind, "bind_symbolic", lambda *a: binds.append(1) or real(*a))
    runner = _Runner()
    for rows in (7, 7, 300, 7):
        x = torch.randn(rows, 64)
        answer = runner.execute(Job(planned.plan_id, {"T0": x}), source)
        assert isinstance(answer, ExecutionResult), answer
        torch.testing.assert_close(dict(answer.outputs)["T2"], torch.exp(x).sum(1))
    assert len(binds) == 2  # 7 rows, then 300: each once
