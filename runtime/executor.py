"""Run a Plan on real tensors, segment by segment, in plan order.

The original fusion acts as argument manager (seed 001): each segment receives its inputs (fusion
inputs as given, boundary tensors in the compact form the producing segment wrote), runs, and its
compact outputs are kept until their last reader; fusion outputs are returned as views with
stride 0 along their broadcast axes. A segment runs through a ``SegmentRunner``: generated CUDA
kernels on a GPU, the torch reference (its CPU path, and library/fallback segments everywhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from optimizer.analysis.shapes import bind
from optimizer.errors import InputError
from optimizer.ir.inputs import TensorMeta
from optimizer.plan.plan import Plan, Segment
from runtime.reference import run_reference
from runtime.tensors import TORCH_DTYPE, meta_of

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

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.timings)


def reference_runner(plan: Plan, segment: Segment, args: list[Any],
                     scalars: dict[str, Any]) -> list[torch.Tensor]:
    return run_reference(segment.sub.fusion, args)


def check_matches_plan(plan: Plan, args: list[Any]) -> dict[str, Any]:
    """Scalar values of these arguments, after checking they match the plan's input metadata
    (a fast comparison; scalar values are re-derived only when the fusion has scalar inputs)."""
    fusion = plan.fusion
    if len(args) != len(fusion.inputs):
        raise InputError(f"the plan takes {len(fusion.inputs)} inputs, got {len(args)}")
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


def _lifetimes(plan: Plan) -> tuple[dict[str, int], set[str]]:
    """The last segment reading each tensor, and the tensors never freed (computed once)."""
    cached = getattr(plan, "_lifetimes", None)
    if cached is None:
        last_read: dict[str, int] = {}
        for seg in plan.segments:
            for t in seg.schedule.inputs:
                last_read[t] = seg.index
        cached = (last_read, set(plan.fusion.outputs) | set(plan.fusion.inputs))
        plan._lifetimes = cached  # type: ignore[attr-defined]
    return cached


def execute_plan(plan: Plan, args: list[Any], runner: SegmentRunner = reference_runner,
                 backend: str = "reference", timed: bool = False) -> Execution:
    scalars = check_matches_plan(plan, args)
    fusion, bound = plan.fusion, plan.bound
    env: dict[str, Any] = dict(zip(fusion.inputs, args))
    last_read, keep = _lifetimes(plan)
    timings = []
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    for seg in plan.segments:
        sub = seg.sub
        seg_args = []
        for name in sub.fusion.inputs:
            original = sub.input_map[name]
            seg_args.append(env[original] if original in fusion.tensors else scalars[original])
        start = time.perf_counter()
        if timed and cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        outs = runner(plan, seg, seg_args, scalars)
        if timed and cuda:
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - start
        timings.append(SegmentTiming(seg.index, seg.kind.value, seconds,
                                     seg.read_bytes + seg.write_bytes, backend))
        for name, value in zip(sub.fusion.outputs, outs):
            env[sub.output_map[name]] = value
        for t in seg.schedule.inputs:  # free boundary tensors after their last reader
            if last_read.get(t) == seg.index and t not in keep:
                env.pop(t, None)
    outputs = []
    for t in fusion.outputs:
        value = env[t]
        if value.shape != bound.shapes[t]:
            value = expand_compact(value, bound.shapes[t], bound.broadcast[t])
        outputs.append(value)
    for out, inp in fusion.aliases.items():
        env[inp].copy_(outputs[fusion.outputs.index(out)])
    return Execution(outputs, timings)
