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
