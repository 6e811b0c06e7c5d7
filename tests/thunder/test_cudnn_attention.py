"""Attention on cuDNN by default: ``fusecut[thunder]`` brings a cuDNN frontend that Thunder's cudnn
executor runs with, ``fusecut.thunder.executors()`` keeps Thunder's attention executors first,
and where torch has no cuDNN (this CPU machine) the frontend stays out of Thunder's way.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import fusecut.thunder
from fusecut.thunder.executor import fusecut_regions, thunder
from tests.thunder.test_thunder_executor import block


def thunder_extra() -> dict[str, Requirement]:
    requirements = [Requirement(r) for r in importlib.metadata.requires("fusecut") or []]
    return {r.name: r for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": "thunder"})}


def test_the_thunder_extra_pins_a_cudnn_frontend_thunder_runs_with():
    extra = thunder_extra()
    frontend = extra["nvidia-cudnn-frontend"].specifier
    # 1.16 is the release measured with Thunder 0.2.6; 1.27 moved the graph method Thunder 0.2.6
    # calls (pygraph.scaled_dot_product_flash_attention) behind lowering
    assert Version("1.16.0") in frontend and Version("1.26.0") in frontend
    assert Version("1.27.0") not in frontend and Version("1.32.0") not in frontend
    assert Version("0.2.6") in extra["lightning-thunder"].specifier


def test_the_installed_frontend_is_in_the_pinned_range():
    installed = Version(importlib.metadata.version("nvidia-cudnn-frontend"))
    assert installed in thunder_extra()["nvidia-cudnn-frontend"].specifier


@pytest.mark.skipif(torch.backends.cudnn.is_available(), reason="this torch has cuDNN")
def test_without_cudnn_in_torch_thunder_imports_and_lists_no_cudnn_executor():
    # Thunder's own import calls cudnn.backend_version(), which fails without cuDNN: the .pth
    # hook must hide the frontend first, whether thunder or fusecut is imported first
    for code in ("import thunder", "import fusecut.thunder.executor; import thunder"):
        done = subprocess.run(
            [sys.executable, "-c", f"{code}; print([e.name for e in "
                                   f"thunder.get_default_executors()])"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "cudnn" not in done.stdout and "sdpa" in done.stdout


@pytest.mark.gpu
def test_on_cuda_thunder_lists_cudnn_first_and_executors_keep_it():
    names = [e.name for e in thunder.get_default_executors()]
    assert "cudnn" in names, names
    chosen = [e.name for e in fusecut.thunder.executors()]
    assert chosen.index("cudnn") < chosen.index("fusecut"), chosen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_of_a_training_step_runs_on_cudnn(dtype):
    model = block(seed=5).to("cuda", dtype)
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    x = torch.randn(2, 16, 32, device="cuda", dtype=dtype, requires_grad=True)
    y = ours(x)
    y.float().sum().backward()
    forward = thunder.last_traces(ours)[-1]
    backward = thunder.last_backward_traces(ours)[-1]
    for trace in (forward, backward):
        runs = {(b.sym.name, getattr(b.sym.executor, "name", None)) for b in trace.bound_symbols}
        attention = {name for name, executor in runs if "sdpa" in name or "attention" in name}
        assert attention, f"no attention in the trace: {sorted(runs)}"
        assert all(executor == "cudnn" for name, executor in runs if name in attention), runs
        assert fusecut_regions(trace)
