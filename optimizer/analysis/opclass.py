"""What the planner may do with each op, once sizes are known.

The registry's op class says what an op is; here it becomes what a segment may hold:
- FUSIBLE ops run inside generated kernels (elementwise, broadcasts, views, resizes, gathers,
  factories, and reductions over broadcast axes only, which are squeezes in disguise);
- REDUCTION ops anchor reduction, normalization and inner-outer segments;
- LIBRARY ops (matmul, linear) run alone through cuBLAS;
- FALLBACK ops (FALLBACK_OPS and the FALLBACK op class) run alone through the torch reference
  (no generated kernel exists for them);
- SEGMENT_SET forces its input across a segment boundary.
"""

from __future__ import annotations

from enum import Enum

from fusecut.optimizer.analysis.axes import reshape_spans
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.ops_library import LIBRARY_CALLS
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.opspec import OpClass, get_spec

# Ops with no generated kernel: they run alone through the torch reference.
FALLBACK_OPS = frozenset({"digamma", "gcd", "stride_order", "cumsum", "cumprod", "cummax",
                          "cummin", "erfcinv", "real", "imag"})
# Ops that move data between index spaces: allowed in pointwise segments only.
VIEW_CLASSES = frozenset({OpClass.RESHAPE, OpClass.RESIZE, OpClass.GATHER})


class Role(str, Enum):
    FUSIBLE = "fusible"
    REDUCTION = "reduction"
    LIBRARY = "library"
    FALLBACK = "fallback"
    SEGMENT_SET = "segment_set"


def is_trivial_reduction(op: Op, bound: Bound) -> bool:
    """A reduction whose reduced axes are all broadcast (extent 1 or expanded): no real work."""
    src = op.inputs[0]
    axes = reduction_axes(op.attrs, len(bound.shapes[src]))
    flags = bound.broadcast[src]
    if bound.numel(src) == 0:
        return False
    return all(flags[a] for a in axes)


def role(op: Op, bound: Bound) -> Role:
    spec = get_spec(op.name)
    if spec.op_class is OpClass.FALLBACK:
        return Role.FALLBACK
    if op.name in LIBRARY_CALLS:
        return Role.LIBRARY
    if op.name in FALLBACK_OPS or any(
            v in bound.fusion.tensors and bound.fusion.tensors[v].dtype.reference_only
            for v in (*op.inputs, *op.outputs)):
        return Role.FALLBACK
    if spec.op_class is OpClass.LIBRARY:
        return Role.LIBRARY
    if spec.op_class is OpClass.SEGMENT_SET:
        return Role.SEGMENT_SET
    if spec.op_class is OpClass.REDUCTION:
        return Role.FUSIBLE if is_trivial_reduction(op, bound) else Role.REDUCTION
    return Role.FUSIBLE


def is_view(op: Op) -> bool:
    return get_spec(op.name).op_class in VIEW_CLASSES


def reindexes(op: Op, bound: Bound) -> bool:
    """A view that moves elements to other axis positions, so that it cannot join a reduction
    segment: every view but a reshape that only splits or merges axes (see
    ``optimizer.analysis.axes.reshape_spans``), whose axes land on runs of the domain's."""
    if not is_view(op):
        return False
    if op.name != "reshape":
        return True
    return reshape_spans(bound.shapes[op.inputs[0]], bound.shapes[op.outputs[0]]) is None
