"""The published OpenAPI document is complete and valid, says what is required (and the service
holds to it), and /docs shows it without loading anything from elsewhere.

From the hostile-input reviews: issue 12 (defect 5) and issue 19 (defect 13).
"""

from __future__ import annotations

import json
import re

import torch

from fusecut.wire.tensors import dump_safetensors, load_safetensors
from tests.service.test_service import assert_problem
from tests.service.workloads import NEG


def test_openapi_is_complete_and_valid(http):
    from openapi_spec_validator import validate

    doc = http.get("/openapi.json").json()
    validate(doc)  # every $ref resolves, the document is OpenAPI 3.1
    schemas = doc["components"]["schemas"]
    for name in ("FusionJSON", "PlanOptionsModel", "JSONTensor", "InputMetaJSON", "TensorDecl",
                 "OpDecl", "ScalarDecl", "StreamAxis", "DType", "ProblemDetails"):
        assert name in schemas, name
    for route, statuses in (("/v1/plan", (413, 415, 422, 500, 503)),
                            ("/v1/execute", (401, 404, 413, 415, 422, 500, 503, 504))):
        responses = doc["paths"][route]["post"]["responses"]
        for status in statuses:
            assert "application/problem+json" in responses[str(status)]["content"], (route,
                                                                                   status)
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    # user-facing text names features, not the project's internal source documents
    assert not re.search(r"seeds? ?\d{3}", json.dumps(doc))
    assert "stream lowering" in schemas["PlanOptionsModel"]["properties"]["num_streams"][
        "description"]


def test_docs_are_served_without_the_network(http):
    page = http.get("/docs")
    assert page.status_code == 200
    assets = [a for a in re.findall(r'(?:src|href)="([^"]+)"', page.text)]
    assert assets and not [a for a in assets if "//" in a], assets  # nothing off this host
    for asset in assets:
        response = http.get(asset)
        assert response.status_code == 200 and len(response.content) > 500, asset
    assert http.get("/redoc").status_code == 404  # it would load from a CDN


def test_the_schema_says_what_is_required(http):
    doc = http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert {"minLength": 1, "type": "string"} in \
        schemas["PlanRequest"]["properties"]["definition"]["oneOf"]  # text or wire JSON
    assert_problem(http.post("/v1/plan", json={"definition": ""}), 422, "definition")
    assert schemas["ExecuteRequest"]["oneOf"] == [{"required": ["definition"]},
                                                  {"required": ["plan_id"]}]
    execute = doc["paths"]["/v1/execute"]["post"]["requestBody"]["content"]
    assert "application/octet-stream" not in execute  # it needs a plan id: the next route
    assert execute["multipart/form-data"]["schema"]["required"] == ["tensors"]
    by_id = doc["paths"]["/v1/plans/{plan_id}/execute"]["post"]
    assert [p["name"] for p in by_id["parameters"] if p["required"]] == ["plan_id"]
    assert list(by_id["requestBody"]["content"]) == ["application/octet-stream"]
    x = torch.randn(4)
    plan = http.post("/v1/plan", json={"definition": NEG, "inputs": [
        {"shape": [4], "dtype": "float32"}]}).json()
    for route, headers in ((f"/v1/plans/{plan['plan_id']}/execute", {}),
                           ("/v1/execute", {"x-fusecut-plan-id": plan["plan_id"]})):
        response = http.post(route, content=dump_safetensors({"T0": x}), headers={
            "content-type": "application/octet-stream", **headers})
        assert response.status_code == 200, response.text
        torch.testing.assert_close(load_safetensors(response.content)["T1"], -x)
