"""Small helpers shared by planner and runtime tests."""

from __future__ import annotations

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.inputs import scale_metas, tensor_meta
from fusecut.optimizer.profiles import get_profile
from fusecut.optimizer.segmenters.graph import SegGraph


def fusion(body: str):
    """A fusion from definition-body lines (nvFuser text)."""
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return parse_text("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n" + lines).fusion


def graph(body: str, *shapes, dtype=None, profile=None):
    """A segmentation graph of a definition bound to contiguous inputs of these shapes."""

    f = fusion(body)
    metas = [tensor_meta(s, dtype or f.tensors[n].dtype) for n, s in zip(f.tensor_inputs(),
                                                                         shapes)]
    return SegGraph(bind(f, metas), profile or get_profile())


def small_metas(parsed, max_numel: int):
    """Inputs of a repro's structure with at most ``max_numel`` elements each, or the repro's own
    sizes where its definition fixes them (the scaled sizes then raise an InputError)."""
    metas = scale_metas(parsed.inputs, max_numel)
    try:
        bind(parsed.fusion, metas)
    except InputError:
        return parsed.inputs
    return metas


def ops_named(g: SegGraph, *outputs: str) -> set[int]:
    return {i for i in g.ops if set(g.fusion.ops[i].outputs) & set(outputs)}


def require_installed(found, what: str, package: str):
    """``found`` (a binary's path), or: in CI a failure (.ci/run installs Debian's ``package``),
    elsewhere a skip saying why."""
    import os

    import pytest

    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not installed; .ci/run installs Debian's {package}")
        pytest.skip(f"{what} is not installed (apt-get install {package}); CI runs this")
    return found


def record_nvrtc_threads(monkeypatch) -> list[str]:
    """The name of the thread of each NVRTC compile from now on (NVRTC still compiles)."""
    import threading

    from fusecut.runtime import compile as rc

    threads: list[str] = []
    real = rc._nvrtc

    def recorded(source, arch, name):
        threads.append(threading.current_thread().name)
        return real(source, arch, name)

    monkeypatch.setattr(rc, "_nvrtc", recorded)
    return threads


def compile_failures(regions: dict[str, tuple]) -> list[str]:
    """Every generated segment of every region, compiled for sm_90 as the GPU would compile it
    (vectorised, and the scalar variant taken for unaligned arguments)."""
    failures = []
    from fusecut.codegen import generate_segment
    from fusecut.optimizer.planner import make_plan
    from fusecut.runtime.compile import compile_cubin
    from fusecut.runtime.kernels import NOT_GENERATED

    for name, definition, metas in regions.values():
        plan = make_plan(definition.fusion, metas)
        for segment in plan.segments:
            if segment.kind in NOT_GENERATED:
                continue
            for vector in (None, 1):
                try:
                    kernels = generate_segment(plan, segment, vector)
                    if kernels.kernels:
                        compile_cubin(kernels.source, "sm_90", kernels.kernels[0].name)
                except Exception as e:  # collect them all: one failure hides no other
                    first = (str(e).strip().splitlines() or [""])[0]
                    log = [line for line in str(e).splitlines() if "error" in line][:2]
                    failures.append(f"{name} segment {segment.index} ({segment.kind.value}, "
                                    f"vector={vector}): {type(e).__name__}: {first} {log}")
    return failures


def extent_arg(kernel, name: str) -> int:
    """The value kernel parameter ``name`` (an extent the code takes at launch) has in this
    plan."""
    [value] = [p.value for p in kernel.params if p.kind == "extent" and p.name == name]
    return value
