"""Regions planned and their kernels compiled while Thunder is still tracing
(``fusecut.thunder.compile_ahead``). NVRTC needs no GPU: on the CPU the fusion pass is told the
regions' architecture, and the step itself runs fusecut's CPU path."""

from __future__ import annotations

import pytest
import torch

import fusecut.runtime.kernels
import fusecut.thunder.compile_ahead
import fusecut.thunder.executor
import fusecut.thunder.regions
from fusecut.codegen import generate_segment
from fusecut.optimizer.ir.inputs import TensorMeta, contiguous_strides
from fusecut.runtime import ahead
from fusecut.runtime import compile as rc
from fusecut.runtime.lru import BoundedCache
from fusecut.thunder.compile_ahead import metadata_of
from fusecut.thunder.executor import FusecutExecutor, thunder
from fusecut.thunder.regions import FusecutRegion, fusecut_regions
from tests.helpers import record_nvrtc_threads
from tests.thunder.test_thunder_executor import block, final_traces
from tests.thunder.thunder_steps import assert_same_step

EXECUTORS = iter(range(1_000_000))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No plan, program or cubin from an earlier test: each is made again here."""
    from fusecut.fusion_cache import FusionCache

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "_memory", BoundedCache(rc.MAX_CUBINS))
    monkeypatch.setattr(fusecut.thunder.regions, "_definitions", {})
    fusecut.runtime.kernels._code.clear()
    FusionCache.reset()
    yield
    ahead.wait()
    FusionCache.reset()


@pytest.fixture
def nvrtc_threads(monkeypatch):
    return record_nvrtc_threads(monkeypatch)


def jitted_block(device: str):
    model = block(seed=5).to(device)
    return model, thunder.jit(model, executors=[FusecutExecutor(f"fusecut_ahead{next(EXECUTORS)}")])


def regions(jitted) -> list[tuple]:
    return [(bsym, fn) for trace in final_traces(jitted) for bsym, fn in fusecut_regions(trace)
            if isinstance(fn, FusecutRegion) and fn.first_args is not None]


def row_major(metas) -> bool:
    return all(isinstance(m, TensorMeta) and m.strides == contiguous_strides(m.shape)
               for m in metas)


def test_proxies_give_the_metadata_of_row_major_arguments(fresh):
    model, ours = jitted_block("cpu")
    assert_same_step(ours, model, torch.randn(2, 8, 32))
    found = regions(ours)
    plain = [(bsym, fn) for bsym, fn in found
             if row_major(fn.first_args) and fn.first_definition is fn.definition]
    assert len(plain) >= 2
    for bsym, fn in plain:
        assert metadata_of(bsym.flat_args) == fn.first_args, bsym.sym.name
    assert metadata_of([1.0, *plain[0][0].flat_args]) is None  # a number: known at run time


def test_the_fusion_pass_compiles_each_region_ahead_for_its_first_call(fresh, nvrtc_threads,
                                                                       monkeypatch):
    monkeypatch.setattr(fusecut.thunder.compile_ahead, "cuda_arch", lambda proxies: "sm_90")
    model, ours = jitted_block("cpu")
    assert_same_step(ours, model, torch.randn(2, 8, 32))  # fusecut's CPU path: no NVRTC
    ahead.wait()
    assert nvrtc_threads and all(t.startswith("fusecut-ahead-") for t in nvrtc_threads)
    compiled = len(nvrtc_threads)
    kernels = 0
    for _, fn in regions(ours):
        if not row_major(fn.first_args):
            continue
        plan = fn.definition.handle.plan(fn.first_args)
        for segment in plan.segments:  # what the first launch on sm_90 would compile
            if segment.kind not in ahead.NOT_GENERATED:
                code = generate_segment(plan, segment, None)
                rc.compile_cubin(code.source, "sm_90", code.kernels[0].name)
                kernels += 1
    assert kernels >= 2
    assert len(nvrtc_threads) == compiled  # every one was compiled ahead


def test_off_no_region_compiles_ahead(fresh, nvrtc_threads, monkeypatch):
    monkeypatch.setenv(ahead.ENV, "0")
    monkeypatch.setattr(fusecut.thunder.compile_ahead, "cuda_arch", lambda proxies: "sm_90")
    model, ours = jitted_block("cpu")
    assert_same_step(ours, model, torch.randn(2, 8, 32))
    ahead.wait()
    assert nvrtc_threads == []


def test_regions_on_the_cpu_compile_nothing_ahead(fresh, nvrtc_threads):
    model, ours = jitted_block("cpu")
    assert_same_step(ours, model, torch.randn(2, 8, 32))
    ahead.wait()
    assert nvrtc_threads == []


@pytest.mark.gpu
def test_a_first_step_on_the_gpu_runs_kernels_compiled_ahead(fresh, nvrtc_threads):
    model, ours = jitted_block("cuda")
    assert_same_step(ours, model, torch.randn(2, 8, 32, device="cuda"))
    ahead.wait()
    assert any(t.startswith("fusecut-ahead-") for t in nvrtc_threads), nvrtc_threads
    assert all(r.fallback is None for r in fusecut.thunder.region_reports(ours))
