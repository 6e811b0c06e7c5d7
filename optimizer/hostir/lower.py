"""Lower a plan with stream-parallel axes to a host program (seed 004).

The host program runs the plan's stages in order. A stage that is not stream-parallel runs its
segments once, on whole tensors. A stream loop allocates what it writes for later stages and the
caller (whole tensors, once), then for each index ``i`` of the stream axis runs its segments on
slice ``i`` of every operand and of every allocation: aliasing views, never copies. Each of its
segments is planned again for the slice's sizes (the stream axis has extent 1 there), with the
segment's ops and boundaries unchanged, so the loop body runs the plan's own segments.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from optimizer.analysis.shapes import Bound, bind
from optimizer.errors import PlanError
from optimizer.hostir.streams import Stage, stream_stages
from optimizer.hostir.text import print_host_program
from optimizer.ir.inputs import TensorMeta, contiguous_strides
from optimizer.plan.plan import Baseline, Plan, SolverReport, build_plan
from optimizer.schedulers.kinds import Kind
from optimizer.segmenters.graph import SegGraph
from optimizer.segmenters.greedy import greedy_groups


@dataclass
class Step:
    """One stage of the host program: its segments (plan indices, in order), each planned alone
    for the sizes it runs at."""

    stage: Stage
    segments: list[int]
    plans: dict[int, Plan] = field(default_factory=dict)  # segment index -> its plan
    # stream loops only: tensor -> the stored axis a slice takes (None: read whole), for every
    # tensor the body reads from outside or writes for later
    slices: dict[str, int | None] = field(default_factory=dict)
    allocations: list[str] = field(default_factory=list)  # written whole before the loop

    @property
    def is_loop(self) -> bool:
        return self.stage.is_loop


@dataclass
class HostProgram:
    steps: list[Step]
    num_streams: int
    text: str = ""

    @property
    def loops(self) -> int:
        return sum(1 for s in self.steps if s.is_loop)


def stored_axis(bound: Bound, tensor: str, axis: int | None) -> int | None:
    """The axis of ``tensor`` as it is stored between segments (fusion inputs as given, others
    compact: broadcast axes dropped); None when it is not stored (read whole)."""
    if axis is None or bound.broadcast[tensor][axis]:
        return None
    if tensor in bound.inputs:
        return axis
    return sum(1 for b in bound.broadcast[tensor][:axis] if not b)


def build_lowered_plan(graph: SegGraph, groups: list, segmenter: str, solver: SolverReport,
                       baseline: Baseline | None, options: dict[str, Any]) -> Plan:
    """``build_plan``; when axes are stream-parallel, with the segments in stage order (stable: a
    stage's segments run together, inside its loop) and the plan's host program."""
    if not graph.stage_of:
        return build_plan(graph, groups, segmenter, solver, baseline, options)
    groups = sorted(groups, key=lambda g: min(graph.stage_of[i] for i in g[0]))
    plan = build_plan(graph, groups, segmenter, solver, baseline, options)
    plan.host = lower(plan, graph)
    return plan


def lower(plan: Plan, graph: SegGraph) -> HostProgram:
    """The host program of ``plan`` (whose segments are in stage order)."""
    bound = plan.bound
    stages = stream_stages(bound)
    stage_of = graph.stage_of
    fusion = plan.fusion
    steps: list[Step] = []
    for seg in plan.segments:
        stage = stages[stage_of[seg.schedule.ops[0]]]
        if not steps or steps[-1].stage.index != stage.index:
            steps.append(Step(stage, []))
        steps[-1].segments.append(seg.index)
    readers: dict[str, set[int]] = {}  # tensor -> steps reading it
    for k, step in enumerate(steps):
        for j in step.segments:
            for t in plan.segments[j].schedule.inputs:
                readers.setdefault(t, set()).add(k)
    for k, step in enumerate(steps):
        if not step.is_loop:
            for j in step.segments:
                step.plans[j] = segment_plan(plan, plan.segments[j], {})
            continue
        written = {t for j in step.segments for t in plan.segments[j].schedule.outputs}
        step.allocations = [t for t in _in_order(plan, step, "outputs")
                            if t in fusion.outputs or readers.get(t, set()) - {k}]
        outside = [t for t in _in_order(plan, step, "inputs") if t not in written]
        for t in outside + step.allocations:
            step.slices[t] = stored_axis(bound, t, step.stage.axes.get(t))
        for j in step.segments:
            step.plans[j] = segment_plan(plan, plan.segments[j], step.stage.axes,
                                         set(step.slices))
    host = HostProgram(steps, int(plan.options.get("num_streams", 4)))
    host.text = print_host_program(plan, host)
    return host


def _in_order(plan, step: Step, what: str) -> list[str]:
    return list(dict.fromkeys(t for j in step.segments
                              for t in getattr(plan.segments[j].schedule, what)))


def segment_plan(plan: Plan, segment, axes: dict[str, int | None], views: set[str] = frozenset()):
    """``segment`` planned alone: at the plan's sizes, or (``axes``: the loop's stream axes by
    tensor) at the sizes of one slice, where each stream axis has extent 1. Slices of ``views``
    are views into whole tensors (their strides); other sliced tensors live within an iteration,
    dense."""
    sub = segment.sub
    fusion, metas = sub.fusion, list(sub.inputs)
    if axes:
        fusion = copy.deepcopy(fusion)
        for k, name in enumerate(fusion.inputs):
            original = sub.input_map[name]
            if original not in plan.fusion.tensors:
                continue
            axis = stored_axis(plan.bound, original, axes.get(original))
            if axis is None:
                continue
            meta = metas[k]
            shape = list(meta.shape)
            shape[axis] = 1
            strides = meta.strides if original in views else contiguous_strides(tuple(shape))
            metas[k] = TensorMeta(tuple(shape), strides, meta.dtype)
            declared = fusion.tensors[name].declared_shape
            if declared is not None:
                fusion.tensors[name].declared_shape = tuple(
                    -1 if a == axis else e for a, e in enumerate(declared))
        _slice_shape_attrs(fusion, axes)
    bound = bind(fusion, metas)
    kinds = frozenset(Kind(k) for k in plan.options.get("kinds", [k.value for k in Kind]))
    graph = SegGraph(bound, plan.profile, kinds)
    whole = frozenset(fusion.live_tensor_ops())
    report = SolverReport("FIXED", message=f"segment {segment.index} of plan {plan.plan_id}")
    try:
        return build_plan(graph, [(whole, frozenset(fusion.outputs))], "fixed", report, None,
                          plan.options)
    except PlanError:  # the slice does not schedule as one segment: segment it greedily
        groups = greedy_groups(graph)
        return build_plan(graph, list(zip(groups, graph.derive_writes(groups))), "greedy",
                          SolverReport("GREEDY", message=report.message), None, plan.options)


# ops whose attributes spell out their output's extents
_SHAPE_ATTRS = {"broadcast_in_dim": "shape", "expand": "shape", "reshape": "new_shape"}


def _slice_shape_attrs(fusion, axes: dict[str, int | None]) -> None:
    """Extents written into ops (``broadcast_in_dim(shape=[16, N])``) become 1 on the stream
    axis, as the slice has it."""
    for op in fusion.ops:
        attr = _SHAPE_ATTRS.get(op.name)
        axis = axes.get(op.outputs[0]) if attr else None
        if axis is None or op.attrs.get(attr) is None:
            continue
        shape = list(op.attrs[attr])
        if shape[axis] != -1:
            shape[axis] = 1
        op.attrs[attr] = shape
