"""The Plan: segments in execution order, the tensors that cross between them, their bytes, and
the host program that runs them when axes are stream-parallel.

``assemble`` turns an ordered segmentation (placed ops and written tensors per segment) into
segments and boundaries, checking what every consumer of a plan relies on: each segment classifies
as a kind, reads only fusion inputs and tensors an earlier segment wrote, and every fusion output
is written once. ``optimizer.plan.build.build_plan`` makes the whole Plan, host program included.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from fusecut.optimizer.analysis.cost import lower_bound_bytes, read_bytes, segment_time, write_bytes
from fusecut.optimizer.analysis.opclass import Role, role
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.analysis.streams import Stage
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.gcpause import gc_paused
from fusecut.optimizer.ir.printer import print_fusion
from fusecut.optimizer.ir.rng import as_written
from fusecut.optimizer.ir.wire import fusion_id, fusion_to_json, meta_to_json
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.plan.subfusion import SubFusion, translate
from fusecut.optimizer.profiles import DeviceProfile
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.result import Group, SolverReport
from fusecut.version import __version__


@dataclass
class Segment:
    """One kernel (or library call) of a plan: its schedule (kind, ops, tensors read and
    written), the ops it recomputes that another segment also computes, its bytes and estimated
    time (``optimizer.analysis.cost``), and its sub-fusion (a standalone fusion definition)."""

    index: int
    schedule: Schedule
    recomputed_ops: tuple[int, ...]
    read_bytes: int
    write_bytes: int
    est_time_s: float
    sub: SubFusion

    @property
    def kind(self):
        return self.schedule.kind


@dataclass
class Boundary:
    """A tensor one segment (``producer``) writes to global memory and later ones read."""

    tensor: str
    producer: int
    consumers: tuple[int, ...]


@dataclass
class Baseline:
    """The greedy (nvFuser-style) plan's totals, reported beside an optimised plan."""

    segmenter: str
    io_bytes: int
    segments: int
    est_time_s: float


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
    """How a plan with stream-parallel axes runs (``optimizer.plan.lower``): its steps in order,
    the streams its loops cycle through, and the program as text."""

    steps: list[Step]
    num_streams: int
    text: str

    @property
    def loops(self) -> int:
        return sum(1 for s in self.steps if s.is_loop)


@dataclass
class Plan:
    """A segmentation of one fusion for given inputs, options and device: ``segments`` in
    execution order, the ``boundaries`` between them, how it was found (``solver``), the greedy
    ``baseline``, and the ``host`` program when axes are stream-parallel (None otherwise). Made
    by ``optimizer.plan.build.build_plan``; its wire form is ``plan_json``."""

    bound: Bound
    profile: DeviceProfile
    segmenter: str
    segments: list[Segment]
    boundaries: list[Boundary]
    solver: SolverReport
    baseline: Baseline | None
    options: dict[str, Any] = field(default_factory=dict)
    host: HostProgram | None = None
    # the plan whose segmentation this one is, bound to these inputs without a search
    # (``optimizer.plan.rebind``); None for a plan searched for them
    rebound_from: str | None = None
    # the extents a caller asked for as symbolic (-1), as (input position, axis): planned at a
    # stand-in size, the plan holds for any size of them (``optimizer.plan.rebind.
    # bind_symbolic``), and its id says so: () for a plan of concrete inputs
    symbolic: tuple[tuple[int, int], ...] = ()
    # what the runtime derives from the plan once and reuses on every run (its step list, the
    # scalar positions its kernels bake in), by name
    runtime_memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                         compare=False)

    @property
    def host_program(self) -> str | None:
        """The host program as text, in the style of nvFuser's host IR dumps."""
        return self.host.text if self.host is not None else None

    @property
    def fusion(self):
        return self.bound.fusion

    @property
    def io_bytes(self) -> int:
        return sum(s.read_bytes + s.write_bytes for s in self.segments)

    @property
    def lower_bound_bytes(self) -> int:
        return lower_bound_bytes(self.bound)

    @property
    def est_time_s(self) -> float:
        return sum(s.est_time_s for s in self.segments)

    @functools.cached_property
    def fusion_id(self) -> str:
        return fusion_id(as_written(self.fusion))  # the caller's fusion: see ir.rng

    @functools.cached_property
    def plan_id(self) -> str:
        searched = plan_id_of(self.bound, self.options, self.profile, self.fusion_id,
                              self.symbolic)
        if self.rebound_from is None:
            return searched
        # another segmentation than the search's may hold for the same inputs: its id says
        # whose it is, so that what is cached by plan id (kernels) never mixes the two
        return hashlib.sha256(f"{searched} rebound from {self.rebound_from}".encode()
                              ).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        with gc_paused():  # every container built here survives: see gcpause
            return plan_json(self)


# Plans (and the request keys that find them) are made by this version of fusecut: a plan
# cache shared by versions, or a new version on an old cache, never serves another's plan
# (issue 32: the key held no version).
VERSION = __version__


def plan_key(fid: str, metas: list[dict], options: dict, device: dict) -> str:
    """The cache key of a plan: fusecut's version, fusion id, input metadata, options and
    device profile."""
    blob = json.dumps({"fusecut": VERSION, "fusion": fid, "inputs": metas, "options": options,
                       "device": device}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def request_key(body: bytes) -> str:
    """The cache key of a request's bytes (a POST /v1/plan body, raw or normalized), for this
    version of fusecut."""
    return hashlib.sha256(f"fusecut {VERSION}\n".encode() + body).hexdigest()


def plan_id_of(bound: Bound, options: dict[str, Any], profile: DeviceProfile,
               fid: str | None = None, symbolic: tuple[tuple[int, int], ...] = ()) -> str:
    """The id of the plan of ``bound``'s fusion and inputs with these options and device (its
    ``symbolic`` extents as -1, whatever size stood in for them)."""
    return plan_key(fid or fusion_id(as_written(bound.fusion)),  # the caller's: see ir.rng
                    inputs_json([bound.inputs[n] for n in bound.fusion.caller_inputs()],
                                symbolic),
                    options, profile.to_json())


def inputs_json(metas: list, symbolic: tuple[tuple[int, int], ...] = ()) -> list[dict]:
    """Input metadata as a plan's key holds it: each ``symbolic`` (input, axis) extent as -1
    with the size searched at (``stand_in``: another stand-in, another search), and no strides
    on a tensor with one (such a tensor is dense: its strides follow)."""
    out = [meta_to_json(m) for m in metas]
    for i, axis in symbolic:
        out[i]["stand_in"] = out[i]["shape"][axis]
        out[i]["shape"][axis] = -1
        out[i].pop("strides", None)
    return out


def valid_for(plan: Plan) -> list[dict[str, Any]]:
    """Where a plan asked for with symbolic extents holds, per tensor input: each axis's
    extent, or ``{"min": 2, "max": null}`` for a symbolic one (an extent of 1 broadcasts, a
    plan of its own). Each run checks again that its segments schedule there as planned."""
    fusion = plan.fusion
    names = fusion.caller_inputs()
    out = []
    for i, name in enumerate(names):
        if name not in fusion.tensors:
            continue
        shape: list[Any] = list(plan.bound.inputs[name].shape)
        for j, axis in plan.symbolic:
            if j == i:
                shape[axis] = {"min": 2, "max": None}
        out.append({"input": name, "shape": shape})
    return out


def assemble(graph: SegGraph, groups: list[Group]) -> tuple[list[Segment], list[Boundary]]:
    """The segments and boundaries of an ordered segmentation; a PlanError when it is not a
    valid plan of ``graph``'s fusion."""
    bound, profile = graph.bound, graph.profile
    schedules: list[Schedule] = []
    for k, (ops, written) in enumerate(groups):
        sched = graph.classify(ops, written)
        if not sched:
            raise PlanError(f"segment {k} does not schedule: {sched.reason}")
        schedules.append(sched)
    check_segmentation(graph, schedules)
    counts: dict[int, int] = {}
    for s in schedules:
        for i in s.ops:
            counts[i] = counts.get(i, 0) + 1
    segments = []
    for k, s in enumerate(schedules):
        segments.append(Segment(
            index=k, schedule=s,
            recomputed_ops=tuple(i for i in s.ops if counts[i] > 1),
            read_bytes=read_bytes(bound, s), write_bytes=write_bytes(bound, s),
            est_time_s=segment_time(bound, s, profile), sub=translate(bound, s)))
    readers_of: dict[str, list[int]] = {}
    for j, s in enumerate(schedules):
        for t in s.inputs:
            readers_of.setdefault(t, []).append(j)
    boundaries = []
    for k, s in enumerate(schedules):
        for t in s.outputs:
            readers = tuple(readers_of.get(t, ()))
            if readers:
                boundaries.append(Boundary(t, k, readers))
    return segments, boundaries


def check_segmentation(graph: SegGraph, schedules: list[Schedule]) -> None:
    """Reads only what was written before; every output written exactly once."""
    written: dict[str, int] = {}
    for k, s in enumerate(schedules):
        for t in s.inputs:
            if t not in graph.inputs and t not in written:
                raise PlanError(f"segment {k} reads {t} before any segment writes it")
        for t in s.outputs:
            if t in written and t in graph.outputs:
                raise PlanError(f"fusion output {t} is written twice (segments {written[t]}, "
                                f"{k})")
            written.setdefault(t, k)
    for t in graph.outputs:
        if t not in written and t not in graph.inputs:
            raise PlanError(f"fusion output {t} is never written")


def _tensor_json(bound: Bound, t: str) -> dict[str, Any]:
    return {"tensor": t, "shape": list(bound.shapes[t]),
            "compact_shape": list(bound.compact_shape(t)),
            "dtype": bound.fusion.tensors[t].dtype.value, "bytes": bound.nbytes(t)}


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as the service and the SDK send it (see DESIGN.md, "Plan output")."""
    bound = plan.bound
    fusion = plan.fusion
    lb = plan.lower_bound_bytes
    io = plan.io_bytes
    why = _crossing_reasons(plan)
    segments = []
    for s in plan.segments:
        sub = s.sub
        segments.append({
            "index": s.index, "kind": s.kind.value, "ops": list(s.schedule.ops),
            "recomputed_ops": list(s.recomputed_ops),
            "inputs": [_tensor_json(bound, t) for t in s.schedule.inputs],
            "outputs": [_tensor_json(bound, t) for t in s.schedule.outputs],
            "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
            "est_time_s": s.est_time_s,
            "definition_json": fusion_to_json(sub.fusion),
            "definition_py": print_fusion(sub.fusion, name=f"nvfuser_fusion_segment{s.index}",
                                          inputs=sub.inputs),
            "input_map": sub.input_map, "output_map": sub.output_map,
        })
    base = plan.baseline
    return {
        "plan_id": plan.plan_id,
        "fusion_id": plan.fusion_id,
        "segmenter": plan.segmenter,
        "solver": {"status": plan.solver.status, "objective": plan.solver.objective,
                   "bound": plan.solver.bound, "wall_s": plan.solver.wall_s,
                   "message": plan.solver.message},
        "device": plan.profile.to_json(),
        "options": plan.options,
        "ops": [{"index": i, "name": op.name, "inputs": list(op.inputs),
                 "outputs": list(op.outputs)} for i, op in enumerate(fusion.ops)],
        "segments": segments,
        "fusion_inputs": [t for t in fusion.inputs if t in fusion.tensors],
        "fusion_outputs": list(fusion.outputs),
        "boundaries": [dict(_tensor_json(bound, b.tensor), producer=b.producer,
                            consumers=list(b.consumers), reason=why(b.tensor))
                       for b in plan.boundaries],
        "totals": {"io_bytes": io, "lower_bound_bytes": lb,
                   "io_ratio": io / lb if lb else 1.0, "segments": len(plan.segments),
                   "est_time_s": plan.est_time_s,
                   "floor_s": lb / plan.profile.bandwidth},
        "baseline": None if base is None else {
            "segmenter": base.segmenter, "io_bytes": base.io_bytes, "segments": base.segments,
            "est_time_s": base.est_time_s, "saved_bytes": base.io_bytes - io},
        "host_program": plan.host_program,
    } | ({"rebound_from": plan.rebound_from} if plan.rebound_from else {}) | (
        {"symbolic": [list(s) for s in plan.symbolic], "valid_for": valid_for(plan)}
        if plan.symbolic else {})


def _crossing_reasons(plan: Plan):
    """A function giving why a boundary tensor goes through global memory instead of being
    recomputed (indexes the fusion once, so that every boundary costs O(1))."""
    fusion = plan.fusion
    producers = {o: op for op in fusion.ops for o in op.outputs}
    forced = {op.inputs[0] for op in fusion.ops if op.name == "segment_set" and op.inputs}
    return lambda tensor: _why_crossing(plan, producers[tensor], tensor in forced)


def _why_crossing(plan: Plan, producer, forced: bool) -> str:
    if forced:
        return "forced by segment_set"
    kind = role(producer, plan.bound)
    if kind is Role.REDUCTION:
        return "a reduction result: recomputing it would re-read and re-reduce its input"
    if kind is Role.LIBRARY:
        return "the result of a library call (matmul/linear)"
    if kind is Role.FALLBACK:
        return "the result of an op without a generated kernel"
    return "cheaper to pass than to recompute from what the consumer reads"
