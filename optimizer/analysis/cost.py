"""The cost model: every price the planner puts on a segment, in one place.

A segment reads each of its inputs once and writes each of its outputs once, all in compact form
(broadcast and stride-0 axes are not stored); an input that it reads only through gathers costs
the elements they select. Its estimated time is the larger of its memory time
(bytes over copy bandwidth) and its arithmetic time, plus a launch overhead per kernel. The lower
bound of a fusion reads every used input once and writes every output once.

The plan totals (``segment_time``, ``read_bytes``, ``write_bytes``), the CP-SAT objective
(``objective_kib``, ``launch_kib``, ``recompute_kib``) and the min-cut capacities
(``cut_capacity``) are priced here; the solvers' integer units are KiB of traffic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.optimizer.profiles import DeviceProfile

KIB = 1024
TENSOR_CORE_SPEEDUP = 15  # library calls (matmul/linear) against simple fp32 arithmetic
CUT_INFINITY = 1 << 50  # a min-cut capacity that no finite cut reaches


class PricedSegment(Protocol):
    """What the cost model reads off a segment (``optimizer.kinds.rules.Schedule``)."""

    ops: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    online: tuple[tuple[int, int], ...]  # (max op, sum op) pairs of one online accumulator

    @property
    def kernels(self) -> int: ...

    @property
    def on_tensor_cores(self) -> bool: ...


def op_cost(op: Op, bound: Bound) -> float:
    """Arithmetic of one evaluation of ``op`` over its output, in simple-op units."""
    spec = get_spec(op.name)
    out = op.outputs[0]
    if spec.op_class is OpClass.REDUCTION:
        return spec.cost * bound.numel(op.inputs[0])
    if spec.op_class is OpClass.LIBRARY:
        a, b = bound.shapes[op.inputs[0]], bound.shapes[op.inputs[1]]
        return 2.0 * bound.numel(out) * (a[-1] if a else 1) if b else 0.0
    return spec.cost * bound.numel(out)


def compute_units(bound: Bound, ops: Iterable[int]) -> float:
    """Arithmetic of ``ops`` (op indices), in simple-op units."""
    return sum(op_cost(bound.fusion.ops[i], bound) for i in ops)


# Arithmetic an online log-sum-exp accumulator adds per element over the two reductions and the
# ops it absorbs (a compare, at most one more exp and a multiply-add): it rescales its running
# sum as the maximum grows (``optimizer.kinds.online``).
RESCALE_COST = 6


def rescale_units(bound: Bound, online: Iterable[tuple[int, int]]) -> float:
    """Arithmetic of a segment's online (max op, sum op) pairs beyond their ops' own."""
    return sum(RESCALE_COST * bound.numel(bound.fusion.ops[m].inputs[0]) for m, _ in online)


def read_bytes(bound: Bound, segment: PricedSegment) -> int:
    """Bytes a segment reads from global memory: each input once, compact, or only the
    elements its gathers select (``gathered_elements``)."""
    partial = gathered_elements(bound, segment.ops, segment.outputs)
    return sum(input_bytes(bound, t, partial) for t in segment.inputs)


def input_bytes(bound: Bound, tensor: str, partial: Mapping[str, int]) -> int:
    """Bytes reading ``tensor`` moves: compact, or its ``partial`` elements where fewer."""
    full = bound.nbytes(tensor)
    if tensor not in partial:
        return full
    return min(full, bound.fusion.tensors[tensor].dtype.nbytes(partial[tensor]))


def gathered_elements(bound: Bound, ops: Iterable[int], written: Iterable[str]
                      ) -> dict[str, int]:
    """The tensors that ``ops`` read only in part, with the elements they read: a gather
    (take_along_axis, gather, index_select) reads of its input one element per element of its
    result it computes, and an elementwise op of the same shape one per element of its result.
    A tensor read in any other way, or written (``written``), is read whole. Empty where the
    ops hold no gather (the common case, at no cost)."""
    fusion = bound.fusion
    ops = sorted(set(ops))
    if not any(get_spec(fusion.ops[i].name).op_class is OpClass.GATHER for i in ops):
        return {}
    written = set(written)
    need: dict[str, int] = {}  # tensor -> elements its consumers (seen so far) read of it
    for i in reversed(ops):  # program order is topological: consumers first
        op = fusion.ops[i]
        outs = [o for o in op.outputs if o in fusion.tensors]
        got = [bound.numel(o) if o in written else min(need.get(o, 0), bound.numel(o))
               for o in outs]
        cls = get_spec(op.name).op_class
        for t in dict.fromkeys(op.inputs):
            if t not in fusion.tensors:
                continue
            if cls is OpClass.GATHER and t == op.inputs[0] and t not in op.inputs[1:]:
                n = got[0]
            elif cls is OpClass.POINTWISE and all(bound.shapes[o] == bound.shapes[t]
                                                  for o in outs):
                n = max(got, default=0)
            else:
                n = bound.numel(t)
            need[t] = need.get(t, 0) + n
    return {t: n for t, n in need.items() if n < bound.numel(t)}


def write_bytes(bound: Bound, segment: PricedSegment) -> int:
    """Bytes a segment writes to global memory: each output once, compact."""
    return sum(bound.nbytes(t) for t in segment.outputs)


def segment_time(bound: Bound, segment: PricedSegment, profile: DeviceProfile) -> float:
    """Estimated seconds of one segment on ``profile``'s device."""
    io = read_bytes(bound, segment) + write_bytes(bound, segment)
    rate = profile.compute_rate * (TENSOR_CORE_SPEEDUP if segment.on_tensor_cores else 1)
    compute = (compute_units(bound, segment.ops) + rescale_units(bound, segment.online)) / rate
    return max(io / profile.bandwidth, compute) + segment.kernels * profile.launch_overhead_s


def lower_bound_bytes(bound: Bound) -> int:
    """Every used fusion input read once (only the elements the fusion's gathers select, where
    nothing else reads it) and every output written once."""
    fusion = bound.fusion
    live = fusion.live_tensor_ops()
    used = {n for i in live for n in fusion.ops[i].inputs if n in fusion.tensors}
    partial = gathered_elements(bound, live, fusion.outputs)
    reads = sum(input_bytes(bound, t, partial) for t in fusion.tensor_inputs() if t in used)
    writes = sum(bound.nbytes(t) for t in dict.fromkeys(fusion.outputs)
                 if t not in fusion.inputs)
    return reads + writes


# ---- the CP-SAT objective, in KiB of traffic ------------------------------------------------

def objective_kib(bound: Bound, tensor: str, partial: Mapping[str, int] | None = None) -> int:
    """What reading or writing ``tensor`` once costs in the objective (``partial``: the
    elements read where only some are, see ``gathered_elements``)."""
    return math.ceil(input_bytes(bound, tensor, partial or {}) / KIB)


def launch_kib(profile: DeviceProfile, weight: float) -> int:
    """What one more kernel costs: the traffic its launch overhead could have moved."""
    return max(1, round(profile.launch_overhead_s * profile.bandwidth * weight / KIB))


def recompute_kib(bound: Bound, ops: Iterable[int], profile: DeviceProfile,
                  weight: float) -> int:
    """What computing ``ops`` once more costs: its arithmetic time as traffic, scaled down (x8)
    as most of it hides under the memory time."""
    work = compute_units(bound, ops)
    return round(work / profile.compute_rate * profile.bandwidth * weight / KIB / 8)


# ---- min-cut capacities, in KiB of traffic --------------------------------------------------

def cut_capacity(bound: Bound, tensor: str, *, read_anyway: bool, in_memory: bool,
                 writable: bool) -> int:
    """What a segment pays to read ``tensor`` instead of recomputing it: nothing if it reads it
    anyway, its size if it is in memory (a fusion input, or written anyway), twice its size if an
    earlier segment must write it as well, and infinity when nothing earlier can provide it."""
    size = max(1, bound.nbytes(tensor) // KIB)
    if read_anyway:
        return 0
    if in_memory:
        return size
    if writable:
        return 2 * size
    return CUT_INFINITY
