"""The device profile a plan made on a GPU is tuned for (issue 43): the GPU's own built-in
profile where the caller names no device, kept apart from the others (an H200's normalization
threads hold 4 vectors of a row, an H100's 2, as measured on each)."""

from __future__ import annotations

import pytest

import fusecut.runtime.device_profile as dp
from fusecut.codegen import generate_segment
from fusecut.engine import Engine
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.optimizer.profiles import profile_of_device
from tests.conftest import CORPUS


@pytest.mark.parametrize("name, profile", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA GeForce RTX 4090", None)])
def test_a_gpu_is_known_by_its_name(name, profile):
    assert profile_of_device(name) == profile


def test_a_plan_made_on_a_gpu_is_made_for_it_unless_the_caller_names_one(monkeypatch):
    monkeypatch.setattr(dp, "detected_device", lambda: "H200")
    assert dp.with_device({}) == {"device": "H200"}
    assert dp.with_device({"device": "H100"}) == {"device": "H100"}
    f = parse_text((CORPUS / "softmax_fwd.py").read_text()).fusion
    metas = [tensor_meta((1024, 4096), DType.bfloat16)]
    plan = Engine().fusion(f).plan(metas)
    assert plan.profile.name == "H200"
    monkeypatch.setattr(dp, "detected_device", lambda: None)  # no GPU: the default profile
    assert dp.with_device({}) == {}
    assert Engine().fusion(f).plan(metas).profile.name == "H100"


def test_normalization_threads_hold_the_profiles_vectors():
    f = parse_text((CORPUS / "layernorm_fwd.py").read_text()).fusion
    metas = [tensor_meta((1024, 4096), DType.bfloat16), tensor_meta((4096,), DType.bfloat16),
             tensor_meta((4096,), DType.bfloat16)]
    threads = {}
    for device in ("H100", "H200"):
        plan = make_plan(f, metas, PlanOptions(device=device))
        [segment] = plan.segments
        threads[device] = generate_segment(plan, segment).kernels[0].block[0]
    # 4096 bf16 = 512 vectors of 8 a row: 2 a thread on the H100, 4 on the H200
    assert threads == {"H100": 256, "H200": 128}


def test_a_gpu_whose_name_cannot_be_read_plans_for_the_default_profile(monkeypatch):
    import torch

    def no_name(index):
        raise RuntimeError("no CUDA driver")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 7)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_name)
    assert dp.detected_device() is None and dp.with_device({}) == {}

