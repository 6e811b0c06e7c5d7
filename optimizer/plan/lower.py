"""Lower a plan's segments with stream-parallel axes to a host program.

The host program runs the plan's stages in order. A stage that is not stream-parallel runs its
segments once, on whole tensors. A stream loop allocates what it writes for later stages and the
caller (whole tensors, once), then for each index ``i`` of the stream axis runs its segments on
slice ``i`` of every operand and of every allocation: aliasing views, never copies. Each of its
segments is planned again for the slice's sizes (the stream axis has extent 1 there), with the
segment's ops and boundaries unchanged, so the loop body runs the plan's own segments.
"""

from __future__ import annotations

import copy
from typing import Any

from fusecut.optimizer.analysis.shapes import Bound, bind
from fusecut.optimizer.analysis.streams import stream_stages
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.inputs import TensorMeta, contiguous_strides
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.options import KINDS, NUM_STREAMS
from fusecut.optimizer.plan.host_text import print_host_program
from fusecut.optimizer.plan.plan import HostProgram, Plan, Segment, Step, assemble
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.greedy import greedy_groups
from fusecut.optimizer.segmenters.result import SolverReport


def stored_axis(bound: Bound, tensor: str, axis: int | None) -> int | None:
    """The axis of ``tensor`` as it is stored between segments (fusion inputs as given, others
    compact: broadcast axes dropped); None when it is not stored (read whole)."""
    if axis is None or bound.broadcast[tensor][axis]:
        return None
    if tensor in bound.inputs:
        return axis
    return sum(1 for b in bound.broadcast[tensor][:axis] if not b)


def lower(graph: SegGraph, segments: list[Segment], options: dict[str, Any], plan_id: str
          ) -> HostProgram:
    """The host program of a plan's ``segments`` (in stage order) for ``graph``."""
    bound = graph.bound
    stages = stream_stages(bound)
    stage_of = graph.stage_of
    fusion = bound.fusion
    steps: list[Step] = []
    for seg in segments:
        stage = stages[stage_of[seg.schedule.ops[0]]]
        if not steps or steps[-1].stage.index != stage.index:
            steps.append(Step(stage, []))
        steps[-1].segments.append(seg.index)
    readers: dict[str, set[int]] = {}  # tensor -> steps reading it
    for k, step in enumerate(steps):
        for j in step.segments:
            for t in segments[j].schedule.inputs:
                readers.setdefault(t, set()).add(k)
    for k, step in enumerate(steps):
        if not step.is_loop:
            for j in step.segments:
                step.plans[j] = segment_plan(graph, segments[j], options, plan_id, {})
            continue
        written = {t for j in step.segments for t in segments[j].schedule.outputs}
        step.allocations = [t for t in _in_order(segments, step, "outputs")
                            if t in fusion.outputs or readers.get(t, set()) - {k}]
        outside = [t for t in _in_order(segments, step, "inputs") if t not in written]
        for t in outside + step.allocations:
            step.slices[t] = stored_axis(bound, t, step.stage.axes.get(t))
        for j in step.segments:
            step.plans[j] = segment_plan(graph, segments[j], options, plan_id, step.stage.axes,
                                         set(step.slices))
    return HostProgram(steps, int(options.get("num_streams", NUM_STREAMS.default)),
                       print_host_program(bound, segments, steps))


def _in_order(segments: list[Segment], step: Step, what: str) -> list[str]:
    return list(dict.fromkeys(t for j in step.segments
                              for t in getattr(segments[j].schedule, what)))


def segment_plan(whole: SegGraph, segment: Segment, options: dict[str, Any], plan_id: str,
                 axes: dict[str, int | None], views: set[str] = frozenset()) -> Plan:
    """``segment`` of the plan ``plan_id`` (of ``whole``) planned alone: at the plan's sizes, or
    (``axes``: the loop's stream axes by tensor) at the sizes of one slice, where each stream axis
    has extent 1. Slices of ``views`` are views into whole tensors (their strides); other sliced
    tensors live within an iteration, dense."""
    sub = segment.sub
    fusion, metas = sub.fusion, list(sub.inputs)
    if axes:
        fusion = copy.deepcopy(fusion)
        for k, name in enumerate(fusion.inputs):
            original = sub.input_map[name]
            if original not in whole.fusion.tensors:
                continue
            axis = stored_axis(whole.bound, original, axes.get(original))
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
    kinds = frozenset(Kind(k) for k in options.get("kinds", KINDS.default))
    graph = SegGraph(bound, whole.profile, kinds)
    everything = frozenset(fusion.live_tensor_ops())
    report = SolverReport("FIXED", message=f"segment {segment.index} of plan {plan_id}")
    try:  # a sub-fusion has no stream axes: its plan has no host program
        return Plan(bound, graph.profile, "fixed",
                    *assemble(graph, [(everything, frozenset(fusion.outputs))]), report, None,
                    options)
    except PlanError:  # the slice does not schedule as one segment: segment it greedily
        groups = greedy_groups(graph)
        return Plan(bound, graph.profile, "greedy",
                    *assemble(graph, list(zip(groups, graph.derive_writes(groups)))),
                    SolverReport("GREEDY", message=report.message), None, options)


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
