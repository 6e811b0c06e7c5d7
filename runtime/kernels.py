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


class _Args:
    """Kernel-argument storage reused across launches: one ctypes value per parameter and the
    ``void*`` array pointing at them, whose address cuLaunchKernel takes as is."""

    def __init__(self, types: list[Any]):
        self.values = [t() for t in types]
        self.array = (ctypes.c_void_p * max(len(types), 1))(
            *[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.array)


@dataclass
class Launch:
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    # per parameter: (source, index or name, ctype); source is "arg" (the segment's argument
    # list), "out" (its outputs), "ws" (workspaces) or "scalar" (a host scalar by name)
    sources: list[tuple[str, Any, Any]]
    args: _Args


@dataclass
class Prepared:
    """A segment ready to launch: its kernels and where each kernel argument comes from."""

    loaded: Loaded
    boundary: list[int]  # argument positions that must be dense (boundary tensors)
    aligned: list[tuple[int, int]]  # (argument position, bytes) its vector loads need
    outputs: list[tuple[tuple[int, ...], torch.dtype]]  # allocation of each written tensor
    returned: list[int]  # output positions, in the sub-fusion's output order
    workspaces: list[int]  # bytes of each scratch buffer
    launches: list[Launch]
    device_arg: int | None  # an argument that is a tensor (its device runs the segment)


_prepared: dict[tuple, Prepared] = {}
_streams: dict[int, Any] = {}


def prepare(plan: Plan, segment: Segment, vector: int | None = None) -> Prepared:
    key = (plan.plan_id, segment.index, vector, torch.cuda.current_device())
    hit = _prepared.get(key)
    if hit is not None:
        return hit
    loaded = load_segment(plan, segment, vector)
    sub, bound = segment.sub, plan.bound
    originals = [sub.input_map[n] for n in sub.fusion.inputs]
    arg_of = {name: i for i, name in enumerate(originals)}
    boundary = [i for i, name in enumerate(originals)
                if name in bound.fusion.tensors and name not in bound.inputs]
    outputs = list(segment.schedule.outputs)
    out_of = {t: i for i, t in enumerate(outputs)}
    ws_of = {w.name: i for i, w in enumerate(loaded.kernels.workspaces)}
    ctypes_of = {"double": ctypes.c_double, "bool": ctypes.c_bool}
    launches = []
    for kernel, fn in zip(loaded.kernels.kernels, loaded.functions):
        sources = []
        for p in kernel.params:
            if p.kind == "in":
                sources.append(("arg", arg_of[p.name], ctypes.c_void_p))
            elif p.kind == "out":
                sources.append(("out", out_of[p.name], ctypes.c_void_p))
            elif p.kind == "ws":
                sources.append(("ws", ws_of[p.name], ctypes.c_void_p))
            else:
                sources.append(("scalar", p.name, ctypes_of.get(p.ctype, ctypes.c_longlong)))
        launches.append(Launch(fn, kernel.grid, kernel.block, kernel.smem, sources,
                               _Args([c for _, _, c in sources])))
    prepared = Prepared(
        loaded, boundary,
        [(arg_of[t], a) for t, a in loaded.kernels.vector_aligned.items() if t in arg_of],
        [(tuple(bound.compact_shape(t)), TORCH_DTYPE[bound.fusion.tensors[t].dtype])
         for t in outputs],
        [out_of[sub.output_map[n]] for n in sub.fusion.outputs],
        [w.nbytes for w in loaded.kernels.workspaces], launches,
        next((i for i, n in enumerate(originals) if n in bound.fusion.tensors), None))
    _prepared[key] = prepared
    return prepared


def cuda_runner(plan: Plan, segment: Segment, args: list[Any],
                scalars: dict[str, Any]) -> list[torch.Tensor]:
    """Run one segment: library and fallback segments through torch, the rest as kernels."""
    if segment.kind in (Kind.LIBRARY, Kind.FALLBACK):
        return run_reference(segment.sub.fusion, args, _sub_bound(plan, segment))
    prep = prepare(plan, segment)
    for i in prep.boundary:
        if not args[i].is_contiguous():  # boundary tensors: compact and dense
            args = list(args)
            args[i] = args[i].contiguous()
    for i, alignment in prep.aligned:
        if args[i].data_ptr() % alignment:
            prep = prepare(plan, segment, vector=1)
            break
    device = args[prep.device_arg].device if prep.device_arg is not None else \
        torch.device("cuda", torch.cuda.current_device())
    outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in prep.outputs]
    if prep.launches:
        _launch(prep, args, scalars, outputs, device)
    return [outputs[i] for i in prep.returned]


def _stream(device: torch.device):
    from cuda.bindings import driver

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # skips building a Stream
    handle = raw(device.index) if raw is not None and device.index is not None else \
        torch.cuda.current_stream(device).cuda_stream
    stream = _streams.get(handle)
    if stream is None:
        stream = _streams[handle] = driver.CUstream(handle)
    return stream


def _launch(prep: Prepared, args: list[Any], scalars: dict[str, Any],
            outputs: list[torch.Tensor], device: torch.device) -> None:
    from cuda.bindings import driver

    workspaces = [torch.empty(max(n, 1), dtype=torch.uint8, device=device)
                  for n in prep.workspaces]
    stream = _stream(device)
    with _lock:  # the argument buffers are shared by every caller of this segment
        for launch in prep.launches:
            for slot, (source, key, ctype) in zip(launch.args.values, launch.sources):
                if source == "arg":
                    slot.value = args[key].data_ptr()
                elif source == "out":
                    slot.value = outputs[key].data_ptr()
                elif source == "ws":
                    slot.value = workspaces[key].data_ptr()
                else:
                    v = scalars[key]
                    slot.value = float(v) if ctype is ctypes.c_double else \
                        bool(v) if ctype is ctypes.c_bool else int(v)
            g, b = launch.grid, launch.block
            _check(driver.cuLaunchKernel(launch.function, g[0], g[1], g[2], b[0], b[1], b[2],
                                         launch.smem, stream, launch.args.address, 0))
