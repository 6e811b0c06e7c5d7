"""A region never breaks a user's step: when fusecut's planning, code generation, compilation or
first launch fails, the region runs on Thunder's torch executor instead, its report says where
and why, and one warning is logged for it.

Each stage's failure is injected where fusecut really does that work (the planner, the code
generator, NVRTC, a compiled program's launch). The plan stage runs on the CPU too; the others
only happen on a GPU, so their tests run on the device.
"""

from __future__ import annotations

import logging

import pytest
import torch

import fusecut.engine
import fusecut.runtime.kernels
import fusecut.thunder
import fusecut.thunder.executor
import fusecut.thunder.regions
from fusecut.optimizer.errors import PlanError
from fusecut.runtime.compile import CompileError
from fusecut.runtime.program import Program
from fusecut.thunder.executor import FusecutExecutor, thunder
from fusecut.thunder.reports import region_reports
from tests.thunder.test_thunder_executor import block
from tests.thunder.thunder_steps import assert_same_step

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def no_shared_definitions(monkeypatch):
    """Regions share definitions, and with them plans and programs, across executors (and the
    process's FusionCache holds every definition's plans): a plan an earlier test made would not
    be made again, and the failure injected into making it would never happen."""
    from fusecut.fusion_cache import FusionCache

    monkeypatch.setattr(fusecut.thunder.regions, "_definitions", {})
    FusionCache.reset()
    yield
    FusionCache.reset()


def broken(error: Exception):
    def fail(*args, **kwargs):
        raise error
    return fail


EXECUTORS = iter(range(1_000_000))


def jitted_block(device: str):
    """A fresh executor (its regions' state is its own) on a small nanoGPT block."""
    model = block(seed=3).to(device)
    ours = thunder.jit(model, executors=[FusecutExecutor(f"fusecut_fallback{next(EXECUTORS)}")])
    return model, ours


def fallback_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "fusecut.thunder" and r.levelno == logging.WARNING]


def assert_every_region_fell_back(ours, stage: str, message: str, caplog) -> None:
    reports = region_reports(ours)
    assert reports, "no fusecut region was made"
    for report in reports:
        assert report.fallback_stage == stage, report.summary()
        assert report.fallback.startswith(f"{stage} failed: ") and message in report.fallback
        assert "on torch" in report.summary()
    warnings = fallback_warnings(caplog)
    # one warning per region, naming it and the stage, however many times it ran
    assert sorted(w.split()[2] for w in warnings) == sorted(r.name for r in reports), warnings
    assert all(f"{stage} failed" in w for w in warnings)


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_that_fails_runs_the_region_on_torch(device, monkeypatch, caplog):
    monkeypatch.setattr(fusecut.engine, "make_plan", broken(PlanError("injected plan failure")))
    model, ours = jitted_block(device)
    x = torch.randn(2, 8, 32, device=device)
    with caplog.at_level(logging.WARNING, logger="fusecut.thunder"):
        assert_same_step(ours, model, x)
        assert_same_step(ours, model, x)  # the second step warns no more
    assert_every_region_fell_back(ours, "plan", "injected plan failure", caplog)


def test_any_error_in_planning_falls_back_not_only_fusecut_errors(monkeypatch, caplog):
    # a bug in the planner (a KeyError, say) is still not the user's problem
    monkeypatch.setattr(fusecut.engine, "make_plan", broken(KeyError("T7")))
    model, ours = jitted_block("cpu")
    with caplog.at_level(logging.WARNING, logger="fusecut.thunder"):
        assert_same_step(ours, model, torch.randn(2, 8, 32))
    assert_every_region_fell_back(ours, "plan", "KeyError", caplog)


def test_out_of_memory_reaches_the_user(monkeypatch):
    # torch would run out of memory as well: falling back would only hide it
    monkeypatch.setattr(fusecut.engine, "make_plan",
                        broken(torch.OutOfMemoryError("injected: out of memory")))
    model, ours = jitted_block("cpu")
    with pytest.raises(torch.OutOfMemoryError):
        ours(torch.randn(2, 8, 32))


@pytest.mark.gpu
def test_a_kernel_that_cannot_be_generated_runs_the_region_on_torch(monkeypatch, caplog):
    fusecut.runtime.kernels._code.clear()  # kernels made by earlier tests would not be remade
    error = NotImplementedError("injected codegen failure")
    monkeypatch.setattr(fusecut.runtime.kernels, "generate_segment", broken(error))
    model, ours = jitted_block("cuda")
    with caplog.at_level(logging.WARNING, logger="fusecut.thunder"):
        assert_same_step(ours, model, torch.randn(2, 8, 32, device="cuda"))
    assert_every_region_fell_back(ours, "codegen", "injected codegen failure", caplog)


@pytest.mark.gpu
def test_a_kernel_nvrtc_cannot_compile_runs_its_segment_on_torch(monkeypatch, caplog):
    # NVRTC refusing or crashing on a kernel (runtime.nvrtc_child) costs that segment its
    # kernel, not the region: the segment runs through the torch reference inside the region
    fusecut.runtime.kernels._code.clear()  # kernels made by earlier tests would not be remade
    error = CompileError("NVRTC failed: injected compile failure")
    monkeypatch.setattr(fusecut.runtime.kernels, "compile_cubin", broken(error))
    model, ours = jitted_block("cuda")
    with caplog.at_level(logging.WARNING):
        assert_same_step(ours, model, torch.randn(2, 8, 32, device="cuda"))
    reports = region_reports(ours)
    assert reports and all(r.fallback is None for r in reports), [r.summary() for r in reports]
    assert "runs through torch: NVRTC failed: injected compile failure" in caplog.text


@pytest.mark.gpu
def test_a_first_launch_that_fails_runs_the_region_on_torch(monkeypatch, caplog):
    monkeypatch.setattr(Program, "run", broken(RuntimeError("injected launch failure")))
    model, ours = jitted_block("cuda")
    with caplog.at_level(logging.WARNING, logger="fusecut.thunder"):
        assert_same_step(ours, model, torch.randn(2, 8, 32, device="cuda"))
    assert_every_region_fell_back(ours, "launch", "injected launch failure", caplog)


def test_a_region_that_plans_runs_on_fusecut_and_reports_no_fallback():
    model, ours = jitted_block("cpu")
    assert_same_step(ours, model, torch.randn(2, 8, 32))
    reports = region_reports(ours)
    assert reports and all(r.fallback is None and r.fallback_stage is None for r in reports)
    assert all(r.planned_bytes is not None for r in reports)


def test_executors_put_fusecut_in_nvfusers_place(monkeypatch):
    class Named:
        def __init__(self, name):
            self.name = name

    ours = fusecut.thunder.fusecut_ex
    cases = {  # Thunder's cudnn executor is left out: see tests/thunder/test_cudnn_attention.py
        ("cudnn", "sdpa", "nvfuser"): ["fusecut_cross_entropy", "sdpa", "fusecut"],
        ("sdpa", "torchcompile_xentropy"): ["fusecut_cross_entropy", "sdpa",
                                            "torchcompile_xentropy", "fusecut"],
        ("sdpa", "torch"): ["fusecut_cross_entropy", "sdpa", "fusecut", "torch"],
        (): ["fusecut_cross_entropy", "fusecut"],
    }
    for defaults, expected in cases.items():
        listed = [Named(n) for n in defaults]
        monkeypatch.setattr(thunder, "get_default_executors", lambda listed=listed: tuple(listed))
        assert [e.name for e in fusecut.thunder.executors()] == expected, defaults
        assert fusecut.thunder.executors().count(ours) == 1
    # fusecut already among the defaults is not listed twice
    monkeypatch.setattr(thunder, "get_default_executors", lambda: (Named("sdpa"), ours))
    assert [e.name for e in fusecut.thunder.executors(cross_entropy=False)] == ["sdpa", "fusecut"]


def test_executors_run_a_step_through_fusecut():
    # Thunder's real defaults here (no nvFuser on this machine): fusecut must be in the list,
    # and the step must make fusecut regions
    model = block(seed=4)
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    assert_same_step(ours, model, torch.randn(2, 8, 32))
    assert region_reports(ours)
