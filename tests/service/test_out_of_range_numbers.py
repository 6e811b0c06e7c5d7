"""Numbers out of range are refused, naming the field and the value, and never planned with: int64
data past 2**63 (on a connection that stays open), NaN, Infinity and absurd option values,
scalars past their dtype. Run against the real ``fusecut serve`` (tests/server.py).

From the hostile-input reviews: issue 12 (defects 3 and 4) and issue 19 (defect 10).
"""

from __future__ import annotations

import json
from http.client import HTTPConnection

import httpx
import pytest

from tests.service.test_service import SMALL, assert_problem, small_metas
from tests.service.workloads import kserve_body

INT64_MAX = 2**63 - 1


def test_out_of_range_int64_data_is_a_422_on_a_kept_connection(server):
    host, port = server.url.removeprefix("http://").split(":")
    conn = HTTPConnection(host, int(port), timeout=60)
    for value in (1180591620717411303424, -(2**63) - 1, 2**64):
        body = json.dumps(kserve_body([1, value]))
        conn.request("POST", "/v1/execute", body, {"content-type": "application/json"})
        response = conn.getresponse()
        payload = json.loads(response.read())
        assert response.status == 422, payload
        assert response.getheader("content-type").startswith("application/problem+json")
        assert str(value) in payload["detail"] and "T0" in payload["detail"]
        assert response.getheader("x-request-id")
    # the same connection still answers, and in-range data works
    conn.request("POST", "/v1/execute", json.dumps(kserve_body([INT64_MAX, -3])),
                 {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["outputs"][0]["data"] == [-INT64_MAX, 3]
    conn.close()


def plan_raw(http, options: str) -> httpx.Response:
    """A plan request with ``options`` spliced in as raw JSON text (NaN and Infinity are not
    JSON, so json.dumps would refuse or rewrite them)."""
    head = json.dumps({"definition": SMALL, "inputs": small_metas()})[:-1]
    return http.post("/v1/plan", content=f'{head}, "options": {options}}}'.encode(),
                     headers={"content-type": "application/json"})


@pytest.mark.parametrize("options, field", [
    ('{"device_overrides": {"compute_rate": NaN}}', "device_overrides.compute_rate"),
    ('{"device_overrides": {"compute_rate": Infinity}}', "device_overrides.compute_rate"),
    ('{"device_overrides": {"bandwidth": 1e-300}}', "device_overrides.bandwidth"),
    ('{"device_overrides": {"bandwidth": -Infinity}}', "device_overrides.bandwidth"),
    ('{"device_overrides": {"sm_count": 1e300}}', "device_overrides.sm_count"),
    ('{"device_overrides": {"arch": "sm_90; rm -rf"}}', "device_overrides.arch"),
    ('{"device_overrides": {"warp_size": 64}}', "device_overrides.warp_size"),
    ('{"launch_weight": Infinity}', "launch_weight"),
    ('{"compute_weight": NaN}', "compute_weight"),
    ('{"launch_weight": 1e300}', "launch_weight"),
    ('{"time_limit_s": NaN}', "time_limit_s"),
    ('{"seed": 1180591620717411303424}', "seed"),
])
def test_non_finite_or_absurd_options_are_a_422_naming_the_field(http, options, field):
    assert_problem(plan_raw(http, options), 422, field)


def test_nan_and_infinity_never_share_a_plan_and_plans_are_strict_json(http):
    statuses = {plan_raw(http, f'{{"compute_weight": {v}}}').status_code
                for v in ("NaN", "Infinity")}
    assert statuses == {422}
    good = plan_raw(http, '{"device_overrides": {"bandwidth": 2e12, "compute_rate": 3e13}}')
    assert good.status_code == 200, good.text

    def refuse(token):
        raise AssertionError(f"bare {token} in the plan JSON")

    plan = json.loads(good.text, parse_constant=refuse)
    other = plan_raw(http, '{"device_overrides": {"bandwidth": 3e12, "compute_rate": 3e13}}')
    assert other.status_code == 200 and other.json()["plan_id"] != plan["plan_id"]


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


NONE_ARGUMENTS = {
    "reshape": "fd.ops.reshape(T0, new_shape=None)",
    "pad": "fd.ops.pad(T0, None)",
    "expand": "fd.ops.expand(T0, shape=None)",
    "broadcast_in_dim": "fd.ops.broadcast_in_dim(T0, shape=None, broadcast_dims=[0, 1])",
    "slice": "fd.ops.slice(T0, start_indices=None, end_indices=[1, 1])",
    "full": "fd.ops.full(shape=None, fill_value=1.0, dtype=DataType.Float)",
    "uniform": "fd.ops.uniform(0.0, 1.0, shape=None, dtype=DataType.Float)",
}


@pytest.mark.parametrize("op", sorted(NONE_ARGUMENTS))
def test_none_as_a_shape_or_index_list_is_a_422_naming_the_line(http, op):
    # issue 45: None (null in wire JSON) where a list of extents goes was a 500
    text = ("def f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
            "dtype=DataType.Float)\n"
            f"    T1 = {NONE_ARGUMENTS[op]}\n"
            "    fd.add_output(T1)\n")
    r = http.post("/v1/plan", json={"definition": text,
                                    "inputs": [{"shape": [2, 3], "dtype": "float32"}]})
    assert_problem(r, 422, "line 3", op, "got None")


def test_null_shape_in_wire_json_is_a_422(http):
    from fusecut.optimizer.ir import parse_text
    from fusecut.optimizer.ir.wire import fusion_to_json

    wire = fusion_to_json(parse_text(
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
        "dtype=DataType.Float)\n"
        "    fd.add_output(fd.ops.reshape(T0, new_shape=[3, 2]))\n").fusion)
    (op,) = wire["ops"]
    op["attrs"]["new_shape"] = None
    r = http.post("/v1/plan", json={"definition": wire,
                                    "inputs": [{"shape": [2, 3], "dtype": "float32"}]})
    assert_problem(r, 422, "new_shape", "got None")


def test_float_of_a_complex_is_a_422_naming_the_line(http):
    text = ("def f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            "    S1 = fd.define_scalar(float(complex(1, 2)), dtype=DataType.Double)\n"
            "    fd.add_output(fd.ops.mul(T0, S1))\n")
    r = http.post("/v1/plan", json={"definition": text,
                                    "inputs": [{"shape": [4], "dtype": "float32"}]})
    assert_problem(r, 422, "line 3", "complex")
