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


def _aligned(loaded: Loaded, tensors: dict[str, torch.Tensor]) -> bool:
    return all(tensors[t].data_ptr() % a == 0 for t, a in loaded.kernels.vector_aligned.items()
               if t in tensors)


def cuda_runner(plan: Plan, segment: Segment, args: list[Any]) -> list[torch.Tensor]:
    """Run one segment: library and fallback segments through torch, the rest as kernels."""
    sub = segment.sub
    if segment.kind in (Kind.LIBRARY, Kind.FALLBACK):
        return run_reference(sub.fusion, args)
    bound = plan.bound
    values: dict[str, Any] = {}
    for name, value in zip(sub.fusion.inputs, args):
        original = sub.input_map[name]
        if isinstance(value, torch.Tensor) and original not in bound.inputs:
            value = value.contiguous()  # boundary tensors: compact and dense
        values[original] = value
    loaded = load_segment(plan, segment)
    if not _aligned(loaded, values):
        loaded = load_segment(plan, segment, vector=1)
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)),
                  torch.device("cuda", torch.cuda.current_device()))
    outputs = {t: torch.empty(bound.compact_shape(t), dtype=TORCH_DTYPE[
        bound.fusion.tensors[t].dtype], device=device) for t in segment.schedule.outputs}
    launch_segment(loaded, values, outputs, device)
    return [outputs[sub.output_map[n]] for n in sub.fusion.outputs]


def launch_segment(loaded: Loaded, values: dict[str, Any], outputs: dict[str, torch.Tensor],
                   device: torch.device) -> None:
    from cuda.bindings import driver

    if not loaded.functions:
        return
    workspaces = {w.name: torch.empty(max(w.nbytes, 1), dtype=torch.uint8, device=device)
                  for w in loaded.kernels.workspaces}
    stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    for kernel, fn in zip(loaded.kernels.kernels, loaded.functions):
        vals, types = [], []
        for p in kernel.params:
            if p.kind == "in":
                vals.append(values[p.name].data_ptr())
                types.append(ctypes.c_void_p)
            elif p.kind == "out":
                vals.append(outputs[p.name].data_ptr())
                types.append(ctypes.c_void_p)
            elif p.kind == "ws":
                vals.append(workspaces[p.name].data_ptr())
                types.append(ctypes.c_void_p)
            else:
                v = values.get(p.name)
                if p.ctype == "double":
                    vals.append(float(v))
                    types.append(ctypes.c_double)
                elif p.ctype == "bool":
                    vals.append(bool(v))
                    types.append(ctypes.c_bool)
                else:
                    vals.append(int(v))
                    types.append(ctypes.c_longlong)
        gx, gy, gz = kernel.grid
        bx, by, bz = kernel.block
        _check(driver.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, kernel.smem, stream,
                                     (tuple(vals), tuple(types)), 0))
