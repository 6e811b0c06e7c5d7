"""Generated kernels on torch tensors: compile, load, and launch one segment.

``segment_code`` turns a plan segment into ``SegmentCode``: its loaded kernels, with each kernel
parameter described by where it comes from (the segment's arguments, the buffers it writes, its
scratch workspaces, a scalar) and the buffers' sizes. It is memoised per plan, segment, vector
width and device: one cache. ``cuda_runner`` runs a segment from it (the segment-at-a-time path
of ``execute_plan``); ``runtime.program`` composes the same descriptions into whole-plan programs.

Kernels launch on torch's current stream through the CUDA driver API (cuda-python), in the
context torch already made current. Segment outputs are allocated compact and contiguous, as the
plan accounts them. A segment whose tensors are not aligned for its vector loads is regenerated
without vectors (cached separately).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch

from fusecut.codegen import SegmentKernels, generate_segment
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.plan.plan import Plan, Segment
from fusecut.runtime.compile import CompileError, compile_cubin
from fusecut.runtime.executor import reference_runner
from fusecut.runtime.lru import BoundedCache
from fusecut.runtime.tensors import TORCH_DTYPE

log = logging.getLogger("fusecut.runtime")


class LaunchError(RuntimeError):
    """A CUDA driver call failed while running a segment."""


def check(result):
    err = result[0]
    if int(err) != 0:
        from cuda.bindings import driver

        _, name = driver.cuGetErrorName(err)
        raise LaunchError(f"CUDA driver error {int(err)} ({name.decode() if name else '?'})")
    return result[1] if len(result) == 2 else result[1:]


def arch_of_current_device() -> str:
    return device_arch(torch.cuda.current_device())


@functools.cache
def device_arch(index: int) -> str:
    """The NVRTC architecture of CUDA device ``index`` (``sm_90``)."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


NOT_GENERATED = (Kind.LIBRARY, Kind.FALLBACK)  # segments run by torch or a library: no kernel

CTYPES = {"double": ctypes.c_double, "bool": ctypes.c_bool, "int": ctypes.c_int,
          "long long": ctypes.c_longlong}


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a segment. ``params`` say where each parameter comes from: ("arg", i) the
    segment's i-th argument, ("out", i) its i-th written buffer, ("ws", i) a workspace,
    ("scalar", name) a host scalar, or ("const", value) an extent of the plan's shapes (the
    code takes it at launch: codegen's "extent" parameters); ``ctypes`` are the parameters' C
    types."""

    function: Any  # CUfunction
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: tuple[tuple[str, Any], ...]
    ctypes: tuple[Any, ...]

    @property
    def address(self) -> int:
        return int(self.function)


@dataclass(frozen=True)
class SegmentCode:
    kernels: SegmentKernels
    launches: tuple[KernelLaunch, ...]
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]  # each written buffer, compact
    returned: tuple[int, ...]  # written buffer of each sub-fusion output, in its order
    workspaces: tuple[int, ...]  # bytes of each scratch buffer
    aligned: tuple[tuple[int, int], ...]  # (argument position, bytes) its vector loads need
    dense: tuple[int, ...]  # argument positions that must be dense (boundary tensors)


# ``cuda.bindings`` is imported inside the functions that call the driver: the CPU image has no
# cuda-python, and this module loads there (the program builder imports it) without launching.
_lock = threading.Lock()
_modules: dict[str, Any] = {}  # cubin hash -> CUmodule (per process, current device)
MAX_SEGMENT_CODES = 1024
_code: BoundedCache[tuple, SegmentCode] = BoundedCache(MAX_SEGMENT_CODES)


def _module(cubin: bytes):
    from cuda.bindings import driver

    key = hashlib.sha256(cubin).hexdigest()
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = check(driver.cuModuleLoadData(cubin))
            _modules[key] = mod
        return mod


def _functions(kernels: SegmentKernels) -> list[Any]:
    from cuda.bindings import driver

    if not kernels.kernels:
        return []
    device_context(torch.cuda.current_device())
    mod = _module(compile_cubin(kernels.source, arch_of_current_device(), kernels.kernels[0].name))
    functions = []
    for k in kernels.kernels:
        fn = check(driver.cuModuleGetFunction(mod, k.name.encode()))
        if k.smem:
            static = check(driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn))
            if needs_smem_opt_in(static, k.smem):
                check(driver.cuFuncSetAttribute(
                    fn,
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    k.smem))
        functions.append(fn)
    return functions


# A block's static and dynamic shared memory together, without the opt-in attribute
DEFAULT_SMEM = 48 * 1024


def needs_smem_opt_in(static: int, dynamic: int) -> bool:
    """Whether a kernel with ``static`` bytes of ``__shared__`` arrays must opt in before it
    launches with ``dynamic`` bytes: the 48 KiB default caps their sum, not the dynamic bytes
    alone (an inner-outer kernel of 48 KiB dynamic and 2.5 KiB static, its barriers and group
    scratch, failed its launch with CUDA_ERROR_INVALID_VALUE: nvFuser's test_issue1310)."""
    return dynamic > 0 and static + dynamic > DEFAULT_SMEM


def segment_code(plan: Plan, segment: Segment, vector: int | None = None,
                 device: int | None = None) -> SegmentCode:
    """The segment's kernels, compiled and loaded on ``device`` (default: the current one;
    memoised)."""
    if device is None:
        device = torch.cuda.current_device()
    key = (plan.plan_id, segment.index, vector, device)
    hit = _code.get(key)
    if hit is not None:
        return hit
    kernels = generate_segment(plan, segment, vector)
    sub, bound = segment.sub, plan.bound
    originals = [sub.input_map[n] for n in sub.fusion.inputs]
    arg_of = {name: i for i, name in enumerate(originals)}
    written = list(segment.schedule.outputs)
    out_of = {t: i for i, t in enumerate(written)}
    ws_of = {w.name: i for i, w in enumerate(kernels.workspaces)}
    launches = []
    for kernel, fn in zip(kernels.kernels, _functions(kernels)):
        params, types = [], []
        for p in kernel.params:
            if p.kind == "scalar":
                params.append(("scalar", p.name))
                types.append(CTYPES.get(p.ctype, ctypes.c_longlong))
                continue
            if p.kind == "extent":
                params.append(("const", p.value))
                types.append(CTYPES[p.ctype])
                continue
            index = {"in": arg_of, "out": out_of, "ws": ws_of}[p.kind][p.name]
            params.append(({"in": "arg"}.get(p.kind, p.kind), index))
            types.append(ctypes.c_void_p)
        launches.append(KernelLaunch(fn, kernel.grid, kernel.block, kernel.smem, tuple(params),
                                     tuple(types)))
    code = SegmentCode(
        kernels, tuple(launches),
        tuple((tuple(bound.compact_shape(t)), TORCH_DTYPE[bound.fusion.tensors[t].dtype])
              for t in written),
        tuple(out_of[sub.output_map[n]] for n in sub.fusion.outputs),
        tuple(w.nbytes for w in kernels.workspaces),
        tuple((arg_of[t], a) for t, a in kernels.vector_aligned.items() if t in arg_of),
        tuple(i for i, name in enumerate(originals)
              if name in bound.fusion.tensors and name not in bound.inputs))
    _code.put(key, code)
    return code


def code_for_alignment(plan: Plan, segment: Segment, addresses: list[int],
                       device: int | None = None) -> SegmentCode:
    """The vectorised code, or the scalar one if an argument its vector loads need is not
    aligned (``addresses``: of each argument's data; 0 for buffers fusecut allocated) or NVRTC
    cannot compile the vectorised one (a ``CompileError`` when it cannot compile either)."""
    try:
        code = segment_code(plan, segment, None, device)
    except CompileError:
        return segment_code(plan, segment, 1, device)
    if any(addresses[i] % a for i, a in code.aligned):
        return segment_code(plan, segment, 1, device)
    return code


_warned: set[tuple[str, int]] = set()


def warn_torch_segment(plan: Plan, segment: Segment, error: CompileError) -> None:
    """Say once per segment that it runs through torch because its kernels did not compile."""
    key = (plan.plan_id, segment.index)
    if key not in _warned:
        _warned.add(key)
        log.warning("fusecut: segment %d (%s) of plan %s runs through torch: %s", segment.index,
                    segment.kind.value, plan.plan_id[:12], error)


class ArgBuffer:
    """Kernel-argument storage reused across launches: one ctypes value per parameter and the
    ``void*`` array pointing at them, whose address cuLaunchKernel takes as is. Callers hold
    ``lock`` while they fill and launch."""

    lock = threading.Lock()

    def __init__(self, types: tuple[Any, ...]):
        self.values = [t() for t in types]
        self.array = (ctypes.c_void_p * max(len(types), 1))(
            *[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.array)


_arg_buffers: dict[int, ArgBuffer] = {}


def arg_buffer(launch: KernelLaunch) -> ArgBuffer:
    buf = _arg_buffers.get(id(launch))
    if buf is None:
        buf = _arg_buffers[id(launch)] = ArgBuffer(launch.ctypes)
    return buf


def launch_kernel(launch: KernelLaunch, values: list[Any], stream: int) -> None:
    """Launch with parameter ``values`` (ints for pointers and integers, floats, bools)."""
    from cuda.bindings import driver

    buf = arg_buffer(launch)
    with ArgBuffer.lock:  # the argument buffers are shared by every caller of this kernel
        for slot, value in zip(buf.values, values):
            slot.value = value
        g, b = launch.grid, launch.block
        check(driver.cuLaunchKernel(launch.function, g[0], g[1], g[2], b[0], b[1], b[2],
                                    launch.smem, stream, buf.address, 0))


def _current_stream_object(device_index: int) -> int:
    return torch.cuda.current_stream(device_index).cuda_stream


# torch's current stream on a device, as a raw handle; the private getter skips building a
# Stream object (0.2 us against 2 us)
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_object)


def scalar_value(ctype: Any, value: Any) -> Any:
    return float(value) if ctype is ctypes.c_double else \
        bool(value) if ctype is ctypes.c_bool else int(value)


def cuda_runner(plan: Plan, segment: Segment, args: list[Any],
                scalars: dict[str, Any]) -> list[torch.Tensor]:
    """Run one segment (the segment-at-a-time path; warm calls use runtime.program): library
    and fallback segments through torch, the rest as kernels."""
    if segment.kind in NOT_GENERATED:
        return reference_runner(plan, segment, args, scalars)
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    device = tensor.device if tensor is not None else \
        torch.device("cuda", torch.cuda.current_device())
    device_context(device.index)
    try:
        code = code_for_alignment(plan, segment, [0] * len(args), device.index)
        args = list(args)
        for i in code.dense:  # boundary tensors: compact and dense
            if not args[i].is_contiguous():
                args[i] = args[i].contiguous()
        code = code_for_alignment(plan, segment, [
            a.data_ptr() if isinstance(a, torch.Tensor) else 0 for a in args], device.index)
    except CompileError as e:  # correct and slower: torch runs it
        warn_torch_segment(plan, segment, e)
        return reference_runner(plan, segment, args, scalars)
    outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in code.outputs]
    workspaces = [torch.empty(max(n, 1), dtype=torch.uint8, device=device)
                  for n in code.workspaces]
    stream = current_stream(device.index)
    pools = {"arg": args, "out": outputs, "ws": workspaces}
    for launch in code.launches:
        values = []
        for (source, key), ctype in zip(launch.params, launch.ctypes):
            if source == "scalar":
                values.append(scalar_value(ctype, scalars[key]))
            elif source == "const":
                values.append(key)
            else:
                values.append(pools[source][key].data_ptr())
        launch_kernel(launch, values, stream)
    return [outputs[i] for i in code.returned]


def driver_functions(context: int) -> tuple[int, int, int, int]:
    """cuLaunchKernel, cuCtxGetCurrent and cuCtxSetCurrent in the driver library that cuda-python
    uses, and the kernels' context."""
    lib = ctypes.CDLL("libcuda.so.1")
    address = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
               for name in ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxSetCurrent")]
    return (*address, context)


_primary_contexts: dict[int, int] = {}  # device index -> its primary context (torch's)


def device_context(device_index: int) -> int:
    """The device's primary context (the one torch uses), made current in this thread if it is
    not: a thread torch starts (autograd's backward) has no current context until its first
    CUDA runtime call, and a driver call before that (a module load, a launch: a backward that
    starts with a fusecut region) fails with CUDA_ERROR_INVALID_CONTEXT."""
    from cuda.bindings import driver

    context = _primary_contexts.get(device_index)
    if context is None:
        with _lock:  # retained once per device, whichever thread asks first
            context = _primary_contexts.get(device_index)
            if context is None:
                device = check(driver.cuDeviceGet(device_index))
                context = int(check(driver.cuDevicePrimaryCtxRetain(device)))
                _primary_contexts[device_index] = context
    ensure_context(context)
    return context


def ensure_context(context: int) -> None:
    """Make the kernels' context current in a thread that has none (or another)."""
    from cuda.bindings import driver

    if int(check(driver.cuCtxGetCurrent())) != context:
        check(driver.cuCtxSetCurrent(driver.CUcontext(context)))
