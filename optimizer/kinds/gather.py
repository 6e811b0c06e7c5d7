"""Row gathers inside reduction segments: ``take_along_axis(x, index, dim)`` (or ``gather``) that
picks one element of each row a reduction reduces (cross-entropy's target logit).

Such a gather's index has extent 1 along ``dim`` and the extents of ``x`` elsewhere, and ``dim``
is the segment's reduced axis: its result lives on the reduced domain, one value per row. The
reduction kernel computes it after the row reduction, where one thread per row runs the epilogue:
it reads the row's index and ``x`` at that one position (evaluating ``x``'s prologue there from
the segment's inputs), so the gather and what follows it (``lse - target_logit``) need no kernel
of their own. For classification a row gather ties the axes it keeps (``out``, ``x`` and
``index`` agree on every axis but ``dim``) and ``out``'s ``dim`` axis, of extent 1, is a
broadcast one. Such a segment must be a plain reduction over the gathered axis alone, with no
resize, and ``x`` must not depend on a reduction result (the epilogue reads it at an index the
loop never held).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fusecut.optimizer.analysis.axes import AxisMap, domain_axes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op

ROW_GATHERS = frozenset({"take_along_axis", "gather"})


def gather_dim(bound: Bound, op: Op) -> int:
    return op.attrs["dim"] % len(bound.shapes[op.inputs[0]])


def may_gather_rows(bound: Bound, op: Op) -> bool:
    """Whether ``op`` has a row gather's shape (one index per row, the input's extents
    elsewhere); the segment it joins decides the rest (``row_gather_misfit``)."""
    if op.name not in ROW_GATHERS:
        return False
    src, index = op.inputs[0], op.inputs[1]
    shape, ishape = bound.shapes[src], bound.shapes[index]
    dim = gather_dim(bound, op)
    return shape[dim] > 0 and ishape[dim] == 1 and all(
        i == e for a, (i, e) in enumerate(zip(ishape, shape)) if a != dim)


def tie_row_gathers(bound: Bound, axes: AxisMap, ops: Iterable[Op]) -> AxisMap:
    """A copy of ``axes`` with the kept axes of the row gathers ``ops`` tied to their input's and
    their index's, for one classification (a copy: see ``optimizer.kinds.resize.tie_resizes``)."""
    fork = AxisMap(bound)
    fork.absorb(axes)
    for op in ops:
        out, dim = op.outputs[0], gather_dim(bound, op)
        for a in range(len(bound.shapes[out])):
            if a != dim:
                fork.tie((out, a), (op.inputs[0], a))
                fork.tie((out, a), (op.inputs[1], a))
    return fork


def row_gather_misfit(bound: Bound, gathers: Iterable[int], axis_map: Mapping, row_axes,
                      stage: Mapping[str, int]) -> str | None:
    """Why row gathers cannot be in this reduction segment (its axis map, reduced domain axes and
    the stage each tensor is available at), or None."""
    fusion = bound.fusion
    for i in gathers:
        op = fusion.ops[i]
        src, dim = op.inputs[0], gather_dim(bound, op)
        along = domain_axes(axis_map[src][dim])
        if not along or tuple(along) != tuple(row_axes):
            return f"{op.name} ({op.outputs[0]}) gathers along an axis the segment does not " \
                   f"reduce alone"
        if stage.get(src, 0) > 0:
            return f"{op.name} ({op.outputs[0]}) gathers from {src}, computed from a " \
                   f"reduction result: the epilogue cannot read it at another index"
    return None
