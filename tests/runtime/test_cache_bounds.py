"""The runtime's process-wide caches are bounded: a long-running service never grows them."""

from __future__ import annotations

import pytest

from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime import compile as rc
from fusecut.runtime import executor, kernels, program
from fusecut.runtime.lru import BoundedCache
from tests.helpers import fusion


def test_a_bounded_cache_drops_the_least_recently_used():
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert len(cache) == 2 and "b" not in cache
    assert cache.get("a") == 1 and cache.get("c") == 3 and cache.get("b") is None
    with pytest.raises(ValueError, match="maxsize"):
        BoundedCache(0)


def test_every_process_wide_cache_of_the_runtime_is_bounded():
    for cache in (rc._memory, executor._bounds, kernels._code, program._programs):
        assert isinstance(cache, BoundedCache) and cache.maxsize <= 1024


def test_segment_bounds_stay_within_their_bound(monkeypatch):
    monkeypatch.setattr(executor, "_bounds", BoundedCache(2))
    f = fusion("T0 = fd.define_tensor(shape=[-1, -1])\nT1 = fd.ops.sum(T0, dims=[1])\n"
               "T2 = fd.ops.exp(T1)\nfd.add_output(T2)")
    plans = [make_plan(f, [tensor_meta((n, 8), DType.float32)], PlanOptions(segmenter="greedy"))
             for n in (2, 3, 4)]
    for plan in plans:
        bound = executor.segment_bound(plan, plan.segments[0])
        assert bound.shapes[bound.fusion.inputs[0]][0] == plan.bound.shapes["T0"][0]
    assert len(executor._bounds) == 2
    assert (plans[0].plan_id, 0) not in executor._bounds


def test_compiled_code_in_memory_stays_within_its_bound(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "_memory", BoundedCache(1))
    sources = [f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}; }}\n' for i in (1, 2)]
    first = rc.compile_cubin(sources[0], "sm_90", "k1")
    rc.compile_cubin(sources[1], "sm_90", "k2")
    assert len(rc._memory) == 1
    disk_hits = rc.STATS.disk_hits
    assert rc.compile_cubin(sources[0], "sm_90", "k1") == first  # dropped from memory: disk
    assert rc.STATS.disk_hits == disk_hits + 1
