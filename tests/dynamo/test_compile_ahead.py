"""Regions planned and their kernels compiled as soon as AOTAutograd hands a graph over
(``fusecut.dynamo.compile_ahead``). NVRTC needs no GPU: on the CPU the backend is told the
regions' architecture, and the step itself runs fusecut's CPU path."""

from __future__ import annotations

import pytest
import torch

import fusecut.dynamo
import fusecut.dynamo.compile_ahead
import fusecut.runtime.kernels
from fusecut.codegen import generate_segment
from fusecut.runtime import ahead
from fusecut.runtime import compile as rc
from fusecut.runtime.lru import BoundedCache
from tests.dynamo.regions_made import last_serial, regions_since
from tests.dynamo.test_backend import Block, _eager_step
from tests.helpers import record_nvrtc_threads


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No plan, program or cubin from an earlier test: each is made again here."""
    from fusecut.fusion_cache import FusionCache

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "_memory", BoundedCache(rc.MAX_CUBINS))
    fusecut.runtime.kernels._code.clear()
    FusionCache.reset()
    yield
    ahead.wait()
    FusionCache.reset()


def _step(monkeypatch, arch):
    monkeypatch.setattr(fusecut.dynamo.compile_ahead, "cuda_arch", lambda args: arch)
    x, target = torch.randn(8, 32), torch.arange(8) % 10
    want_loss, want = _eager_step(x, target)
    before = last_serial()
    torch.manual_seed(0)
    model = Block()
    torch._dynamo.reset()
    loss = torch.compile(model, backend="fusecut")(x, target)
    loss.backward()
    torch.testing.assert_close(loss, want_loss)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)
    ahead.wait()
    return regions_since(before)


def test_each_region_is_compiled_ahead_for_its_first_call(fresh, monkeypatch):
    threads = record_nvrtc_threads(monkeypatch)
    regions = _step(monkeypatch, "sm_90")
    assert {r.direction for r in regions} == {"forward", "backward"}
    assert threads and all(t.startswith("fusecut-ahead-") for t in threads), threads
    compiled, kernels = len(threads), 0
    for region in regions:  # what each region's first launch on sm_90 compiles
        plan = region.definition.handle.plan(region.first_args)
        for segment in plan.segments:
            if segment.kind not in ahead.NOT_GENERATED:
                code = generate_segment(plan, segment, None)
                rc.compile_cubin(code.source, "sm_90", code.kernels[0].name)
                kernels += 1
    assert kernels >= len(regions)
    assert len(threads) == compiled  # every one was in the cache already


def test_off_or_on_the_cpu_no_region_compiles_ahead(fresh, monkeypatch):
    threads = record_nvrtc_threads(monkeypatch)
    _step(monkeypatch, None)  # regions on the CPU
    monkeypatch.setenv(ahead.ENV, "0")
    _step(monkeypatch, "sm_90")
    assert threads == []
