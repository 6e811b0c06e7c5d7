"""Every way an execution can fail has one answer (service.problems.EXECUTION_FAILURES), and the
client gets it whichever worker ran the execution: a worker of the service's own, or a Ray
executor replica behind a planner replica.

The real workers' failures are run elsewhere against the real ``fusecut serve``: inputs that do
not match (test_dtypes, test_service), results over the limits (test_limits), an unknown plan
(test_service), a worker killed mid-request (test_service); a timeout is run here, and so are
ops that torch refuses as a plan runs (issue 32, defect 6: a 422 naming the op, never a 500).
"""

from __future__ import annotations

import asyncio
import pickle

import httpx
import pytest
import torch

from fusecut.optimizer.errors import DefinitionError, FusecutError, InputError, PlanError
from fusecut.service.admission import Gate
from fusecut.service.app import create_app
from fusecut.service.problems import EXECUTION_FAILURES
from fusecut.service.processes.limits import ResultTooLarge
from fusecut.service.processes.results import ExecutionFailure, FailureKind, refusal
from fusecut.service.ray_serve import Executor, RemoteWorker
from fusecut.service.settings import Settings
from fusecut.wire.tensors import dump_safetensors
from tests.server import Server, ThreadServer
from tests.service.test_service import assert_problem
from tests.service.workloads import NEG, heavy_request

SAFETENSORS = {"content-type": "application/octet-stream"}


def test_every_failure_kind_has_one_answer():
    assert set(EXECUTION_FAILURES) == set(FailureKind)
    for kind, answered in EXECUTION_FAILURES.items():
        assert 400 <= answered.status < 600 and answered.title, kind
        if answered.retry_after_s is not None:  # "come back later": a 503
            assert answered.status == 503, kind
    # only a bug's message stays in the log: it may hold internals
    assert [k for k, a in EXECUTION_FAILURES.items() if a.detail] == [FailureKind.INTERNAL]


def test_fusecut_errors_are_refusals_of_their_kind():
    assert refusal(InputError("T0 is float64")) == ExecutionFailure(
        FailureKind.INPUTS_MISMATCH, "T0 is float64")
    assert refusal(ResultTooLarge("T2: 1 GiB")).kind is FailureKind.RESULT_TOO_LARGE
    assert refusal(DefinitionError("no such op")).kind is FailureKind.INVALID_DEFINITION
    assert refusal(PlanError("cannot")).kind is FailureKind.CANNOT_EXECUTE
    unexpected = refusal(FusecutError("what"))
    assert unexpected.kind is FailureKind.INTERNAL and "FusecutError" in unexpected.message


class FailingWorker:
    """A worker (what service.core.Service runs executions on) whose every execution fails as
    ``kind``, the value a worker answers with."""

    ready, device, pid, restarts = True, "cpu", None, 0

    def __init__(self):
        self.kind = FailureKind.INTERNAL

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def snapshot(self) -> list:
        return []

    def __len__(self) -> int:
        return 1

    async def execute(self, job, source, timeout) -> ExecutionFailure:
        return ExecutionFailure(self.kind, f"it failed as {self.kind.value}")


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """(a served app whose executions fail as its worker's ``kind``, that worker, the id of a
    plan it made: an unknown id is a 404 before any tensor is read)."""
    worker = FailingWorker()
    app = create_app(Settings(db_path=str(tmp_path_factory.mktemp("failing") / "p.sqlite")),
                     worker=worker)
    with ThreadServer(app) as server:
        plan = httpx.post(f"{server.url}/v1/plan", timeout=60, json={
            "definition": NEG, "inputs": [{"shape": [4], "dtype": "float32"}]})
        assert plan.status_code == 200, plan.text
        yield server, worker, plan.json()["plan_id"]


@pytest.mark.parametrize("kind", list(FailureKind))
def test_each_failure_reaches_the_client_with_its_status(failing, kind):
    server, worker, plan_id = failing
    worker.kind = kind
    response = httpx.post(f"{server.url}/v1/plans/{plan_id}/execute", headers=SAFETENSORS,
                          content=dump_safetensors({"T0": torch.ones(4)}), timeout=60)
    answered = EXECUTION_FAILURES[kind]
    body = assert_problem(response, answered.status)
    assert body["title"] == answered.title
    assert body["detail"] == (answered.detail or f"it failed as {kind.value}")
    assert response.headers.get("retry-after") == (
        None if answered.retry_after_s is None else str(answered.retry_after_s))


class SerializingHandle:
    """A stand-in for Ray Serve's handle on the Executor deployment: its calls reach an
    Executor in this process, their arguments and answers pickled as Ray pickles them."""

    def __init__(self, executor: Executor):
        self.execute = self.Method(executor.execute)
        self.status = self.Method(executor.status)

    class Method:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *args):
            args = pickle.loads(pickle.dumps(args))
            if asyncio.iscoroutinefunction(self.fn):
                async def call():
                    return pickle.loads(pickle.dumps(await self.fn(*args)))
                return call()
            return DeploymentResponse(pickle.loads(pickle.dumps(self.fn(*args))))


class DeploymentResponse:
    """What ``handle.method.remote()`` gives a synchronous caller: ``.result()``."""

    def __init__(self, value):
        self.value = value

    def result(self, timeout_s: float | None = None):
        return self.value


def test_a_ray_executors_failures_reach_the_client_with_their_status(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSECUT_WORKER", "0")  # the executor's worker runs in this process
    monkeypatch.setenv("FUSECUT_WORKERS_PER_DEVICE", "1")
    executor = Executor({})
    app = create_app(Settings(db_path=str(tmp_path / "p.sqlite")),
                     worker=RemoteWorker(SerializingHandle(executor), 1))
    try:
        with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            x = torch.arange(4.0)
            ran = http.post("/v1/execute", files={"tensors": ("t", dump_safetensors({"T0": x}))},
                            data={"definition": NEG})
            assert ran.status_code == 200, ran.text
            plan_id = ran.headers["x-fusecut-plan-id"]
            assert_problem(http.post(f"/v1/plans/{'e' * 32}/execute", headers=SAFETENSORS,
                                     content=dump_safetensors({"T0": x})), 404, "e" * 32)
            mismatch = http.post(f"/v1/plans/{plan_id}/execute", headers=SAFETENSORS,
                                 content=dump_safetensors({"T0": x.double()}))
            assert assert_problem(mismatch, 422, "T0", "float64")["title"] == \
                "inputs do not match"
    finally:
        executor.pool.stop()


def test_a_full_ray_executor_answers_busy():
    executor = Executor.__new__(Executor)  # no pool: the gate refuses before it is used
    executor.gate = Gate("execution", 1, 0, 0.1)

    async def while_its_slot_is_held():
        async with executor.gate.slot(""):
            return await executor.execute(None, ("", ""), 1.0)

    failure = asyncio.run(while_its_slot_is_held())
    assert failure.kind is FailureKind.EXECUTOR_BUSY and "waiting" in failure.message


def test_an_execution_past_its_timeout_is_a_504_and_the_worker_restarts(tmp_path):
    with Server(tmp_path / "plans.sqlite", execute_timeout_s=0.3) as server:
        before = httpx.get(f"{server.url}/readyz", timeout=30).json()["worker_restarts"]
        response = heavy_request(server.url)  # seconds of work
        body = assert_problem(response, 504, "0.3 s", "restarted")
        assert body["title"] == EXECUTION_FAILURES[FailureKind.WORKER_TIMED_OUT].title
        after = httpx.get(f"{server.url}/readyz", timeout=30).json()["worker_restarts"]
        assert after == before + 1



# ---- issue 32 (defect 6): what torch refuses as a plan runs is a 422 naming the op -------------

ONE_OP = "def f(fd):\n{defs}    T9 = fd.ops.{call}\n    fd.add_output(T9)\n"
INT = "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{dtype})\n"


def one_op(call: str, dtype: str = "Int", second: str | None = None) -> str:
    defs = INT.format(dtype=dtype)
    if second:
        defs += INT.format(dtype=second).replace("T0", "T1")
    return ONE_OP.format(defs=defs, call=call)


EMBEDDING = ("def f(fd):\n" + INT.format(dtype="Int") +
             "    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
             "dtype=DataType.Float)\n"
             "    T9 = fd.ops.embedding_fwd(T0, T1, None, None, None, None, None)\n"
             "    fd.add_output(T9)\n")


def json_tensor(name: str, datatype: str, data: list, shape: list | None = None) -> dict:
    return {"name": name, "datatype": datatype, "data": data,
            "shape": shape if shape is not None else [len(data)]}


@pytest.mark.parametrize("definition, tensors, op", [
    # the values decide: no planner can refuse these
    (EMBEDDING, [json_tensor("T0", "INT64", [0, 99]),
                 json_tensor("T1", "FP32", [0.0] * 12, [4, 3])], "embedding_fwd"),
    (one_op("fmod(T0, T1)", "Int", "Int"), [json_tensor("T0", "INT64", [1, 2]),
                                            json_tensor("T1", "INT64", [1, 0])], "fmod"),
    # the dtypes decide (a 422 at planning names the op as well)
    (one_op("neg(T0)", "Bool"), [json_tensor("T0", "BOOL", [True, False])], "neg"),
    (one_op("bitwise_left_shift(T0, T0)", "Bool"), [json_tensor("T0", "BOOL", [True])],
     "bitwise_left_shift"),
    (one_op("nextafter(T0, T0)"), [json_tensor("T0", "INT64", [1, 2])], "nextafter"),
], ids=["embedding-index", "fmod-by-zero", "neg-bool", "shift-bool", "nextafter-int"])
def test_ops_torch_refuses_are_a_422_naming_the_op(http, definition, tensors, op):
    before = http.get("/readyz").json()["worker_restarts"]
    response = http.post("/v1/execute", json={"definition": definition, "inputs": tensors})
    body = assert_problem(response, 422, op)
    assert "Traceback" not in body["detail"]
    assert http.get("/readyz").json()["worker_restarts"] == before


def test_full_beyond_its_dtype_converts_as_a_cast_does(http):
    # issue 32 found a 500 here (torch's overflow error); nvFuser's kernels convert the value as
    # a cast does, and so does the reference: 1e300 in half is inf
    response = http.post("/v1/execute", json={
        "definition": "def f(fd):\n    T9 = fd.ops.full(shape=[4], fill_value=1e300, "
                      "dtype=DataType.Half)\n    fd.add_output(T9)\n", "inputs": []})
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["inf"] * 4


def test_an_op_torch_refuses_on_an_extended_dtype_is_a_422(http):
    uint64 = torch.tensor([1, 2], dtype=torch.uint64)
    response = http.post("/v1/execute", data={"definition": one_op("add(T0, T0)", "UInt64")},
                         files={"tensors": ("t", dump_safetensors({"T0": uint64}))})
    assert_problem(response, 422, "add", "uint64")


def test_op_failures_name_the_op_and_its_segment():
    from fusecut.optimizer.ir.nvtext import parse_text
    from fusecut.optimizer.planner import PlanOptions, make_plan
    from fusecut.runtime.errors import OpFailed
    from fusecut.runtime.run import run_plan
    from fusecut.runtime.tensors import meta_of

    args = [torch.tensor([0, 99]), torch.randn(4, 3)]
    plan = make_plan(parse_text(EMBEDDING).fusion, [meta_of(a) for a in args],
                     PlanOptions(segmenter="greedy"))
    with pytest.raises(OpFailed) as refused:
        run_plan(plan, args, timed=True)
    message = str(refused.value)
    assert message.startswith("op 0 embedding_fwd(T0: int64, T1: float32) -> T9: float32, in "
                              "segment 0"), message
    assert "index out of range" in message
    assert refusal(refused.value).kind is FailureKind.CANNOT_EXECUTE
