"""Run generated kernels on torch tensors: load the cubin, allocate outputs, launch in order.

Kernels launch on torch's current stream through the CUDA driver API (cuda-python), in the
context torch already made current. Segment outputs are allocated compact and contiguous, as the
plan accounts them; scratch workspaces live only for the launch. A segment whose tensors are not
aligned for its vector loads is regenerated without vectors (cached separately).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import torch

from codegen import SegmentKernels, generate_segment
from optimizer.analysis.shapes import bind
from optimizer.plan.plan import Plan, Segment
from optimizer.schedulers.kinds import Kind
from runtime.compile import compile_cubin
from runtime.reference import run_reference
from runtime.tensors import TORCH_DTYPE


class LaunchError(RuntimeError):
    """A CUDA driver call failed while running a segment."""


def _check(result):
    err = result[0]
    if int(err) != 0:
        from cuda.bindings import driver

        _, name = driver.cuGetErrorName(err)
        raise LaunchError(f"CUDA driver error {int(err)} ({name.decode() if name else '?'})")
    return result[1] if len(result) == 2 else result[1:]


@dataclass
class Loaded:
    kernels: SegmentKernels
    functions: list[Any]


_lock = threading.Lock()
_modules: dict[str, Any] = {}  # cubin hash -> CUmodule (per process, current device)
_segments: dict[tuple, Loaded] = {}


def _module(cubin: bytes):
    from cuda.bindings import driver

    key = hashlib.sha256(cubin).hexdigest()
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _check(driver.cuModuleLoadData(cubin))
            _modules[key] = mod
        return mod


def arch_of_current_device() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def load_segment(plan: Plan, segment: Segment, vector: int | None = None) -> Loaded:
    from cuda.bindings import driver

    key = (plan.plan_id, segment.index, vector, torch.cuda.current_device())
    hit = _segments.get(key)
    if hit is not None:
        return hit
    sk = generate_segment(plan, segment, vector)
    functions = []
    if sk.kernels:
        cubin = compile_cubin(sk.source, arch_of_current_device(), sk.kernels[0].name)
        mod = _module(cubin)
        for k in sk.kernels:
            fn = _check(driver.cuModuleGetFunction(mod, k.name.encode()))
            if k.smem > 48 * 1024:
                _check(driver.cuFuncSetAttribute(
                    fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    k.smem))
            functions.append(fn)
    loaded = Loaded(sk, functions)
    _segments[key] = loaded
    return loaded


_bounds: dict[tuple, Any] = {}


def _sub_bound(plan: Plan, segment: Segment):
    """A library/fallback segment's sizes, bound once (they are fixed by the plan)."""
    if segment.sub.fusion.scalar_inputs():
        return None  # scalar values come with each call
    key = (plan.plan_id, segment.index)
    if key not in _bounds:
        _bounds[key] = bind(segment.sub.fusion, segment.sub.inputs)
    return _bounds[key]


@dataclass
class Prepared:
    """A segment ready to launch: its kernels and where each kernel argument comes from."""

    loaded: Loaded
    inputs: list[tuple[str, bool]]  # per sub-fusion input: original name, is a boundary tensor
    outputs: list[tuple[str, tuple[int, ...], torch.dtype]]  # tensors to allocate
    returned: list[str]  # original names, in the sub-fusion's output order
    launches: list[tuple[Any, tuple, tuple, int, list[tuple[str, str, Any]]]]


_prepared: dict[tuple, Prepared] = {}


def prepare(plan: Plan, segment: Segment, vector: int | None = None) -> Prepared:
    key = (plan.plan_id, segment.index, vector, torch.cuda.current_device())
    hit = _prepared.get(key)
    if hit is not None:
        return hit
    loaded = load_segment(plan, segment, vector)
    sub, bound = segment.sub, plan.bound
    inputs = [(sub.input_map[n], sub.input_map[n] not in bound.inputs
               and sub.input_map[n] in bound.fusion.tensors) for n in sub.fusion.inputs]
    outputs = [(t, tuple(bound.compact_shape(t)), TORCH_DTYPE[bound.fusion.tensors[t].dtype])
               for t in segment.schedule.outputs]
    ctypes_of = {"double": ctypes.c_double, "bool": ctypes.c_bool}
    launches = []
    for kernel, fn in zip(loaded.kernels.kernels, loaded.functions):
        spec = [(p.kind, p.name, ctypes.c_void_p if p.kind != "scalar"
                 else ctypes_of.get(p.ctype, ctypes.c_longlong)) for p in kernel.params]
        launches.append((fn, kernel.grid, kernel.block, kernel.smem, spec))
    prepared = Prepared(loaded, inputs, outputs,
                        [sub.output_map[n] for n in sub.fusion.outputs], launches)
    _prepared[key] = prepared
    return prepared


def cuda_runner(plan: Plan, segment: Segment, args: list[Any],
                scalars: dict[str, Any]) -> list[torch.Tensor]:
    """Run one segment: library and fallback segments through torch, the rest as kernels."""
    if segment.kind in (Kind.LIBRARY, Kind.FALLBACK):
        return run_reference(segment.sub.fusion, args, _sub_bound(plan, segment))
    prep = prepare(plan, segment)
    values: dict[str, Any] = {}
    device = None
    for (name, boundary), value in zip(prep.inputs, args):
        if isinstance(value, torch.Tensor):
            device = value.device
            if boundary and not value.is_contiguous():
                value = value.contiguous()  # boundary tensors: compact and dense
        values[name] = value
    if not all(values[t].data_ptr() % a == 0
               for t, a in prep.loaded.kernels.vector_aligned.items() if t in values):
        prep = prepare(plan, segment, vector=1)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    outputs = {t: torch.empty(shape, dtype=dtype, device=device)
               for t, shape, dtype in prep.outputs}
    if prep.launches:
        _launch(prep, values, scalars, outputs, device)
    return [outputs[t] for t in prep.returned]


def _launch(prep: Prepared, values: dict[str, Any], scalars: dict[str, Any],
            outputs: dict[str, torch.Tensor], device: torch.device) -> None:
    from cuda.bindings import driver

    workspaces = {w.name: torch.empty(max(w.nbytes, 1), dtype=torch.uint8, device=device)
                  for w in prep.loaded.kernels.workspaces}
    stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    for fn, grid, block, smem, spec in prep.launches:
        vals, types = [], []
        for kind, name, ctype in spec:
            if kind == "in":
                vals.append(values[name].data_ptr())
            elif kind == "out":
                vals.append(outputs[name].data_ptr())
            elif kind == "ws":
                vals.append(workspaces[name].data_ptr())
            else:
                v = scalars[name]
                vals.append(float(v) if ctype is ctypes.c_double else
                            bool(v) if ctype is ctypes.c_bool else int(v))
            types.append(ctype)
        _check(driver.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1],
                                     block[2], smem, stream, (tuple(vals), tuple(types)), 0))
