"""A stream-lowered host program described to the C++ launcher, so its loops run there.

The description is plain tuples (``make_host`` in fusecut/runtime/native/launcher.cpp): the host
program's signature, its values (fusion inputs first, then every tensor a segment reads or
writes, by id), its steps (a loop's extent and whole allocations; per segment its compiled
program and where each argument and output lives: a value whole, or its slice at the iteration,
or a scalar argument), its outputs, and the stream pool with its events.

It is built from a first run in Python (``runtime.streams``), which notes the program every
segment ran. The C++ loop checks only the host program's arguments, so it is used only where
that fixes everything else: one program served every iteration of each segment (slices of the
same alignment), each program runs in C++ (kernels and library calls on a GPU), scalars come
straight from the arguments, and nothing is updated in place or returned as an argument.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fusecut.optimizer.plan.plan import Plan
from fusecut.runtime.executor import plan_steps
from fusecut.runtime.program import (
    SCALAR_TYPE,
    Launch,
    Program,
    baked_positions,
    input_specs,
    native_eligible,
    native_program,
    signature,
)
from fusecut.runtime.stream_pool import entry_event, events_pool, segment_io
from fusecut.runtime.tensors import TORCH_DTYPE

WHOLE, SLICE, SCALAR = 0, 1, 2  # where a program argument comes from (ArgRef in the launcher)


@dataclass
class HostDescription:
    inputs: list[tuple]
    values: int
    steps: list[tuple]
    outputs: list[tuple]


def describe(plan: Plan, args: list[Any], used: dict[tuple[int, int], list[Program]],
             capsule_of: Callable[[Program], Any]) -> HostDescription | str:
    """The launcher's description of ``plan``'s host program for arguments like ``args``
    (implicit random seeds included), given the programs each (step, segment) ran; or why the
    C++ loop cannot run it (see the module's note). ``capsule_of``: a program's launcher
    capsule, or None where it cannot run in C++."""

    fusion = plan.fusion
    position = {name: i for i, name in enumerate(fusion.inputs)}
    if fusion.aliases or any(t in position for t in fusion.outputs):
        return "an output updates or is an argument"
    ids = dict(position)

    def value(name: str) -> int:
        return ids.setdefault(name, len(ids))

    steps = []
    for k, step in enumerate(plan.host.steps):
        loop = step.is_loop
        allocated = set(step.allocations) if loop else set()

        slices = step.slices if loop else {}
        calls = []
        for j in step.segments:
            programs = used.get((k, j), [])
            if len(programs) != 1:
                return f"segment {j} ran {len(programs)} programs, not one"
            capsule = capsule_of(programs[0])
            if capsule is None:
                p = programs[0]
                return (f"segment {j}'s program does not run in C++ (on {p.device}: "
                        f"{', '.join(sorted({type(s).__name__ for s in p.steps}))}"
                        f"{', outputs may share an argument' if p.may_share else ''})")
            sources, names = segment_io(plan, j)
            refs = []
            for name, is_tensor in sources:
                if not is_tensor and name not in position:
                    return f"segment {j} reads {name}, a scalar derived on the host"
                refs.append(_ref(slices, name, value(name)) if is_tensor
                            else (SCALAR, position[name], 0))
            targets = [_ref(slices, t, value(t)) if t in allocated else None for t in names]
            results = [-1 if t in allocated else value(t) for t in names]
            pointers = loop and _pointer_form(plan, programs[0], names, allocated, slices)
            calls.append((capsule, refs, results, targets, pointers))
        allocs = [(value(t), list(plan.bound.compact_shape(t)),
                   SCALAR_TYPE[TORCH_DTYPE[fusion.tensors[t].dtype]])
                  for t in step.allocations] if loop else []
        steps.append((step.stage.extent if loop else 0, allocs, calls))
    outputs = []
    for t, how in zip(fusion.outputs, plan_steps(plan).expand):
        if how is None:
            outputs.append((value(t), None, None))
        else:
            _, shape, broadcast = how
            outputs.append((value(t), [1 if b else e for e, b in zip(shape, broadcast)],
                            list(shape)))
    sig = signature(args, baked_positions(fusion))
    return HostDescription(input_specs(sig), len(ids), steps, outputs)


def _pointer_form(plan: Plan, program: Program, names: list[str], allocated: set[str],
                  slices: dict[str, int | None]) -> bool:
    """Whether a loop's program can run on addresses alone: kernels only, and each output it
    writes to a slice of an allocation written there in place (as ``Program._provided`` and the
    launcher's ``as_target`` decide: the slice dense, of the buffer's dtype and size)."""
    if not all(isinstance(s, Launch) for s in program.steps):
        return False
    kernel_buffers = {b for s in program.steps for b in s.allocs}
    for t, (slot, _, _) in zip(names, program.outputs):
        if t not in allocated:
            continue
        if slot not in kernel_buffers:
            return False
        shape, dtype = program.buffers[slot - program.n_args]
        whole = torch.empty(plan.bound.compact_shape(t), device="meta",
                            dtype=TORCH_DTYPE[plan.fusion.tensors[t].dtype])
        axis = slices.get(t)
        target = whole if axis is None else whole.narrow(axis, 0, 1)
        if target.dtype != dtype or not target.is_contiguous() or \
                target.numel() != torch.Size(shape).numel():
            return False
    return True


def _ref(slices: dict[str, int | None], name: str, value: int) -> tuple[int, int, int]:
    """A value whole, or its slice at the iteration when the loop slices it."""
    axis = slices.get(name)
    return (WHOLE, value, 0) if axis is None else (SLICE, value, axis)


def host_capsule(module, description: HostDescription, functions: tuple[int, int],
                 device: torch.device, pool: list[tuple[int, int, int, int, int]],
                 entry: int) -> Any:
    """``make_host`` of a description. ``functions``: cuEventRecord's and cuStreamWaitEvent's
    addresses; ``pool``: per stream (handle, stream_id, device_index, device_type, done event);
    ``entry``: the event loops record on the caller's stream."""
    device_type = 1 if device.type == "cuda" else 0
    index = device.index if device.index is not None else -1
    d = description
    return module.make_host(functions, device_type, index, d.inputs, d.values, d.steps,
                            d.outputs, pool, entry)


def event_functions() -> tuple[int, int]:
    """cuEventRecord and cuStreamWaitEvent in the driver library that cuda-python uses."""
    lib = ctypes.CDLL("libcuda.so.1")
    return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                 for name in ("cuEventRecord", "cuStreamWaitEvent"))


def _capsule(program: Program) -> Any:
    if program.native is None and native_eligible(program):
        program.native, program.native_ready = native_program(program), None
    return program.native[1] if program.native is not None else None


def native_host_call(plan: Plan, args: list[Any], used: dict) -> tuple | str:
    """(the launcher's run_host, the host program's capsule, its device) for later calls with
    arguments like ``args`` (a GPU run's, after it filled ``used``), or why Python runs it."""
    from fusecut.runtime import launcher

    module = launcher.native()
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if module is None or device is None:
        return "no launcher" if module is None else "no GPU"
    with torch.cuda.device(device):
        description = describe(plan, args, used, _capsule)
        if isinstance(description, str):
            return description
        pool = [(s.cuda_stream, s.stream_id, s.device_index, s.device_type, e.cuda_event)
                for s, e in events_pool(device, plan.host.num_streams)]
        capsule = host_capsule(module, description, event_functions(), device, pool,
                               entry_event(device).cuda_event)
    return module.run_host, capsule, device
