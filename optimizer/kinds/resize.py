"""Resizes (slice, pad, cat) inside reduction segments, along kept axes only.

A resize moves data along the axes it resizes and leaves the others as they are. In a reduction
segment whose reduced axes it does not touch, the code generator reads the resized operand at
the shifted (sliced) or clamped-and-selected (pad, cat) index the emitter derives from the
consumer's, as pointwise kernels do: RoPE's backward (slices, a negation, pads along the head
axis) then joins the sum over grouped-query heads instead of writing its full-size result for a
second kernel. For classification, a resize ties the axes it leaves alone, and each resized axis
lands on the domain axis its operand's lands on (its *partner*): the same loop axis, read at
another position. Such a segment must be a plain reduction (a persistent kernel keeps rows by
the domain's extents), a resized axis must be a kept one, no written tensor or reduced
value may have a resized axis (those are indexed by the domain directly). A resize may read a
value computed from the segment's reduction results (Thunder's RoPE of a group sum) only along
the innermost domain axis, kept and at most ``STAGED_ROW_LIMIT`` long: the kernel stages its
results in shared memory, each block holding whole rows of that axis (``codegen.reduction``),
so the epilogue reads them at the shifted column; along any other axis the shifted index would
be another block's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fusecut.optimizer.analysis.axes import AxisEntry, AxisKey, AxisMap
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.opspec import OpClass, get_spec

# The longest innermost axis along which an epilogue reads reduction results at a shifted
# column: a block's threads cover whole rows of it (1024 one-lane threads at most).
STAGED_ROW_LIMIT = 1024


def is_resize(op: Op) -> bool:
    return get_spec(op.name).op_class is OpClass.RESIZE


def shifted_result_misfit(bound: Bound, resizes: Iterable[int], stage: Mapping[str, int],
                          domain: Sequence[int], axis_map: Mapping[str, tuple[AxisEntry, ...]],
                          row_axes: Sequence[int]) -> str | None:
    """Why a resize in a plain reduction's epilogue cannot be there, or None: one that reads a
    value computed from a reduction result (``stage`` > 0) must shift along the innermost
    domain axis alone, kept, and at most ``STAGED_ROW_LIMIT`` long."""
    fusion = bound.fusion
    last = len(domain) - 1
    for i in resizes:
        op = fusion.ops[i]
        src = next((n for n in op.inputs if stage.get(n, 0) > 0), None)
        if src is None:
            continue
        along = {axis_map[op.outputs[0]][a] for a in _resized_axes(bound, op)}
        why = None
        if along != {last} or last in row_axes:
            why = "along an axis other than the innermost kept one, where a thread's block " \
                  "holds other results"
        elif domain[last] > STAGED_ROW_LIMIT:
            why = f"along an innermost axis of {domain[last]}, over the {STAGED_ROW_LIMIT} " \
                  f"a block stages"
        if why:
            return f"{op.name} ({op.outputs[0]}) reads {src}, computed from a reduction " \
                   f"result, at a shifted index {why}"
    return None


def reads_results_shifted(bound: Bound, ops: Sequence[int], reductions: Sequence[int]) -> bool:
    """Whether a resize among ``ops`` reads a value computed from the results of
    ``reductions`` (the kernel then stages its results in shared memory)."""
    fusion = bound.fusion
    derived = {o for i in reductions for o in fusion.ops[i].outputs}
    for i in sorted(ops):
        op = fusion.ops[i]
        if i in reductions or not derived.intersection(op.inputs):
            continue
        if is_resize(op):
            return True
        derived.update(op.outputs)
    return False


def tie_resizes(bound: Bound, axes: AxisMap, ops: Iterable[Op]
                ) -> tuple[AxisMap, dict[AxisKey, AxisKey]]:
    """A copy of ``axes`` with the untouched axes of ``ops`` tied, and each resized output axis
    (by id in the copy) -> the id of the operand axis it reads along. The ties hold for one
    classification. (A copy, not a fork: ``axes`` may itself be a merging segmenter's
    uncommitted fork, whose ties a fork of it would not see.)"""
    fork = AxisMap(bound)
    fork.absorb(axes)
    pairs: list[tuple[AxisKey, AxisKey]] = []
    for op in ops:
        out = op.outputs[0]
        shape = bound.shapes[out]
        operands = [n for n in op.inputs if n in bound.shapes] if op.name == "cat" else \
            [op.inputs[0]]
        moved = _resized_axes(bound, op)
        for src in operands:
            for a in range(len(shape)):
                if bound.broadcast[src][a] or bound.broadcast[out][a]:
                    continue
                if a in moved:
                    pairs.append(((out, a), (src, a)))
                else:
                    fork.tie((out, a), (src, a))
    partner = {}
    for o, i in pairs:
        partner.setdefault(fork.root(*o), fork.root(*i))
    return fork, partner


def _resized_axes(bound: Bound, op: Op) -> set[int]:
    src, out = op.inputs[0], op.outputs[0]
    rank = len(bound.shapes[out])
    if op.name == "cat":
        return {op.attrs["dim"] % rank}
    moved = {a for a in range(rank) if bound.shapes[src][a] != bound.shapes[out][a]}
    if op.name == "pad":  # a pad by (-1, 1) keeps the extent yet shifts the axis
        widths = op.attrs["pad_widths"]
        for k in range(len(widths) // 2):
            pair = (widths[2 * k], widths[2 * k + 1])
            if pair != (0, 0):
                moved.add(rank - 1 - k)
    return moved


def place_through_partner(axis_id, pos: dict, partner: dict[AxisKey, AxisKey]) -> int | None:
    """The domain axis a resized axis reads along (through chains of resizes), or None."""
    for _ in range(len(partner) + 1):
        if axis_id in pos:
            return pos[axis_id]
        axis_id = partner.get(axis_id)
        if axis_id is None:
            return None
    return None
