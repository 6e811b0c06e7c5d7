"""NVRTC in child processes (``runtime.nvrtc_child``): a compiler crash costs one compile.

NVRTC 13.0 and 13.5 crash on a kernel fusecut generated (``tests/data/nvrtc_crash.cu``). Here:
that kernel compiles or raises a ``CompileError`` while this process lives on and compiles the
next kernel; a child killed mid-compile is reported with its signal and replaced; NVRTC's own
refusal comes back with its log; children are reused.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from fusecut.runtime import nvrtc_child
from fusecut.runtime.compile import CompileError, _nvrtc

CRASH = Path(__file__).parent.parent / "data" / "nvrtc_crash.cu"
GOOD = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n'


def test_the_kernel_that_crashes_nvrtc_does_not_end_this_process():
    try:
        _nvrtc(CRASH.read_text(), "sm_90", "fusecut_segment0_normalization")
    except CompileError as e:
        assert "NVRTC crashed compiling fusecut_segment0_normalization (sm_90)" in str(e)
    assert _nvrtc(GOOD, "sm_90", "k")  # and the next compile works


def test_a_child_that_dies_is_named_with_its_signal_and_replaced(monkeypatch):
    compile_in = nvrtc_child._Child.compile

    def dies(child, request):
        os.kill(child.proc.pid, signal.SIGSEGV)
        child.proc.wait()
        return compile_in(child, request)

    monkeypatch.setattr(nvrtc_child._Child, "compile", dies)
    with pytest.raises(CompileError, match=r"NVRTC crashed compiling k \(sm_90\): signal SIGSEGV"):
        _nvrtc(GOOD, "sm_90", "k")
    monkeypatch.undo()
    assert _nvrtc(GOOD, "sm_90", "k")


def test_nvrtc_refusing_a_kernel_says_why():
    with pytest.raises(CompileError, match=r"(?s)NVRTC failed for bad.*is undefined"):
        _nvrtc('extern "C" __global__ void bad() { undefined_name(); }\n', "sm_90", "bad")


def test_children_are_reused():
    _nvrtc(GOOD, "sm_90", "k")
    children = {c.proc.pid for c in nvrtc_child._idle}
    _nvrtc(GOOD, "sm_90", "k")
    assert {c.proc.pid for c in nvrtc_child._idle} == children


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["segments", "program"])
def test_a_segment_nvrtc_cannot_compile_runs_through_torch(path, monkeypatch, caplog):
    import torch

    from fusecut.engine import as_metadata
    from fusecut.optimizer.planner import make_plan
    from fusecut.runtime import kernels
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.reference import run_reference
    from fusecut.runtime.run import run_plan
    from tests.helpers import fusion

    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.exp(T0)
T2 = fd.ops.sum(T1, dims=[1], keepdim=False)
fd.add_output(T2)
""")

    def crashed(source, arch="sm_90", name="k"):
        raise CompileError(f"NVRTC crashed compiling {name} ({arch}): signal SIGSEGV")

    monkeypatch.setattr(kernels, "compile_cubin", crashed)
    x = torch.randn(37, 1000 + (path == "program"), device="cuda")
    plan = make_plan(f, as_metadata([x]))
    got = (run_plan(plan, [x]) if path == "program" else
           execute_plan(plan, [x], kernels.cuda_runner, "cuda")).outputs
    torch.testing.assert_close(got[0], run_reference(f, [x])[0])
    assert "runs through torch: NVRTC crashed" in caplog.text
