"""Run a Plan on real tensors, segment by segment, in plan order.

The original fusion acts as argument manager of the standalone segment fusions: each segment
receives its inputs (fusion inputs as given, boundary tensors in the compact form the producing
segment wrote), runs, and its compact outputs are kept until their last reader; fusion outputs
are returned as views with stride 0 along their broadcast axes. A segment runs through a
``SegmentRunner``: generated CUDA kernels on a GPU, the torch reference (its CPU path, and
library/fallback segments everywhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from fusecut.optimizer.analysis.shapes import Bound, bind
from fusecut.optimizer.errors import FusecutError, InputError, counted
from fusecut.optimizer.ir.inputs import TensorMeta
from fusecut.optimizer.plan.plan import Plan, Segment
from fusecut.runtime.errors import OpFailed, OutOfMemory
from fusecut.runtime.lru import BoundedCache
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import TORCH_DTYPE, meta_of, unshare

# (plan, segment, the segment's arguments, host values of every scalar) -> its outputs
SegmentRunner = Callable[[Plan, Segment, list[Any], dict[str, Any]], list[torch.Tensor]]


@dataclass
class SegmentTiming:
    index: int
    kind: str
    seconds: float
    bytes: int
    backend: str


@dataclass
class Execution:
    outputs: list[torch.Tensor]
    timings: list[SegmentTiming] = field(default_factory=list)
    backend: str = "reference"  # "cuda" (generated kernels) or "reference" (torch)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.timings)


# What torch raises when it refuses an op (NotImplementedError is a RuntimeError; an integer
# division by zero is a RuntimeError("ZeroDivisionError"), a float overflow an OverflowError)
TORCH_ERRORS = (RuntimeError, IndexError, ValueError, TypeError, ArithmeticError)


def first_line(error: BaseException, limit: int = 300) -> str:
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[:limit] + "..."


def op_failure(plan: Plan, segment: Segment, args: list[Any], error: BaseException
               ) -> OpFailed:
    """``error``, raised running ``segment`` on ``args``, as an OpFailed naming the op: the
    segment is run again through the torch reference, op by op and recording what each made
    (the failure path only), and the first op that made nothing is the one. When the reference
    runs it (the error came from a generated kernel), the segment and its ops are named."""
    fusion, sub = plan.fusion, segment.sub.fusion
    made: dict[str, Any] = {}
    try:
        run_reference(sub, args, segment_bound(plan, segment), trace=made)
        failing = None
    except Exception:  # the same error, or another one on the way to it
        failing = next((op for op in sub.ops if not all(o in sub.scalars for o in op.outputs)
                        and not all(o in made for o in op.outputs)), None)
    del made
    where = f"segment {segment.index} ({segment.kind.value})"
    if failing is not None:
        index = next((i for i in segment.schedule.ops
                      if set(fusion.ops[i].outputs) & set(failing.outputs)), None)
        op = fusion.ops[index] if index is not None else failing

        def typed(names: tuple[str, ...]) -> str:
            return ", ".join(f"{n}: {fusion.value_dtype(n).value}"
                             if n in fusion.tensors or n in fusion.scalars else n for n in names)

        label = f"op {index} {op.name}" if index is not None else op.name
        where = f"{label}({typed(op.inputs)}) -> {typed(op.outputs)}, in {where},"
    else:
        names = ", ".join(f"{i} {fusion.ops[i].name}" for i in segment.schedule.ops[:8])
        more = ", ..." if len(segment.schedule.ops) > 8 else ""
        where = f"{where} (ops {names}{more})"
    if isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error):
        return OutOfMemory(f"{where} ran out of memory: {first_line(error)}")
    return OpFailed(f"{where} failed: torch refused it: {first_line(error)}")


MAX_SEGMENT_BOUNDS = 1024
_bounds: BoundedCache[tuple[str, int], Bound] = BoundedCache(MAX_SEGMENT_BOUNDS)


def segment_bound(plan: Plan, segment: Segment) -> Bound | None:
    """A segment's sub-fusion bound to its sizes, once (they are fixed by the plan); None when
    it has scalar inputs, whose values come with each call."""
    if segment.sub.fusion.scalar_inputs():
        return None
    key = (plan.plan_id, segment.index)
    bound = _bounds.get(key)
    if bound is None:
        bound = bind(segment.sub.fusion, segment.sub.inputs)
        _bounds.put(key, bound)
    return bound


def reference_runner(plan: Plan, segment: Segment, args: list[Any],
                     scalars: dict[str, Any]) -> list[torch.Tensor]:
    return run_reference(segment.sub.fusion, args, segment_bound(plan, segment))


def check_matches_plan(plan: Plan, args: list[Any]) -> dict[str, Any]:
    """Scalar values of these arguments, after checking they match the plan's input metadata
    (a fast comparison; scalar values are re-derived only when the fusion has scalar inputs)."""
    fusion = plan.fusion
    if len(args) != len(fusion.inputs):
        raise InputError(f"the plan takes {counted(len(fusion.inputs), 'input')}, got {len(args)}")
    for name, value in zip(fusion.inputs, args):
        planned = plan.bound.inputs[name]
        if not isinstance(planned, TensorMeta):
            continue
        if not isinstance(value, torch.Tensor):
            raise InputError(f"input {name} must be a tensor, got {type(value).__name__}")
        if (tuple(value.shape) != planned.shape or tuple(value.stride()) != planned.strides
                or TORCH_DTYPE[planned.dtype] != value.dtype):
            raise InputError(f"input {name} has shape {list(value.shape)}, strides "
                             f"{list(value.stride())} and dtype {value.dtype}; the plan was made "
                             f"for shape {list(planned.shape)}, strides {list(planned.strides)} "
                             f"and dtype {planned.dtype.value}")
    if not fusion.scalar_inputs():
        return plan.bound.scalars
    return bind(fusion, [meta_of(a) for a in args]).scalars


def expand_compact(tensor: torch.Tensor, shape: tuple[int, ...],
                   broadcast: tuple[bool, ...]) -> torch.Tensor:
    """A compact (broadcast axes dropped) tensor viewed at its logical shape."""
    view = [1 if b else e for e, b in zip(shape, broadcast)]
    return tensor.reshape(view).expand(shape)


@dataclass
class _Steps:
    """What executing a plan needs, derived once per plan: for each segment its argument
    sources (original name, is a tensor), the names of what it returns, and the tensors whose
    last reader it is; for each fusion output whether it comes back compact."""

    segments: list[tuple[Segment, list[tuple[str, bool]], list[str], list[str]]]
    expand: list[tuple[int, tuple[int, ...], tuple[bool, ...]] | None]


def plan_steps(plan: Plan) -> _Steps:
    """What running ``plan`` needs, derived once per plan."""
    cached = plan.runtime_memo.get("steps")
    if cached is not None:
        return cached
    fusion, bound = plan.fusion, plan.bound
    last_read: dict[str, int] = {}
    for seg in plan.segments:
        for t in seg.schedule.inputs:
            last_read[t] = seg.index
    keep = set(fusion.outputs) | set(fusion.inputs)
    segments = []
    for seg in plan.segments:
        sub = seg.sub
        sources = [(sub.input_map[n], sub.input_map[n] in fusion.tensors)
                   for n in sub.fusion.inputs]
        returned = [sub.output_map[n] for n in sub.fusion.outputs]
        frees = [t for t in seg.schedule.inputs if last_read[t] == seg.index and t not in keep]
        segments.append((seg, sources, returned, frees))
    expand = []
    for t in fusion.outputs:
        # fusion inputs come at their logical shape already (stride 0 on expanded axes)
        compact = t not in bound.inputs and \
            tuple(bound.compact_shape(t)) != tuple(bound.shapes[t])
        expand.append((0, bound.shapes[t], bound.broadcast[t]) if compact else None)
    steps = _Steps(segments, expand)
    plan.runtime_memo["steps"] = steps
    return steps


def time_call(fn: Callable[[], Any], cuda: bool) -> tuple[Any, float]:
    """``fn()`` and the seconds it took: CUDA events on a GPU (which synchronises), the host
    clock otherwise."""
    if not cuda:
        start = time.perf_counter()
        return fn(), time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    result = fn()
    end.record()
    end.synchronize()
    return result, begin.elapsed_time(end) / 1e3


def execute_plan(plan: Plan, args: list[Any], runner: SegmentRunner = reference_runner,
                 backend: str = "reference", timed: bool = False) -> Execution:
    """Run the plan on ``args``; with ``timed``, measure each segment (CUDA events on a GPU,
    which synchronises after each segment)."""
    scalars = check_matches_plan(plan, args)
    fusion = plan.fusion
    steps = plan_steps(plan)
    env: dict[str, Any] = dict(zip(fusion.inputs, args))
    timings = []
    cuda = timed and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    for seg, sources, returned, frees in steps.segments:
        seg_args = [env[name] if is_tensor else scalars[name] for name, is_tensor in sources]
        try:
            if timed:
                outs, seconds = time_call(partial(runner, plan, seg, seg_args, scalars), cuda)
                timings.append(SegmentTiming(seg.index, seg.kind.value, seconds,
                                             seg.read_bytes + seg.write_bytes, backend))
            else:
                outs = runner(plan, seg, seg_args, scalars)
        except FusecutError:
            raise
        except TORCH_ERRORS as e:  # torch refused an op: say which, not a traceback
            raise op_failure(plan, seg, seg_args, e) from None
        for name, value in zip(returned, outs):
            env[name] = value
        for t in frees:  # boundary tensors die after their last reader
            del env[t]
    outputs = []
    for t, how in zip(fusion.outputs, steps.expand):
        value = env[t]
        outputs.append(value if how is None else expand_compact(value, how[1], how[2]))
    for out, inp in fusion.aliases.items():  # in-place updates first: an output that is the
        env[inp].copy_(outputs[fusion.outputs.index(out)])  # input shows its new values
    unshare(outputs, args)
    return Execution(outputs, timings, backend)
