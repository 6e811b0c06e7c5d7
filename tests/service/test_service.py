"""The HTTP service, run for real: ``fusecut serve`` (uvicorn) on a free loopback port.

Covers planning from text and JSON, the SQLite plan cache across restarts, executions with
safetensors and KServe-style JSON against the torch reference, every refusal as problem+json,
limits and the API key, a crash of the GPU worker mid-request, metrics and the dashboard.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import fusecut
from fusecut import DataType, FusionDefinition
from fusecut.optimizer.ir import fusion_to_json, parse_text
from fusecut.optimizer.ir.inputs import scale_metas
from fusecut.optimizer.ir.wire import meta_to_json
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input
from fusecut.wire.tensors import dump_safetensors, load_safetensors, to_json
from tests.conftest import CORPUS
from tests.server import Server

PROBLEM = "application/problem+json"
SMALL = """
def fusion(fd):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Half)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    S2 = fd.define_scalar(None, dtype=DataType.Double)
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4 = fd.ops.broadcast_in_dim(T1, shape=T3.shape(), broadcast_dims=[1])
    T5 = fd.ops.mul(T3, T4)
    T6 = fd.ops.mul(T5, S2)
    T7 = fd.ops.sum(T6, dims=[1], keepdim=False)
    T8 = fd.ops.exp(T6)
    T9 = fd.ops.cast(T8, dtype=DataType.Half)
    fd.add_output(T7)
    fd.add_output(T9)
"""
SMALL_FUSION = parse_text(SMALL).fusion


def small_args(rows: int = 6, cols: int = 10) -> list:
    g = torch.Generator().manual_seed(rows * 100 + cols)
    return [torch.randn(rows, cols, generator=g).half(), torch.randn(cols, generator=g), 0.5]


def small_metas(rows: int = 6, cols: int = 10) -> list[dict]:
    return [{"shape": [rows, cols], "dtype": "float16"}, {"shape": [cols], "dtype": "float32"},
            {"dtype": "float64", "value": 0.5}]


def assert_problem(response: httpx.Response, status: int, *mentions: str) -> dict:
    """A problem+json refusal with this status whose detail names each of ``mentions``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    for text in mentions:
        assert text in body["detail"], (text, body["detail"])
    return body


# ---- planning -----------------------------------------------------------------------------------

def test_plan_from_text_matches_local_planning(http):
    path = CORPUS / "seed_2146_rmsnorm_bwd.py"
    parsed = fusecut.load(path)
    response = http.post("/v1/plan", json={"definition": path.read_text(),
                                           "options": {"time_limit_s": 5}})
    assert response.status_code == 200, response.text
    assert response.headers["x-fusecut-cache"] == "miss"
    plan = response.json()
    local = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=5)).to_json()
    assert plan["plan_id"] == local["plan_id"]
    assert plan["totals"]["io_bytes"] == local["totals"]["io_bytes"]
    assert plan["totals"]["io_bytes"] < plan["baseline"]["io_bytes"]  # beats greedy here
    assert http.get(f"/v1/plans/{plan['plan_id']}").json() == plan


def test_plan_from_json_is_the_same_plan_as_from_text(http):
    text_plan = http.post("/v1/plan", json={"definition": SMALL, "inputs": small_metas()}).json()
    wire = {"definition": fusion_to_json(SMALL_FUSION), "inputs": small_metas()}
    response = http.post("/v1/plan", json=wire)
    assert response.status_code == 200, response.text
    assert response.headers["x-fusecut-cache"] == "hit"  # same fusion, metadata, options
    assert response.json() == text_plan
    other = http.post("/v1/plan", json=dict(wire, options={"segmenter": "greedy"})).json()
    assert other["plan_id"] != text_plan["plan_id"] and other["segmenter"] == "greedy"


def test_cached_plan_survives_a_restart(tmp_path):
    db = tmp_path / "plans.sqlite"
    body = {"definition": (CORPUS / "softmax_fwd.py").read_text(),
            "inputs": [{"shape": [8, 16], "dtype": "bfloat16"}]}
    with Server(db) as first:
        made = httpx.post(f"{first.url}/v1/plan", json=body, timeout=60)
        assert made.headers["x-fusecut-cache"] == "miss"
    assert db.exists()
    with Server(db) as second:
        again = httpx.post(f"{second.url}/v1/plan", json=body, timeout=60)
        assert again.headers["x-fusecut-cache"] == "hit"
        assert again.json() == made.json()
        got = httpx.get(f"{second.url}/v1/plans/{made.json()['plan_id']}")
        assert got.json() == made.json()
        samples = metric_samples(httpx.get(f"{second.url}/metrics").text)
        assert count(samples, "fusecut_plans_total", cache="hit") == 1
        assert count(samples, "fusecut_solver_seconds_count") == 0  # nothing was solved
        # An execution by plan id rebuilds the stored plan rather than solving it again.
        x = torch.randn(8, 16).bfloat16()
        response = httpx.post(f"{second.url}/v1/execute", content=dump_safetensors({"T0": x}),
                              headers={"content-type": "application/octet-stream",
                                       "x-fusecut-plan-id": made.json()["plan_id"]})
        assert response.status_code == 200, response.text
        (want,) = run_reference(parse_text(body["definition"]).fusion, [x])
        torch.testing.assert_close(load_safetensors(response.content)["T9"], want)


# ---- executing ----------------------------------------------------------------------------------

def test_execute_json_matches_the_reference(http):
    args = small_args()
    names = SMALL_FUSION.inputs
    body = {"definition": SMALL, "inputs": [
        to_json(names[0], args[0]), to_json(names[1], args[1]),
        {"name": names[2], "shape": [], "datatype": "FP64", "data": [args[2]]}]}
    response = http.post("/v1/execute", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    want = run_reference(SMALL_FUSION, args)
    assert [o["name"] for o in result["outputs"]] == list(SMALL_FUSION.outputs)
    for got, expected in zip(result["outputs"], want):
        assert got["datatype"] == {torch.float32: "FP32", torch.float16: "FP16"}[expected.dtype]
        tensor = torch.tensor(got["data"], dtype=torch.float64).reshape(got["shape"])
        torch.testing.assert_close(tensor.to(expected.dtype), expected)
    assert result["segments"] and all(s["bytes"] > 0 for s in result["segments"])


@pytest.mark.parametrize("name", ["layernorm_bwd", "adam_step", "seed_3366_neg_broadcast_mul",
                                  "many_segments_stress"])
def test_execute_safetensors_corpus_matches_the_reference(http, name):
    parsed = fusecut.load(CORPUS / f"{name}.py")
    metas = scale_metas(parsed.inputs, 4096)
    g = torch.Generator().manual_seed(1)
    args = [make_input(m, "cpu", g) for m in metas]
    named = {n: (a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=torch.float64))
             for n, a in zip(parsed.fusion.inputs, args)}
    response = http.post("/v1/execute", files={"tensors": ("t.safetensors",
                                                           dump_safetensors(named))},
                         data={"definition": json.dumps(fusion_to_json(parsed.fusion))})
    assert response.status_code == 200, response.text
    outputs = load_safetensors(response.content)
    want = run_reference(parsed.fusion, args)
    for out, expected in zip(parsed.fusion.outputs, want):
        torch.testing.assert_close(outputs[out], expected)
    segments = json.loads(response.headers["x-fusecut-segments"])
    assert len(segments) == len(http.get(
        f"/v1/plans/{response.headers['x-fusecut-plan-id']}").json()["segments"])


def test_expanded_broadcast_inputs_travel_dense(http):
    text = """
def f(fd):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], dtype=DataType.Float)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    T2 = fd.ops.mul(T0, T1)
    fd.add_output(T2)
"""
    row, other = torch.randn(1, 5), torch.randn(4, 5)
    expanded = row.expand(4, 5)  # stride 0 on axis 0: safetensors sends it dense
    request = {"files": {"tensors": ("t", dump_safetensors({"T0": expanded, "T1": other}))},
               "data": {"definition": json.dumps(fusion_to_json(parse_text(text).fusion))}}
    response = http.post("/v1/execute", **request)
    assert response.status_code == 200, response.text
    torch.testing.assert_close(load_safetensors(response.content)["T2"], expanded * other)
    request["files"] = {"tensors": ("t", dump_safetensors({"T0": torch.randn(4, 5),
                                                           "T1": other}))}
    assert_problem(http.post("/v1/execute", **request), 422, "T0", "axis 0", "differ")


def test_sdk_clients_plan_and_execute(server):
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.ops.sum(fd.ops.exp(t0), dims=[1], keepdim=False, dtype=DataType.Null)
        fd.add_output(fd.ops.div(t0, fd.ops.broadcast_in_dim(t1, shape=t0.shape(),
                                                             broadcast_dims=[0])))
    x = torch.randn(5, 7)
    want = x / x.exp().sum(1, keepdim=True)
    with fusecut.Client(server.url) as client:
        plan = client.plan(fd, [x], time_limit_s=3)
        assert isinstance(plan, fusecut.PlanView)
        local = fd.plan([x], time_limit_s=3).to_json()  # the same plan as local planning
        assert {k: v for k, v in plan.to_json().items() if k != "solver"} == \
            {k: v for k, v in local.items() if k != "solver"}
        assert client.get_plan(plan.plan_id).to_json() == plan.to_json()
        for wire in ("safetensors", "json"):
            result = client.execute(fd, [x], wire=wire, time_limit_s=3)
            torch.testing.assert_close(result.outputs[0], want)
            assert result.plan_id == plan.plan_id and result.timings
        by_id = client.execute(plan, [x])  # the plan remembers the definition it came from
        torch.testing.assert_close(by_id.outputs[0], want)
        fetched = client.get_plan(plan.plan_id)
        with pytest.raises(ValueError, match="fusion="):
            client.execute(fetched, [x])
        torch.testing.assert_close(client.execute(fetched, [x], fusion=fd.fusion).outputs[0],
                                   want)
        text = (CORPUS / "softmax_fwd.py").read_text()
        y = torch.randn(64, 256).bfloat16()
        from_text = client.plan(text, [y])  # then run by plan id
        ran_text = client.execute(from_text, [y])
        assert ran_text.plan_id == from_text.plan_id
        torch.testing.assert_close(ran_text.outputs[0], run_reference(
            parse_text(text).fusion, [y])[0])
        with pytest.raises(fusecut.ServiceError) as caught:
            client.get_plan("0" * 32)
        assert caught.value.status == 404 and "0" * 32 in caught.value.detail
    (out,) = fd.execute([x], remote=server.url)
    torch.testing.assert_close(out, want)
    segments = fd.segment([x], remote=server.url)
    assert [s.kind for s in segments] == [s.kind for s in plan.segments]

    async def concurrently():
        async with fusecut.AsyncClient(server.url) as client:
            shapes = [(n, 3) for n in range(1, 9)]
            plans = await asyncio.gather(*(client.plan(fd, [torch.empty(s)]) for s in shapes))
            ran = await client.execute(fd, [x])
            return plans, ran

    plans, ran = asyncio.run(concurrently())
    assert len({p.plan_id for p in plans}) == 8
    torch.testing.assert_close(ran.outputs[0], want)


# ---- refusals -----------------------------------------------------------------------------------

def test_plan_refusals_are_problem_json(http):
    post = lambda body: http.post("/v1/plan", json=body)  # noqa: E731
    assert_problem(http.post("/v1/plan", content=b"{not json",
                             headers={"content-type": "application/json"}), 422, "JSON")
    assert_problem(post({"inputs": []}), 422, "definition")
    assert_problem(post({"definition": SMALL, "extra": 1}), 422, "extra")
    bad_op = SMALL.replace("fd.ops.exp(T6)", "fd.ops.frobnicate(T6)")
    assert_problem(post({"definition": bad_op, "inputs": small_metas()}), 422, "frobnicate",
                   "line 11")
    bad_dims = SMALL.replace("dims=[1], keepdim", "dims=[5], keepdim")
    assert_problem(post({"definition": bad_dims, "inputs": small_metas()}), 422, "sum")
    assert_problem(post({"definition": SMALL}), 422, "inputs")
    assert_problem(post({"definition": SMALL, "inputs": small_metas()[:2]}), 422, "3")
    wrong_rank = [{"shape": [6], "dtype": "float16"}] + small_metas()[1:]
    assert_problem(post({"definition": SMALL, "inputs": wrong_rank}), 422, "T0")
    wrong_dtype = [{"shape": [6, 10], "dtype": "float32"}] + small_metas()[1:]
    assert_problem(post({"definition": SMALL, "inputs": wrong_dtype}), 422, "T0")
    assert_problem(post({"definition": SMALL, "inputs": small_metas(),
                         "options": {"segmenter": "magic"}}), 422, "segmenter")
    assert_problem(post({"definition": SMALL, "inputs": small_metas(),
                         "options": {"time_limit_s": 1e6}}), 422, "time_limit_s")
    assert_problem(post({"definition": SMALL, "inputs": small_metas(),
                         "options": {"device": "TPU"}}), 422, "TPU")
    assert_problem(post({"definition": SMALL, "inputs": small_metas(),
                         "options": {"kinds": ["pointwise"]}}), 422, "library")
    assert_problem(http.get("/v1/plans/" + "f" * 32), 404, "f" * 32)
    assert_problem(http.get("/v1/plans/not-an-id!"), 422, "not-an-id")
    assert_problem(http.get("/v2/nothing"), 404)
    assert_problem(http.delete("/v1/plan"), 405)


def test_repeated_executions_skip_the_planner(tmp_path, monkeypatch):
    # an execution's definition is parsed and planned in a planner process; the same
    # definition, options and input metadata again go straight to a worker
    import fusecut.service.core as core
    from fusecut.service.settings import Settings

    service = core.Service(Settings(db_path=str(tmp_path / "p.sqlite"), worker=False))
    jobs = []
    real = service.off_loop

    async def counted(fn, *args, **kwargs):
        jobs.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(service, "off_loop", counted)
    args = small_args()
    tensors = dict(zip(SMALL_FUSION.inputs, args[:2] + [torch.tensor(args[2])]))
    options = json.dumps({"segmenter": "greedy"})

    async def plans():
        first = await service.plan_for_tensors(SMALL, options, tensors)
        again = await service.plan_for_tensors(SMALL, options, tensors)
        wider = dict(tensors, T0=torch.randn(6, 12).half(), T1=torch.randn(12))
        other = await service.plan_for_tensors(SMALL, options, wider)
        for _ in range(2):  # refusals are not remembered
            with pytest.raises(Exception, match="frobnicate"):
                await service.plan_for_tensors(SMALL.replace("exp", "frobnicate"), options,
                                               tensors)
        return first, again, other

    try:
        first, again, other = asyncio.run(plans())
    finally:
        service.stop()
    assert first == again != other
    assert jobs == ["plan_for_tensors"] * 4


def test_definition_text_is_parsed_never_run(http, tmp_path):
    marker = tmp_path / "pwned"
    evil = SMALL + f"\n    __import__('os').system('touch {marker}')\n"
    assert_problem(http.post("/v1/plan", json={"definition": evil, "inputs": small_metas()}),
                   422, "line")
    evil_dims = SMALL.replace("dims=[1]", f"dims=[open('{marker}', 'w')]")
    assert_problem(http.post("/v1/plan", json={"definition": evil_dims,
                                               "inputs": small_metas()}), 422)
    assert not marker.exists()


def test_execute_refusals_are_problem_json(http):
    args = small_args()
    good = {n: (a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=torch.float64))
            for n, a in zip(SMALL_FUSION.inputs, args)}
    definition = json.dumps(fusion_to_json(SMALL_FUSION))

    def multipart(tensors: dict, **data) -> httpx.Response:
        return http.post("/v1/execute", files={"tensors": ("t", dump_safetensors(tensors))},
                         data={"definition": definition, **data})

    assert multipart(good).status_code == 200
    assert_problem(multipart({k: v for k, v in good.items() if k != "T1"}), 422, "T1")
    assert_problem(multipart(dict(good, T7=torch.ones(1))), 422, "T7")
    assert_problem(multipart(dict(good, T0=good["T0"].float())), 422, "T0")
    assert_problem(multipart(dict(good, T1=torch.ones(11))), 422, "T1")
    assert_problem(multipart(dict(good, S2=torch.ones(2))), 422, "S2")
    assert_problem(multipart(good, options='{"segmenter": 3}'), 422, "segmenter")
    assert_problem(http.post("/v1/execute", files={"tensors": ("t", b"\x00garbage")},
                             data={"definition": definition}), 422, "safetensors")
    assert_problem(http.post("/v1/execute", data={"definition": definition}), 415,
                   "x-www-form-urlencoded")
    assert_problem(http.post("/v1/execute", files={"definition": (None, definition)}), 422,
                   "tensors")
    assert_problem(http.post("/v1/execute", files={"tensors": ("t", dump_safetensors(good))}),
                   422, "definition")
    assert_problem(http.post("/v1/execute", content=dump_safetensors(good),
                             headers={"content-type": "application/octet-stream"}), 422,
                   "X-Fusecut-Plan-Id")
    assert_problem(http.post("/v1/execute", content=dump_safetensors(good),
                             headers={"content-type": "application/octet-stream",
                                      "x-fusecut-plan-id": "a" * 32}), 404, "a" * 32)
    assert_problem(http.post("/v1/execute", content=b"x", headers={"content-type": "text/csv"}),
                   415, "text/csv")
    tensor = {"name": "T0", "shape": [2, 2], "datatype": "FP16", "data": [1, 2, 3]}
    assert_problem(http.post("/v1/execute", json={"definition": SMALL, "inputs": [tensor]}), 422,
                   "T0", "4 values")
    tensor = dict(tensor, datatype="FP8", data=[1, 2, 3, 4])
    assert_problem(http.post("/v1/execute", json={"definition": SMALL, "inputs": [tensor]}), 422,
                   "FP8")
    twice = dict(tensor, datatype="FP16")
    assert_problem(http.post("/v1/execute", json={"definition": SMALL,
                                                  "inputs": [twice, twice]}), 422, "repeat")
    assert_problem(http.post("/v1/execute", json={"plan_id": "b" * 32, "definition": SMALL,
                                                  "inputs": []}), 422, "not both")


def test_limits_and_api_key(tmp_path):
    settings = dict(max_body_bytes=60_000, max_ops=40, api_key="s3cret",
                    max_tensor_bytes=4096, max_solver_seconds=3)
    with Server(tmp_path / "plans.sqlite", **settings) as limited, \
            httpx.Client(base_url=limited.url, timeout=60,
                         headers={"authorization": "Bearer s3cret"}) as http:
        big = {"definition": SMALL + "#" * 70_000, "inputs": small_metas()}
        assert_problem(http.post("/v1/plan", json=big), 413, "60000")

        def streamed():  # no Content-Length: the limit applies as the body arrives
            yield json.dumps(big).encode()

        assert_problem(http.post("/v1/plan", content=streamed(),
                                 headers={"content-type": "application/json"}), 413)
        many = parse_text((CORPUS / "many_pointwise_chain.py").read_text())
        assert len(many.fusion.ops) > 40
        assert_problem(http.post("/v1/plan", json={
            "definition": fusion_to_json(many.fusion),
            "inputs": [meta_to_json(m) for m in many.inputs]}), 413, "40")
        assert_problem(http.post("/v1/plan", json={
            "definition": SMALL, "inputs": small_metas(), "options": {"time_limit_s": 10}}),
            422, "3")
        tensors = {"files": {"tensors": ("t", dump_safetensors(dict(zip(
            SMALL_FUSION.inputs, [small_args()[0], small_args()[1],
                                  torch.tensor(0.5, dtype=torch.float64)]))))},
            "data": {"definition": json.dumps(fusion_to_json(SMALL_FUSION))}}
        ok = http.post("/v1/execute", **tensors)
        assert ok.status_code == 200, ok.text
        big_tensors = dict(tensors, files={"tensors": ("t", dump_safetensors(dict(zip(
            SMALL_FUSION.inputs, [small_args(300, 10)[0], small_args(300, 10)[1],
                                  torch.tensor(0.5, dtype=torch.float64)]))))})
        assert_problem(http.post("/v1/execute", **big_tensors), 413, "4096")
        plan = http.post("/v1/plan", json={"definition": SMALL, "inputs": small_metas()})
        assert plan.status_code == 200
        # issue 19: the key guards every /v1 route, not only executions
        for method, route, kwargs in (
                ("POST", "/v1/execute", tensors),
                ("POST", "/v1/plan", {"json": {"definition": SMALL, "inputs": small_metas()}}),
                ("GET", f"/v1/plans/{plan.json()['plan_id']}", {}),
                ("POST", f"/v1/plans/{plan.json()['plan_id']}/execute", {"content": b"x"})):
            for header in ({}, {"authorization": "Bearer no"},
                           {"authorization": "Bearer s3cret0"}):
                refused = httpx.request(method, f"{limited.url}{route}", headers=header,
                                        **kwargs)
                assert_problem(refused, 401, "Bearer")
                assert refused.headers["www-authenticate"] == "Bearer"
        for route in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert httpx.get(f"{limited.url}{route}").status_code == 200, route
        # issue 32 (defect 13 of the probe): the dashboard shows plan ids, names and ops
        assert_problem(httpx.get(f"{limited.url}/dashboard"), 401, "Bearer")
        assert http.get("/dashboard").status_code == 200
        doc = httpx.get(f"{limited.url}/openapi.json").json()
        assert doc["paths"]["/v1/plan"]["post"]["security"] == [{"apiKey": []}]
        assert doc["paths"]["/dashboard"]["get"]["security"] == [{"apiKey": []}]
        assert "security" not in doc["paths"]["/healthz"]["get"]


def test_a_burst_of_dashboards_never_blocks_planning(tmp_path):
    # issue 32, defect 2: /dashboard drew in the plan gate; a burst of it turned 10/10
    # authenticated plans into 503s
    key = {"authorization": "Bearer k"}

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120, headers=key) as client:
            pages = [client.get("/dashboard") for _ in range(24)]
            plans = [client.post("/v1/plan", json={"definition": SMALL,
                                                   "inputs": small_metas(3, 3 + k)})
                     for k in range(3)]
            return await asyncio.gather(*pages, *plans)

    with Server(tmp_path / "plans.sqlite", api_key="k", max_concurrent_plans=1,
                max_queued_plans=2) as server:
        for k in range(4):  # something to draw
            assert httpx.post(f"{server.url}/v1/plan", headers=key, timeout=60, json={
                "definition": SMALL, "inputs": small_metas(4, 4 + k)}).status_code == 200
        answers = asyncio.run(burst(server.url))
        pages, plans = answers[:24], answers[24:]
        assert [r.status_code for r in plans] == [200] * 3, [r.text for r in plans]
        assert [r.status_code for r in pages] == [200] * 24, [r.text for r in pages]
        newest = httpx.get(f"{server.url}/dashboard", headers=key).text
        assert all(r.json()["plan_id"] in newest for r in plans)  # a new plan, a new page


# ---- robustness ---------------------------------------------------------------------------------

WEIRD = [None, -1, 0, 2**63, -2**70, 1e308, float("nan"), "", "x" * 500, [], {}, True,
         [[[]]], {"a": {"b": []}}, "float16", "T0", [-1, -1], [2**40, 2**40]]


def mutate(value, rng, depth: int = 0):
    """A copy of a JSON value with one random change somewhere inside."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.3:
            out[f"{key}_extra"] = rng.choice(WEIRD)
        else:
            out[key] = mutate(value[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        out = list(value)
        roll = rng.random()
        if roll < 0.2:
            del out[i]
        elif roll < 0.3:
            out.insert(i, out[i])
        else:
            out[i] = mutate(value[i], rng, depth + 1)
        return out
    if isinstance(value, str) and len(value) > 20 and rng.random() < 0.7:
        lines = value.splitlines()
        i = rng.randrange(len(lines))
        tweaks = [lambda s: "", lambda s: s.replace("T", "Q", 1), lambda s: s[: len(s) // 2],
                  lambda s: s.replace("[1]", "[7]"), lambda s: s.replace("Float", "Bogus"),
                  lambda s: s.replace("(", "((", 1), lambda s: s + " + 1",
                  lambda s: s.replace("mul", "add"), lambda s: s.replace("True", "False"),
                  lambda s: s.replace("shape=", "shape=[3]+", 1)]
        lines[i] = rng.choice(tweaks)(lines[i])
        return "\n".join(lines)
    return rng.choice(WEIRD)


def test_fuzzed_bodies_never_cause_a_server_error(http):
    import random

    rng = random.Random(20261122)
    args = small_args(3, 4)
    execute_body = {"definition": SMALL, "inputs": [
        to_json("T0", args[0]), to_json("T1", args[1]),
        {"name": "S2", "shape": [], "datatype": "FP64", "data": [0.5]}]}
    bases = [("/v1/plan", {"definition": SMALL, "inputs": small_metas(3, 4)}),
             ("/v1/plan", {"definition": fusion_to_json(SMALL_FUSION),
                           "inputs": small_metas(3, 4), "options": {"segmenter": "cpsat"}}),
             ("/v1/execute", execute_body)]
    kept = http.post("/v1/plan", json=bases[0][1]).json()
    statuses: dict[int, int] = {}
    for n in range(360):
        route, base = bases[n % len(bases)]
        body = base
        for _ in range(rng.randint(1, 3)):
            body = mutate(body, rng)
        raw = json.dumps(body, allow_nan=True).encode()
        if n % 9 == 0:  # broken bytes, not just odd JSON
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1:]
        response = http.post(route, content=raw, headers={"content-type": "application/json"})
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (body, response.text)
        if response.status_code >= 400:
            assert response.headers["content-type"].startswith(PROBLEM)
            assert response.json()["detail"]
            assert not internal_names(response.json()), response.text
    assert sum(v for k, v in statuses.items() if k >= 400) > 200  # the mutations bite
    assert http.get(f"/v1/plans/{kept['plan_id']}").json() == kept  # nothing stored was lost
    assert http.get("/healthz").json() == {"status": "ok"}


# pydantic's names for the branches of a union, which said nothing to a client (issue 32)
INTERNAL = re.compile(r"constrained-|FusionJSON|literal\[|function-(after|before|wrap)|"
                      r"^(bool|int|float|str)$")


def internal_names(answer: dict) -> list[str]:
    """The parts of a 422's locations (its detail's, and each listed error's) that name
    validators, not fields."""
    where = answer["detail"].split(": ", 1)[0]
    parts = [p for error in answer.get("errors") or [] for p in error["loc"]]
    parts += re.split(r"[. ()]+", where)
    return [p for p in parts if INTERNAL.search(p)]


def test_validation_errors_name_fields_not_validators(http):
    # issue 32: "definition.constrained-str: Input should be a valid string", and an invalid
    # wire JSON definition answered as "definition.FusionJSON.inputs: Field required"
    wire = fusion_to_json(SMALL_FUSION)
    cases = [
        ({"definition": 5}, "definition: a definition is nvFuser text (a string) or wire JSON "
                            "(an object)"),
        ({"definition": ""}, "definition (nvFuser text): String should have at least 1 "
                             "character"),
        ({"definition": {k: v for k, v in wire.items() if k != "inputs"}},
         "definition (wire JSON).inputs: Field required"),
        ({"definition": SMALL, "inputs": [{"dtype": "float64", "value": "x"}]},
         "inputs.0.value (non-finite number): Input should be 'inf', '-inf' or 'nan'"),
        ({"definition": SMALL, "inputs": [{"dtype": "float64", "value": []}]},
         'inputs.0.value: a number, "inf", "-inf" or "nan", or a complex number '
         '{"re": ..., "im": ...}'),
    ]
    for body, detail in cases:
        for route in ("/v1/plan", "/v1/execute"):
            if route == "/v1/execute" and "inputs" in body:
                continue  # its inputs are tensors
            answer = assert_problem(http.post(route, json=body), 422, detail)
            assert not internal_names(answer), (route, answer)


def heavy_definition(links: int = 120) -> str:
    """A long chain: seconds of work on the CPU path; on a GPU, a kernel never compiled before
    (the constant differs every run), so NVRTC is busy when the worker is killed. Its input is
    T0 and its output T122 whatever ``links`` is (about 10 ms of CPU per link over 4M elements)."""
    names = ["T0"] + [f"L{i}" for i in range(1, links + 1)]
    body = "".join(f"    {names[i + 1]} = fd.ops.sin(fd.ops.exp({names[i]}))\n"
                   for i in range(links))
    return (f"def heavy(fd):\n"
            f"    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            f"{body}    T121 = fd.ops.mul({names[-1]}, {time.time_ns() % 10**6 / 7:.6f})\n"
            f"    T122 = fd.ops.sum(T121, dims=[0], keepdim=False)\n"
            f"    fd.add_output(T122)\n")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_worker_killed_mid_request_then_requests_succeed(http):
    ready = http.get("/readyz").json()
    pids, restarts = [w["pid"] for w in ready["workers"]], ready["worker_restarts"]
    x = torch.rand(2_000_000)
    request = {"files": {"tensors": ("t", dump_safetensors({"T0": x}))},
               "data": {"definition": heavy_definition()}}
    before = {p: _cpu_seconds(p) for p in pids}
    answer: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: answer.update(
        r=http.post("/v1/execute", **request)))
    thread.start()
    deadline = time.monotonic() + 60
    busy: list[int] = []
    while not busy:  # a worker is busy with this request (whichever the pool chose)
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
        busy = [p for p in pids if _cpu_seconds(p) >= before[p] + 0.15]
    pid = busy[0]
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    assert_problem(answer["r"], 503, "worker", "restart")
    small = small_args()
    named = dict(zip(SMALL_FUSION.inputs, small[:2] + [torch.tensor(0.5, dtype=torch.float64)]))
    for _ in range(3):  # later requests wait for the new worker, then succeed
        response = http.post("/v1/execute", files={"tensors": ("t", dump_safetensors(named))},
                             data={"definition": json.dumps(fusion_to_json(SMALL_FUSION))})
        assert response.status_code == 200, response.text
    after = http.get("/readyz").json()
    assert pid not in [w["pid"] for w in after["workers"]]
    assert after["worker_restarts"] == restarts + 1
    samples = metric_samples(http.get("/metrics").text)
    assert samples[("fusecut_worker_restarts_total", ())] >= 1


# ---- operations ---------------------------------------------------------------------------------

def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Parse Prometheus exposition with prometheus-client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def count(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def test_metrics_count_what_happened(tmp_path):
    with Server(tmp_path / "plans.sqlite") as fresh:
        url = fresh.url
        plans = []
        for rows in (2, 3, 4):
            body = {"definition": SMALL, "inputs": small_metas(rows, 8)}
            plans.append(httpx.post(f"{url}/v1/plan", json=body).json())
            httpx.post(f"{url}/v1/plan", json=body)  # a hit
        httpx.post(f"{url}/v1/plan", json={"definition": SMALL})  # a 422
        named = dict(zip(SMALL_FUSION.inputs,
                         small_args()[:2] + [torch.tensor(0.5, dtype=torch.float64)]))
        executed = httpx.post(f"{url}/v1/execute", files={"tensors": ("t", dump_safetensors(
            named))}, data={"definition": json.dumps(fusion_to_json(SMALL_FUSION))})
        assert executed.status_code == 200
        text = httpx.get(f"{url}/metrics").text
    s = metric_samples(text)
    assert s[("fusecut_plans_total", (("cache", "miss"), ("segmenter", "cpsat")))] == 4
    assert s[("fusecut_plans_total", (("cache", "hit"), ("segmenter", "cpsat")))] == 3
    assert s[("fusecut_solver_seconds_count", (("segmenter", "cpsat"),))] == 4
    planned = sum(p["totals"]["io_bytes"] for p in plans)
    assert s[("fusecut_planned_io_bytes_total", (("segmenter", "cpsat"),))] >= planned
    assert s[("fusecut_lower_bound_io_bytes_total", ())] > 0
    assert s[("fusecut_greedy_baseline_io_bytes_total", ())] >= planned
    assert count(s, "fusecut_execute_io_bytes_total") > 0
    assert count(s, "fusecut_execute_seconds_count") == 1
    assert s[("fusecut_http_requests_total", (("route", "/v1/plan"), ("status", "4xx")))] == 1
    assert s[("fusecut_http_requests_total", (("route", "/v1/plan"), ("status", "2xx")))] == 6
    assert s[("fusecut_worker_up", ())] == 1
    labels = {k for (name, labels) in s if name.startswith("fusecut_") for k, _ in labels}
    assert labels <= {"segmenter", "cache", "kind", "backend", "le", "route", "status",
                      "reason", "device", "operation"}  # device: a worker per GPU


def test_metrics_add_up_over_several_uvicorn_workers(tmp_path):
    with Server(tmp_path / "plans.sqlite", workers=2) as multi:
        for rows in range(1, 13):  # a new connection each: spread over the processes
            response = httpx.post(f"{multi.url}/v1/plan", json={
                "definition": SMALL, "inputs": small_metas(rows, 4)})
            assert response.status_code == 200
        s = metric_samples(httpx.get(f"{multi.url}/metrics").text)
    assert count(s, "fusecut_plans_total") == 12
    assert count(s, "fusecut_http_requests_total", route="/v1/plan") == 12


def dashboard_cards(html: str) -> dict[str, tuple[str, str]]:
    """plan id -> (the card's title, its options line), as the page shows them."""
    import html as html_lib
    import re

    cards = re.findall(r"<h2>(.*?) <span class='id'>plan ([0-9a-f]{32})</span></h2>\n"
                       r"<div class='options'>(.*?)</div>", html)
    return {pid: (html_lib.unescape(title), html_lib.unescape(options))
            for title, pid, options in cards}


def test_dashboard_cards_name_the_fusion_and_show_the_options(server):
    # issue 12: cards showed only hashes. Their own service: the page lists the newest plans.
    with Server(server.db_path.parent / "named.sqlite") as own, \
            httpx.Client(base_url=own.url, timeout=60) as http:
        text = http.post("/v1/plan", json={
            "definition": SMALL.replace("def fusion(fd)", "def nvfuser_fusion_id7(fd)"),
            "inputs": small_metas(5, 9),
            "options": {"segmenter": "greedy", "time_limit_s": 3,
                        "device_overrides": {"bandwidth": 2e12}}}).json()
        wire = http.post("/v1/plan", json={
            "definition": fusion_to_json(SMALL_FUSION), "inputs": small_metas(5, 11),
            "options": {"segmenter": "mincut", "device": "A100",
                        "kinds": ["pointwise", "reduction", "library", "fallback"]}}).json()
        executed = http.post("/v1/execute", json={
            "definition": "def scaled_negation(fd):\n"
                          "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
                          "dtype=DataType.Float)\n"
                          "    fd.add_output(fd.ops.neg(T0))\n",
            "inputs": [{"name": "T0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]})
        assert executed.status_code == 200, executed.text
        cards = dashboard_cards(http.get("/dashboard").text)
    assert cards[text["plan_id"]] == (
        "nvfuser_fusion_id7 (9 ops)",  # with the two size ops of T3.shape()
        "options: segmenter=greedy · time_limit_s=3 · device=H100 · "
        "device_overrides={bandwidth=2e+12} · launch_weight=1 · compute_weight=1 · seed=0 · "
        "kinds=all · num_streams=4")
    title, options = cards[wire["plan_id"]]
    assert title == "cast, size, broadcast_in_dim, mul, ... (9 ops)"  # wire JSON has no name
    assert "segmenter=mincut" in options and "device=A100" in options
    assert "kinds=fallback/library/pointwise/reduction" in options
    assert cards[executed.json()["plan_id"]][0] == "scaled_negation (1 op)"


def test_health_readiness_and_dashboard(http):
    health = http.get("/healthz")
    assert health.json() == {"status": "ok"}
    timing = health.headers["server-timing"]  # the server's own share of the latency
    assert timing.startswith("app;dur=") and 0 <= float(timing[len("app;dur="):]) < 1000
    ready = http.get("/readyz").json()
    assert ready["worker"] == "up" and ready["device"] in ("cpu", torch.cuda.get_device_name()
                                                           if torch.cuda.is_available() else "cpu")
    plan = http.post("/v1/plan", json={"definition": SMALL, "inputs": small_metas(7, 7)}).json()
    page = http.get("/dashboard")
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert plan["plan_id"] in html and "<svg" in html and "greedy" in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html
    schema = http.get("/openapi.json").json()
    assert {"/v1/plan", "/v1/plans/{plan_id}", "/v1/execute"} <= set(schema["paths"])
