"""A plan compiled for one argument signature: what a warm call runs.

The first call with a new signature (each tensor's shape, strides, dtype, device and 16-byte
alignment class; each scalar's type, and the value of scalars the plan is built for) plans,
compiles and builds a ``Program``: every kernel of every segment in plan order, each parameter
resolved to a slot (the fusion's arguments first, then the buffers the segments write) or a
constant, the buffers' sizes and the launches that allocate and free them, and how the fusion's
outputs are read from the slots. A warm call then only allocates, fills pointers and launches on
torch's current stream: in C++ (``runtime.launcher``) when it is built and the program has only
kernels, in Python otherwise (library and fallback segments run through torch). It does no
planning, no compilation, no metadata objects and no per-segment timing.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from fusecut.codegen.names import dynamic_scalars
from fusecut.optimizer.analysis.scalars import baked_scalar_inputs, eval_scalar_op
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.plan.plan import Plan
from fusecut.runtime.compile import CompileError
from fusecut.runtime.executor import expand_compact, segment_bound
from fusecut.runtime.kernels import (
    NOT_GENERATED,
    KernelLaunch,
    code_for_alignment,
    current_stream,
    device_context,
    driver_functions,
    ensure_context,
    launch_kernel,
    scalar_value,
    warn_torch_segment,
)
from fusecut.runtime.lru import BoundedCache
from fusecut.runtime.reference import run_reference
from fusecut.runtime.rng import call_with_draw, with_implicit_rng
from fusecut.runtime.tensors import TORCH_DTYPE, unshare

# Parameter kinds, as fusecut/runtime/native/launcher.cpp reads them.
SLOT, INT, DOUBLE, BOOL, SCALAR_INT, SCALAR_DOUBLE, SCALAR_BOOL = range(7)
_CONSTANT = {ctypes.c_double: DOUBLE, ctypes.c_bool: BOOL}
_DYNAMIC = {ctypes.c_double: SCALAR_DOUBLE, ctypes.c_bool: SCALAR_BOOL}
# torch dtype -> c10::ScalarType code (stable across torch versions)
SCALAR_TYPE = {torch.uint8: 0, torch.int32: 3, torch.int64: 4, torch.float16: 5,
               torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
               torch.float8_e5m2: 23, torch.float8_e4m3fn: 24}


def signature(args: list[Any], baked: frozenset[int] = frozenset()) -> tuple:
    """What a program is built for: per tensor (shape, strides, dtype, device, address mod 16);
    per scalar its type, and its value where the plan depends on it (positions in ``baked``)."""
    return tuple([(a.shape, a.stride(), a.dtype, a.get_device(), a.data_ptr() & 15)
                  if isinstance(a, torch.Tensor) else (type(a), a) if i in baked else type(a)
                  for i, a in enumerate(args)])


def baked_positions(fusion) -> frozenset[int]:
    baked = baked_scalar_inputs(fusion)
    return frozenset(i for i, name in enumerate(fusion.inputs) if name in baked)


@dataclass
class Launch:
    """One kernel launch of a program. ``params``: (kind, index, int value, float value) per
    kernel parameter, kinds as above; SLOT and SCALAR_* index slots and arguments."""

    kernel: KernelLaunch | None  # None: a segment with nothing to launch allocates only
    params: list[tuple[int, int, int, float]]
    allocs: tuple[int, ...]  # buffers this launch writes first
    frees: tuple[int, ...]  # buffers this launch reads last


@dataclass
class LibraryCall:
    """A linear or matmul segment: one cuBLAS call through torch (ATen, from the launcher)."""

    op: str  # "linear" or "matmul"
    inputs: list[int]  # slots: a, b[, bias]
    output: int
    dtype: torch.dtype
    frees: tuple[int, ...] = ()
    compact: tuple[int, ...] | None = None  # the stored shape, when extent-1 axes are dropped

    def run(self, slots: list[Any]) -> None:
        a, b, *bias = (slots[i] for i in self.inputs)
        r = F.linear(a, b, *bias) if self.op == "linear" else torch.matmul(a, b)
        r = r.to(self.dtype).contiguous()
        slots[self.output] = r if self.compact is None else r.view(self.compact)


LIBRARY_OPS = {"linear": 1, "matmul": 2}


@dataclass
class TorchCall:
    """A library or fallback segment, run through torch: arguments by slot (or a scalar name),
    results into slots."""

    fusion: Any
    bound: Any
    args: list[tuple[int | None, str | None]]
    results: list[int]
    dense: list[bool]  # results other segments' kernels read: made contiguous
    frees: tuple[int, ...]


@dataclass
class Program:
    signature: tuple
    device: torch.device
    n_args: int
    buffers: list[tuple[tuple[int, ...], torch.dtype]]  # slot n_args + i
    steps: list[Launch | LibraryCall | TorchCall]
    outputs: list[tuple[int, tuple[int, ...] | None, tuple[bool, ...] | None]]
    aliases: list[tuple[int, int]]  # (output position, argument position) updated in place
    scalar_ops: list[tuple[str, str, list[str], dict, Any]]  # derived run-time scalars
    scalar_args: dict[str, int]  # run-time scalar inputs -> argument position
    static_scalars: dict[str, Any]
    baked: frozenset[int] = frozenset()  # argument positions whose value is in the signature
    context: int = 0  # the driver context the kernels live in (0 on the CPU)
    native: Any = None  # (launcher run function, C++ program), when C++ runs this program
    native_ready: Any = None  # while the launcher builds: says when it is there
    # outputs that may share memory with an argument (an argument itself, or a torch segment's
    # result, which can be a view): checked on every run; kernels' outputs are fresh buffers
    may_share: tuple[int, ...] = ()
    # the last arguments when random ops have no seed: a call gives the others and each run
    # appends fresh draws from torch's generator (runtime.rng)
    implicit_rng: tuple[str, ...] = ()

    # ---- the Python path -----------------------------------------------------------------------

    def scalars(self, args: list[Any]) -> dict[str, Any]:
        if not self.scalar_ops and not self.scalar_args:
            return self.static_scalars
        values = dict(self.static_scalars)
        for name, pos in self.scalar_args.items():
            values[name] = args[pos]
        for out, op, inputs, attrs, dtype in self.scalar_ops:
            values[out] = eval_scalar_op(op, [values[n] for n in inputs], attrs, dtype)
        return values

    def call(self, args: list[Any], into: list[torch.Tensor | None] | None = None
             ) -> list[torch.Tensor] | None:
        """The warm call: the outputs, or None when ``args`` do not match the signature.
        ``into``: as for ``run_python``."""
        if self.implicit_rng and len(args) == self.n_args - len(self.implicit_rng):
            return self._call_drawing(args, into)
        native = self.native
        if native is not None:
            return native[0](native[1], args, current_stream(self.device.index), into)
        if signature(args, self.baked) != self.signature:
            return None
        if self.native_ready is not None and self.native_ready():  # built since: use it
            self.native, self.native_ready = native_program(self), None
        return self.run_python(args, into)

    def _call_drawing(self, args: list[Any], into: list[torch.Tensor | None] | None
                      ) -> list[torch.Tensor] | None:
        """``call`` with the caller's arguments only: draw, run, and give the draw back when
        the arguments did not match after all (the caller then runs another program)."""
        if self.native is None and \
                signature(args, self.baked) != self.signature[:len(args)]:
            return None
        return call_with_draw(len(self.implicit_rng) - 1, _rng_device(self.device), args,
                              lambda full: self.call(full, into))

    def run(self, args: list[Any], into: list[torch.Tensor | None] | None = None
            ) -> list[torch.Tensor]:
        """Run on arguments known to match (the caller looked the program up by them)."""
        args = with_implicit_rng(self.implicit_rng, self.n_args, args)  # drawn once
        outs = self.call(args, into)
        return outs if outs is not None else self.run_python(args, into)

    @staticmethod
    def _values(step: Launch, slots: list[Any], scalars: dict[str, Any]) -> list[Any]:
        values = []
        for (kind, i, ivalue, dvalue), (_, name), ctype in zip(
                step.params, step.kernel.params, step.kernel.ctypes):
            if kind == SLOT:
                values.append(slots[i].data_ptr())
            elif kind >= SCALAR_INT:
                values.append(scalar_value(ctype, scalars[name]))
            else:
                values.append(dvalue if kind == DOUBLE else ivalue)
        return values

    def run_python(self, args: list[Any], into: list[torch.Tensor | None] | None = None
                   ) -> list[torch.Tensor]:
        """Run in Python; ``into``: per output, a tensor to write it to (a slice of a whole
        output, in a stream loop): kernels write there directly when it is dense, else it is
        copied."""
        slots: list[Any] = list(args) + [None] * len(self.buffers)
        provided = self._provided(into) if into is not None else {}
        scalars = self.scalars(args)
        device = self.device
        stream = 0
        if device.type == "cuda":
            stream = current_stream(device.index)
            ensure_context(self.context)
        for step in self.steps:
            if isinstance(step, Launch):
                for b in step.allocs:
                    shape, dtype = self.buffers[b - self.n_args]
                    slots[b] = provided[b] if b in provided else \
                        torch.empty(shape, dtype=dtype, device=device)
                if step.kernel is not None:
                    launch_kernel(step.kernel, self._values(step, slots, scalars), stream)
            elif isinstance(step, LibraryCall):
                step.run(slots)
            else:
                call_args = [slots[i] if i is not None else scalars[name]
                             for i, name in step.args]
                # a segment of factories alone makes its tensors on the program's device
                results = run_reference(step.fusion, call_args, step.bound, device=device)
                for slot, value, dense in zip(step.results, results, step.dense):
                    slots[slot] = value.contiguous() if dense else value
            for b in step.frees:
                slots[b] = None
        outputs = [slots[i] if shape is None else expand_compact(slots[i], shape, broadcast)
                   for i, shape, broadcast in self.outputs]
        for out, arg in self.aliases:  # in-place updates first, as execute_plan does
            args[arg].copy_(outputs[out])
        if into is not None:
            for (slot, _, _), target in zip(self.outputs, into):
                if target is not None and slot not in provided:  # slots hold compact values
                    target.copy_(slots[slot].reshape(target.shape))
            return outputs
        if self.may_share:
            unshare(outputs, args, self.may_share)
        return outputs

    @functools.cached_property
    def _kernel_buffers(self) -> frozenset[int]:
        """The buffers kernels allocate (a stream loop asks on every iteration)."""
        return frozenset(b for step in self.steps if isinstance(step, Launch)
                         for b in step.allocs)

    def _provided(self, into: list[torch.Tensor | None]) -> dict[int, torch.Tensor]:
        """Kernel-written output buffers that can be the given targets themselves."""
        provided = {}
        for (slot, _, _), target in zip(self.outputs, into):
            if target is None or slot not in self._kernel_buffers:
                continue
            shape, dtype = self.buffers[slot - self.n_args]
            if target.dtype == dtype and target.is_contiguous() and \
                    target.numel() == _numel(shape):
                provided[slot] = target.view(shape)
        return provided


def _rng_device(device: torch.device) -> torch.device | None:
    return device if device.type == "cuda" else None


def _numel(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n


def build_program(plan: Plan, args: list[Any], sig: tuple | None = None) -> Program:
    """Compile every kernel of ``plan`` for these arguments and lay out the warm call (kernels
    are loaded on the arguments' device)."""
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is not None and tensor.is_cuda:
        with torch.cuda.device(tensor.device):
            return _build_program(plan, args, sig)
    return _build_program(plan, args, sig)


def _build_program(plan: Plan, args: list[Any], sig: tuple | None) -> Program:
    """Lay ``plan`` out for these arguments, one decision per stage: the per-call random
    placeholders, each segment's steps in plan order (``_Layout``), when each buffer is freed,
    how the outputs are read from the slots, which outputs may share an argument's memory, and
    whether the C++ launcher runs the program."""
    fusion, bound = plan.fusion, plan.bound
    implicit = fusion.implicit_rng
    args, sig = _with_rng_placeholders(implicit, len(fusion.inputs), args, sig)
    layout = _Layout.start(plan, args)
    for seg in plan.segments:
        layout.add_segment(plan, seg, args)
    layout.place_frees()
    outputs = layout.outputs()
    baked = baked_positions(fusion)
    program = Program(
        signature=sig if sig is not None else signature(args, baked), device=layout.device,
        n_args=layout.n_args, buffers=layout.buffers, steps=layout.steps, outputs=outputs,
        aliases=[(fusion.outputs.index(o), layout.slot_of[i]) for o, i in fusion.aliases.items()],
        scalar_ops=_derived_scalars(fusion, layout.dynamic, layout.scalar_args),
        scalar_args=layout.scalar_args,
        static_scalars={k: v for k, v in bound.scalars.items() if k not in layout.dynamic},
        baked=baked, context=device_context(layout.device.index)
        if layout.device.type == "cuda" else 0,
        may_share=_may_share(layout.steps, outputs, layout.n_args), implicit_rng=implicit)
    _attach_native(program)
    return program


def _with_rng_placeholders(implicit: tuple[str, ...], n_inputs: int, args: list[Any],
                           sig: tuple | None) -> tuple[list[Any], tuple | None]:
    """Arguments without the per-call seed and offsets of unseeded random ops get placeholders
    for them: int scalars, never in the signature (each call draws its own, ``runtime.rng``)."""
    if implicit and len(args) == n_inputs - len(implicit):
        args = [*args, *(0 for _ in implicit)]
        sig = None if sig is None else (*sig, *(int for _ in implicit))
    return args, sig


@dataclass
class _Layout:
    """A program being laid out: the slots (the fusion's arguments first, then the buffers the
    segments write), the steps so far, and the last step reading each slot (where it is freed).
    Each segment adds one library call, its compiled kernels, or one torch call."""

    fusion: Any
    bound: Any
    n_args: int
    device: torch.device
    dynamic: Any  # the scalars known only at run time (``codegen.names.dynamic_scalars``)
    scalar_args: dict[str, int]  # run-time scalar inputs -> argument position
    slot_of: dict[str, int]  # tensor (or scalar input) -> slot
    buffers: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    steps: list[Launch | LibraryCall | TorchCall] = field(default_factory=list)
    reads: dict[int, int] = field(default_factory=dict)  # slot -> last step reading it

    @classmethod
    def start(cls, plan: Plan, args: list[Any]) -> _Layout:
        """No steps yet. The device is the first tensor argument's, else the current GPU."""
        fusion = plan.fusion
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = tensor.device if tensor is not None else \
            torch.device("cuda", torch.cuda.current_device())
        slot_of = {name: i for i, name in enumerate(fusion.inputs)}
        dynamic = dynamic_scalars(plan.bound)
        scalar_args = {n: slot_of[n] for n in fusion.scalar_inputs() if n in dynamic}
        return cls(fusion, plan.bound, len(args), device, dynamic, scalar_args, slot_of)

    def new_buffer(self, shape, dtype) -> int:
        self.buffers.append((shape, dtype))
        return self.n_args + len(self.buffers) - 1

    def add_segment(self, plan: Plan, seg, args: list[Any]) -> None:
        """The segment's steps: a library call when it is exactly one (``library_op``); else
        its kernels, compiled for the alignment of these arguments' addresses; else, when
        nothing is generated for it or NVRTC could not compile it, a torch call."""
        sub = seg.sub
        arg_slots = [self.slot_of.get(sub.input_map[n]) for n in sub.fusion.inputs]
        library = library_op(seg)
        if library is not None:
            self._add_library_call(seg, library, arg_slots)
            return
        code = None
        if seg.kind not in NOT_GENERATED:
            code = _compiled_or_none(plan, seg, [
                args[s].data_ptr() if s is not None and s < self.n_args
                and isinstance(args[s], torch.Tensor) else 0
                for s in arg_slots],
                self.device.index if self.device.type == "cuda" else -1)
        if code is None:  # a library-like op, or kernels NVRTC could not compile: torch runs it
            self._add_torch_call(plan, seg, arg_slots)
        else:
            self._add_kernels(seg, code, arg_slots)

    def _add_library_call(self, seg, library, arg_slots: list[int | None]) -> None:
        sub = seg.sub
        out = self.new_buffer(None, None)
        op, squeezed = library
        result = sub.output_map[sub.fusion.outputs[0]]
        self.slot_of[result] = out
        # squeezed: the C++ launcher keeps the same data unsqueezed
        self.steps.append(LibraryCall(op.name, arg_slots, out,
                                      TORCH_DTYPE[self.fusion.tensors[result].dtype],
                                      compact=tuple(self.bound.compact_shape(result))
                                      if squeezed else None))
        for s in arg_slots:
            self.reads[s] = len(self.steps) - 1

    def _add_torch_call(self, plan: Plan, seg, arg_slots: list[int | None]) -> None:
        """Arguments by slot, or by name for a scalar that is no argument; results into new
        buffers, made contiguous when other segments' kernels read them."""
        sub, fusion = seg.sub, self.fusion
        results = [self.new_buffer(None, None) for _ in sub.fusion.outputs]
        for name, slot in zip(sub.fusion.outputs, results):
            self.slot_of[sub.output_map[name]] = slot
        call_args = [(s, None) if s is not None or sub.input_map[n] not in fusion.scalars
                     else (None, sub.input_map[n])
                     for n, s in zip(sub.fusion.inputs, arg_slots)]
        kept = set(fusion.outputs)
        self.steps.append(TorchCall(sub.fusion, segment_bound(plan, seg), call_args, results,
                                    [sub.output_map[n] not in kept for n in sub.fusion.outputs],
                                    ()))
        for s in arg_slots:
            if s is not None:
                self.reads[s] = len(self.steps) - 1

    def _add_kernels(self, seg, code, arg_slots: list[int | None]) -> None:
        """One launch per kernel; the first allocates the written buffers and workspaces (a
        segment with nothing to launch, on empty tensors, still allocates its outputs)."""
        sub = seg.sub
        written = [self.new_buffer(shape, dtype) for shape, dtype in code.outputs]
        workspaces = [self.new_buffer((max(n, 1),), torch.uint8) for n in code.workspaces]
        for name, i in zip(sub.fusion.outputs, code.returned):
            self.slot_of[sub.output_map[name]] = written[i]
        pools = {"arg": arg_slots, "out": written, "ws": workspaces}
        first = len(self.steps)
        for launch in code.launches:
            self.steps.append(Launch(launch, self._params(launch, pools), (), ()))
        if len(self.steps) == first:  # nothing to compute (empty tensors): allocate the outputs
            self.steps.append(Launch(None, [], (), ()))
        self.steps[first].allocs = tuple(written + workspaces)
        for w in workspaces:
            self.reads[w] = len(self.steps) - 1

    def _params(self, launch: KernelLaunch, pools: dict[str, list]) -> list[tuple]:
        """The parameters of the launch about to be the next step: a slot; a run-time scalar
        (its argument position, or -1 for a derived one, looked up by name on each call); or a
        constant, the bound value."""
        params = []
        for (source, key), ctype in zip(launch.params, launch.ctypes):
            if source == "const":  # an extent of the plan's shapes
                params.append((INT, 0, int(key), 0.0))
            elif source != "scalar":
                slot = pools[source][key]
                params.append((SLOT, slot, 0, 0.0))
                self.reads[slot] = len(self.steps)
            elif key in self.scalar_args:
                params.append((_DYNAMIC.get(ctype, SCALAR_INT), self.scalar_args[key], 0, 0.0))
            elif key in self.dynamic:
                params.append((_DYNAMIC.get(ctype, SCALAR_INT), -1, 0, 0.0))
            else:
                value = scalar_value(ctype, self.bound.scalars[key])
                kind = _CONSTANT.get(ctype, INT)
                params.append((kind, 0, 0 if kind == DOUBLE else int(value),
                               float(value) if kind == DOUBLE else 0.0))
        return params

    def place_frees(self) -> None:
        """Each buffer is freed by the last step that reads it, but the fusion's outputs."""
        keep = {self.slot_of[t] for t in self.fusion.outputs}
        frees: dict[int, list[int]] = {}
        for slot, step in self.reads.items():
            if slot >= self.n_args and slot not in keep:
                frees.setdefault(step, []).append(slot)
        for i, step in enumerate(self.steps):
            step.frees = tuple(sorted(frees.get(i, ())))

    def outputs(self) -> list[tuple[int, tuple[int, ...] | None, tuple[bool, ...] | None]]:
        """Per fusion output: its slot, and its logical shape and broadcast axes where the slot
        holds it compact (extent-1 and broadcast axes dropped)."""
        bound, outputs = self.bound, []
        for t in self.fusion.outputs:
            # fusion inputs come at their logical shape already (stride 0 on expanded axes)
            compact = t not in bound.inputs and \
                tuple(bound.compact_shape(t)) != tuple(bound.shapes[t])
            outputs.append((self.slot_of[t], bound.shapes[t] if compact else None,
                            bound.broadcast[t] if compact else None))
        return outputs


def _derived_scalars(fusion, dynamic, scalar_args: dict[str, int]
                     ) -> list[tuple[str, str, list[str], dict, Any]]:
    """The run-time scalars the fusion computes from run-time scalar inputs, in op order: each
    call evaluates them (``Program.scalars``)."""
    return [(o, op.name, list(op.inputs), op.attrs, fusion.scalars[o].dtype)
            for op in fusion.ops for o in op.outputs
            if o in dynamic and o in fusion.scalars and o not in scalar_args]


def _may_share(steps: list[Launch | LibraryCall | TorchCall], outputs: list[tuple],
               n_args: int) -> tuple[int, ...]:
    """The outputs that may share memory with an argument: an argument itself, or a torch
    call's result (which can be a view); kernels' outputs are fresh buffers."""
    torch_results = {slot for step in steps if isinstance(step, TorchCall)
                     for slot in step.results}
    return tuple(k for k, (slot, _, _) in enumerate(outputs)
                 if slot < n_args or slot in torch_results)


def _attach_native(program: Program) -> None:
    """The C++ launcher runs the program when it can (``native_eligible``): from now on when
    the launcher is built, else once its build finishes (``Program.call`` asks)."""
    if native_eligible(program):
        from fusecut.runtime import launcher

        if launcher.native() is not None:
            program.native = native_program(program)
        elif launcher.failure() is None and launcher.enabled():
            program.native_ready = launcher.native


def _compiled_or_none(plan: Plan, seg, addresses: list[int], device: int):
    """The segment's compiled kernels (``code_for_alignment``), or None where NVRTC refuses or
    crashes on them (``runtime.nvrtc_child``): the segment then runs through the torch
    reference, correct and slower, and a warning says so once per segment."""
    try:
        return code_for_alignment(plan, seg, addresses, device)
    except CompileError as e:
        warn_torch_segment(plan, seg, e)
        return None


MAX_PROGRAMS = 256
_programs: BoundedCache[tuple, Program] = BoundedCache(MAX_PROGRAMS)


def program_for(plan: Plan, args: list[Any]) -> Program:
    """The compiled program of ``plan`` for arguments like these, from a process-wide cache
    (built on first use)."""
    baked = plan.runtime_memo.get("baked")
    if baked is None:
        baked = plan.runtime_memo["baked"] = baked_positions(plan.fusion)
    sig = signature(args, baked)
    key = (plan.plan_id, sig)
    program = _programs.get(key)
    if program is None:
        program = build_program(plan, args, sig)
        _programs.put(key, program)
    return program


def library_op(segment):
    """(the linear or matmul op, whether a squeeze follows) when a library segment is exactly
    that op on its inputs, or that op and a squeeze of extent-1 axes to the compact form (the
    same data: a slice of a stream loop has its stream axis at extent 1); else None: anything
    else runs through the torch reference."""
    sub = segment.sub.fusion
    if segment.kind is not Kind.LIBRARY or not 1 <= len(sub.ops) <= 2:
        return None
    op, *squeeze = sub.ops
    result = squeeze[0].outputs if squeeze else op.outputs
    if squeeze and (squeeze[0].name != "squeeze" or list(squeeze[0].inputs) != list(op.outputs)):
        return None
    if op.name not in LIBRARY_OPS or list(op.inputs) != list(sub.inputs) or \
            list(result) != list(sub.outputs):
        return None
    if op.name == "linear" and len(op.inputs) != (3 if op.attrs.get("has_bias") else 2):
        return None
    return op, bool(squeeze)


def native_eligible(program: Program) -> bool:
    """Whether the C++ launcher can run the program: kernels and library calls only, on a GPU,
    no in-place outputs, none that may be an argument, run-time scalars only straight from the
    arguments."""
    return (program.device.type == "cuda" and not program.aliases and not program.scalar_ops
            and not program.may_share
            and all(isinstance(s, (Launch, LibraryCall)) for s in program.steps))


def native_program(program: Program) -> Any:
    from fusecut.runtime.launcher import native

    module = native()
    return module.run, native_capsule(module, program, driver_functions(program.context), 1)


def native_capsule(module, program: Program, driver: tuple[int, int, int, int],
                   device_type: int) -> Any:
    """Describe ``program`` to the C++ launcher. ``driver``: the addresses of cuLaunchKernel,
    cuCtxGetCurrent and cuCtxSetCurrent and the kernels' context (0s: no context handling);
    ``device_type``: c10's, 0 CPU, 1 CUDA."""
    inputs = input_specs(program.signature)
    buffers = [(shape or (), SCALAR_TYPE.get(dtype, 0)) for shape, dtype in program.buffers]
    launches = []
    for s in program.steps:
        if isinstance(s, LibraryCall):
            launches.append((0, (0, 0, 0), (0, 0, 0), 0, [], [], list(s.frees),
                             (LIBRARY_OPS[s.op], list(s.inputs), s.output,
                              SCALAR_TYPE[s.dtype])))
            continue
        k = s.kernel
        shape = (k.address, tuple(k.grid), tuple(k.block), k.smem) if k is not None else \
            (0, (0, 0, 0), (0, 0, 0), 0)
        launches.append((*shape, list(s.params), list(s.allocs), list(s.frees), None))
    outputs = []
    for slot, shape, broadcast in program.outputs:
        if shape is None:
            outputs.append((slot, None, None))
        else:
            outputs.append((slot, tuple(shape), expanded_strides(shape, broadcast)))
    index = program.device.index if program.device.index is not None else -1
    return module.make(driver, device_type, index, inputs, buffers, launches, outputs)


def input_specs(sig: tuple) -> list[tuple]:
    """A signature as the launcher's ``make``/``make_host`` take it."""
    inputs = []
    for key in sig:
        if isinstance(key, tuple) and len(key) == 5:
            shape, strides, dtype, _, align = key
            inputs.append(("tensor", tuple(shape), tuple(strides), SCALAR_TYPE[dtype], align))
        elif isinstance(key, tuple):
            inputs.append(("scalar", key[0], key[1]))
        else:
            inputs.append(("scalar", key, None))
    return inputs


def expanded_strides(shape, broadcast) -> tuple[int, ...]:
    """Strides that view a dense compact tensor at ``shape``: 0 on broadcast axes."""
    strides, acc = [], 1
    for extent, b in zip(reversed(shape), reversed(broadcast)):
        strides.append(0 if b else acc)
        acc *= 1 if b else extent
    return tuple(reversed(strides))
