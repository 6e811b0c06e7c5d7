"""What the service tests send: a one-op definition, a KServe-v2 execute body, and an execution
of seconds on the CPU path.
"""

from __future__ import annotations

import json

import httpx
import torch

from fusecut.wire.tensors import dump_safetensors
from tests.service.test_service import heavy_definition

NEG = """
def f(fd):
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    T1 = fd.ops.neg(T0)
    fd.add_output(T1)
"""


def kserve_body(data: list, datatype: str = "INT64") -> dict:
    """An execute body (KServe-v2 JSON) negating ``data``, an int64 tensor."""
    definition = """
def fusion(fd):
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
    T1 = fd.ops.neg(T0)
    fd.add_output(T1)
"""
    return {"definition": definition,
            "inputs": [{"name": "T0", "shape": [len(data)], "datatype": datatype, "data": data}]}


def heavy_request(url: str, headers: dict[str, str] | None = None,
                  links: int = 120) -> httpx.Response:
    """An execution of seconds on the CPU path (a plan made quickly: greedy); ``links`` sets how
    many (1.3 s at 120 on an idle 2-core machine)."""
    return httpx.post(f"{url}/v1/execute", timeout=120, headers=headers,
                      files={"tensors": ("t", dump_safetensors({"T0": torch.rand(4_000_000)}))},
                      data={"definition": heavy_definition(links),
                            "options": json.dumps({"segmenter": "greedy"})})
