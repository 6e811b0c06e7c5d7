"""Attention and Thunder's cudnn executor (issue 30).

Thunder lists its cudnn executor first wherever the cuDNN frontend imports. Measured on the H100
(cuDNN 9.19, frontend 1.16-1.22 the only ones it builds graphs with), its bf16 attention
gradients are wrong: a training step on it does not train. So ``fusecut.thunder.executors()``
leaves it out unless asked (``cudnn=True``), the ``thunder`` extra brings no frontend, and on the
GPU a test measures the gradients again: when they come right, it fails until the default
changes. Where torch has no cuDNN (this CPU machine), an installed frontend must not break
Thunder's import.
"""

from __future__ import annotations

import copy
import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

import fusecut.thunder
import fusecut.thunder.attention
from benchmarks.whole_models import Size, whole_model
from fusecut.thunder.executor import CUDNN_ATTENTION_WRONG, thunder
from fusecut.thunder.regions import fusecut_regions
from tests.thunder.test_thunder_executor import block
from tests.thunder.thunder_steps import lm_step

ROOT = Path(__file__).resolve().parents[2]
HAS_CUDNN_EXECUTOR = any(e.name == "cudnn" for e in thunder.get_default_executors())


class Named:
    def __init__(self, name):
        self.name = name


def test_executors_leave_cudnn_out_unless_asked(monkeypatch):
    listed = (Named("cudnn"), Named("sdpa"), Named("nvfuser"))
    monkeypatch.setattr(thunder, "get_default_executors", lambda: listed)
    monkeypatch.setattr(fusecut.thunder.attention, "cudnn_attention_available", lambda: False)
    assert [e.name for e in fusecut.thunder.executors(cross_entropy=False)] == ["sdpa", "fusecut"]
    assert [e.name for e in fusecut.thunder.executors(cudnn=True, cross_entropy=False)] == [
        "cudnn", "sdpa", "fusecut"]
    assert "bf16 attention gradients" in CUDNN_ATTENTION_WRONG


def test_the_thunder_extra_brings_no_cudnn_frontend():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    thunder_extra = {Requirement(r).name for r in project["optional-dependencies"]["thunder"]}
    assert "lightning-thunder" in thunder_extra
    assert "nvidia-cudnn-frontend" not in thunder_extra


@pytest.mark.skipif(torch.backends.cudnn.is_available(), reason="this torch has cuDNN")
def test_without_cudnn_in_torch_thunder_imports_beside_a_frontend():
    # the dev extra installs the frontend; Thunder's import calls cudnn.backend_version(), which
    # fails without cuDNN: the .pth hook must hide the frontend first, whichever module comes
    # first
    assert importlib.metadata.version("nvidia-cudnn-frontend"), "the dev extra installs it"
    for code in ("import thunder", "import fusecut.thunder.executor; import thunder"):
        done = subprocess.run(
            [sys.executable, "-c", f"{code}; print([e.name for e in "
                                   f"thunder.get_default_executors()])"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "cudnn" not in done.stdout and "sdpa" in done.stdout


def gradient_error(executors: list, size: Size, seq: int) -> float:
    """The largest gradient error of a bf16 nanoGPT step through ``executors``, relative to
    each gradient's own size, against Thunder's torch executor's fp32 step."""
    model, make_batch = whole_model("nanogpt", size)
    tokens, targets = make_batch(2, seq, "cuda")
    exact_model = copy.deepcopy(model).to("cuda")
    _, exact = lm_step(thunder.jit(exact_model, executors=[thunder.pytorch_executor]),
                       exact_model, tokens, targets)
    low = model.to("cuda", torch.bfloat16)
    _, grads = lm_step(thunder.jit(low, executors=executors), low, tokens, targets)
    return max((g.float() - e).abs().max().item() / e.abs().max().item()
               for g, e in zip(grads, exact))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDNN_EXECUTOR, reason="no cuDNN frontend: Thunder has no cudnn "
                                                   "executor here")
def test_cudnn_is_left_out_exactly_while_its_gradients_are_wrong():
    size = Size(layers=2, width=128, heads=2, kv_heads=2, vocab=200, max_seq=128)
    # fusecut's own cuDNN attention (fusecut.thunder.attention) left out: Thunder's cudnn
    # executor against its SDPA executor
    sdpa = gradient_error(fusecut.thunder.executors(attention=False), size, 128)
    cudnn = gradient_error(fusecut.thunder.executors(cudnn=True, attention=False), size, 128)
    assert sdpa < 0.05, f"SDPA's bf16 gradients are {sdpa:.3g} off"
    wrong = cudnn > 10 * max(sdpa, 0.01)
    assert wrong == ("cudnn" not in [e.name for e in fusecut.thunder.executors()]), (
        f"cuDNN's bf16 gradients are {cudnn:.3g} off (SDPA's {sdpa:.3g}): "
        f"{'leave it out' if wrong else 'they are right now: put cudnn back in the default'}")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDNN_EXECUTOR, reason="no cuDNN frontend")
def test_asked_for_cudnn_runs_the_attention():
    model = block(seed=5).to("cuda", torch.bfloat16)
    ours = thunder.jit(model, executors=fusecut.thunder.executors(cudnn=True, attention=False))
    x = torch.randn(2, 16, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ours(x).float().sum().backward()
    for trace in (thunder.last_traces(ours)[-1], thunder.last_backward_traces(ours)[-1]):
        runs = {(b.sym.name, getattr(b.sym.executor, "name", None)) for b in trace.bound_symbols}
        attention = {name for name, _ in runs if "sdpa" in name or "attention" in name}
        assert attention, f"no attention in the trace: {sorted(runs)}"
        assert all(ex == "cudnn" for name, ex in runs if name in attention), runs
        assert fusecut_regions(trace)
