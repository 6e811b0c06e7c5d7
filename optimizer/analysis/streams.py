"""Stream-parallel axes (stream lowering, nvFuser #4147): check each annotation and group the
ops into stages.

``fd.sched.parallelize(T, axis, ParallelType.stream)`` says: compute T one slice ``T[..., i, ...]``
at a time, each slice on its own CUDA stream. That is sound when every slice of T needs only the
matching slice of each operand, so the axis must map through T's producing op to one axis of each
operand (or to none: an operand without it, or broadcast along it, is read whole). An op that
splits or merges the axis (reshape), reduces over it, resizes it (slice, pad, cat along it),
creates it (factories, broadcasts) or reads across it (gathers, fallback ops) breaks that, and is
refused with an error naming the tensor, the axis and the op.

Stages follow program order: consecutive stream-parallel ops with the same extent share one loop
(nvFuser merges their for-loops); an op that is not stream-parallel ends the loop and runs between
loops. Segments never mix stages, so each loop's body is whole segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.opspec import OpClass, get_spec


@dataclass(frozen=True)
class Stage:
    index: int
    ops: tuple[int, ...]  # op indices, program order
    extent: int | None = None  # iterations of the stream loop; None: runs once, unsplit
    # tensor -> its stream axis, for the tensors the loop writes and the operands it slices
    # (None: an operand read whole)
    axes: dict[str, int | None] = field(default_factory=dict)

    @property
    def is_loop(self) -> bool:
        return self.extent is not None


def _describe(op: Op) -> str:
    return f"{', '.join(op.outputs)} = {op.name}({', '.join(op.inputs)})"


def _refuse(tensor: str, axis: int, op: Op | None, why: str) -> PlanError:
    where = f" ({_describe(op)})" if op is not None else ""
    return PlanError(f"axis {axis} of {tensor} cannot be stream-parallel: {why}{where}")


def _aligned(bound: Bound, operand: str, out_rank: int, axis: int) -> int | None:
    """The operand axis aligned (from the right) with output ``axis``, or None when the operand
    lacks it or is broadcast along it."""
    j = axis - (out_rank - len(bound.shapes[operand]))
    return j if j >= 0 and not bound.broadcast[operand][j] else None


def operand_axes(bound: Bound, op: Op, tensor: str, axis: int) -> dict[str, int | None]:
    """For output ``axis`` of ``tensor`` (written by ``op``): each tensor operand's matching
    axis, None for an operand read whole. Raises a PlanError when the op breaks the axis."""
    spec = get_spec(op.name)
    cls = spec.op_class
    shapes = bound.shapes
    out_rank = len(shapes[tensor])
    operands = list(dict.fromkeys(n for n in op.inputs if n in bound.fusion.tensors))
    if cls in (OpClass.POINTWISE, OpClass.SEGMENT_SET) or op.name == "expand":
        return {t: _aligned(bound, t, out_rank, axis) for t in operands}
    if op.name == "broadcast_in_dim":
        dims = [d % out_rank for d in op.attrs["broadcast_dims"]]
        if axis not in dims:
            raise _refuse(tensor, axis, op, "broadcast_in_dim creates it")
        return {operands[0]: dims.index(axis)}
    if op.name == "broadcast":
        kept = [j for j, f in enumerate(op.attrs["is_broadcast_dim"]) if not f]
        if axis not in kept:
            raise _refuse(tensor, axis, op, "broadcast creates it")
        return {operands[0]: kept.index(axis)}
    if op.name == "squeeze":
        rank = len(shapes[operands[0]])
        dims = {d % rank for d in op.attrs["dims"]}
        return {operands[0]: [a for a in range(rank) if a not in dims][axis]}
    if op.name == "permute":
        return {operands[0]: op.attrs["dims"][axis] % len(shapes[operands[0]])}
    if cls is OpClass.REDUCTION:
        src = operands[0]
        rank = len(shapes[src])
        reduced = set(reduction_axes(op.attrs, rank))
        kept = list(range(rank)) if op.attrs.get("keepdim") else \
            [a for a in range(rank) if a not in reduced]
        if kept[axis] in reduced:
            raise _refuse(tensor, axis, op, f"{op.name} reduces it")
        return {src: kept[axis]}
    if cls is OpClass.RESHAPE:
        return {operands[0]: _reshaped_axis(bound, op, tensor, axis)}
    if cls is OpClass.RESIZE:
        return _resized_axes(bound, op, tensor, axis, operands)
    if cls is OpClass.LIBRARY and op.name in ("linear", "matmul"):
        return _library_axes(bound, op, tensor, axis, operands)
    if cls is OpClass.FACTORY:
        raise _refuse(tensor, axis, op, f"{op.name} creates it, with no operand to slice")
    raise _refuse(tensor, axis, op, f"{op.name} reads across it (not a per-slice op)")


def _reshaped_axis(bound: Bound, op: Op, tensor: str, axis: int) -> int:
    """A reshape keeps the axis when the extents before it multiply to the same number on both
    sides and the axis itself keeps its extent."""
    src = op.inputs[0]
    before_out = _product(bound.shapes[tensor][:axis])
    extent = bound.shapes[tensor][axis]
    acc = 1
    for j, e in enumerate(bound.shapes[src]):
        if acc == before_out and e == extent:
            return j
        acc *= e
    raise _refuse(tensor, axis, op, "reshape splits or merges it")


def _product(extents) -> int:
    out = 1
    for e in extents:
        out *= e
    return out


def _resized_axes(bound: Bound, op: Op, tensor: str, axis: int, operands: list[str]
                  ) -> dict[str, int | None]:
    extent = bound.shapes[tensor][axis]
    if op.name == "cat":
        if op.attrs["dim"] % len(bound.shapes[tensor]) == axis:
            raise _refuse(tensor, axis, op, "cat joins along it")
        return {t: axis for t in operands}
    src = operands[0]
    start = op.attrs["start_indices"][axis] if op.name == "slice" else 0
    if bound.shapes[src][axis] != extent or start != 0:
        raise _refuse(tensor, axis, op, f"{op.name} resizes it")
    return {src: axis}


def _library_axes(bound: Bound, op: Op, tensor: str, axis: int, operands: list[str]
                  ) -> dict[str, int | None]:
    """linear: every output axis but the last comes from the input, the last from the weight's
    rows (and the bias). matmul: batch axes broadcast from the right, M from A, N from B."""
    out_rank = len(bound.shapes[tensor])
    first, second = op.inputs[0], op.inputs[1]
    rest = [t for t in operands if t not in (first, second)]
    if op.name == "linear":
        if axis < out_rank - 1:
            return {first: axis, second: None, **{t: None for t in rest}}
        if len(bound.shapes[second]) != 2:
            raise _refuse(tensor, axis, op, "linear with a 1-D weight has no output features")
        return {first: None, second: 0, **{t: 0 for t in rest}}
    rank_a, rank_b = len(bound.shapes[first]), len(bound.shapes[second])
    if rank_a < 2 or rank_b < 2:
        raise _refuse(tensor, axis, op, "matmul of a vector contracts it")
    if axis == out_rank - 1:
        return {first: None, second: rank_b - 1}
    if axis == out_rank - 2:
        return {first: rank_a - 2, second: None}
    return {first: _aligned(bound, first, out_rank, axis),
            second: _aligned(bound, second, out_rank, axis)}


def annotated_axes(bound: Bound) -> dict[str, int]:
    """The annotated tensors and their stream axes, after checking each annotation on its own."""
    fusion = bound.fusion
    producers = fusion.producers()
    axes: dict[str, int] = {}
    for tensor, axis in fusion.stream_axes:
        if tensor not in fusion.tensors:
            raise PlanError(f"a stream axis names {tensor}, which is not a tensor of the fusion")
        rank = len(bound.shapes[tensor])
        if not 0 <= axis < rank:
            raise PlanError(f"stream axis {axis} is out of range for {tensor} of rank {rank}")
        if tensor not in producers:
            raise _refuse(tensor, axis, None, f"{tensor} is a fusion input; annotate the "
                          "tensors the fusion computes")
        if bound.broadcast[tensor][axis] and bound.shapes[tensor][axis] != 1:
            raise _refuse(tensor, axis, fusion.ops[producers[tensor]],
                          "it is a broadcast axis, so there is nothing to split")
        if axes.get(tensor, axis) != axis:
            raise PlanError(f"{tensor} has two stream axes, {axes[tensor]} and {axis}")
        axes[tensor] = axis
    return axes


def stream_stages(bound: Bound) -> list[Stage]:
    """The fusion's stages in program order, or [] when nothing is stream-parallel. Raises a
    PlanError naming the tensor, the axis and the op when an annotation cannot be honoured."""
    if bound.stream_stages is None:
        bound.stream_stages = _stages(bound) if bound.fusion.stream_axes else []
    return bound.stream_stages


def _stages(bound: Bound) -> list[Stage]:
    fusion = bound.fusion
    annotated = annotated_axes(bound)
    stages: list[Stage] = []
    ops: list[int] = []
    axes: dict[str, int | None] = {}
    extent: int | None = None

    def close() -> None:
        if ops:
            stages.append(Stage(len(stages), tuple(ops), extent, dict(axes)))
        ops.clear()
        axes.clear()

    for i in fusion.live_tensor_ops():
        op = fusion.ops[i]
        outs = [o for o in op.outputs if o in fusion.tensors]
        marked = [o for o in outs if o in annotated]
        if not marked:
            if extent is not None:
                close()
                extent = None
            ops.append(i)
            continue
        first = marked[0]
        this_extent = bound.shapes[first][annotated[first]]
        if extent != this_extent:
            close()
            extent = this_extent
        for o in outs:  # outputs of one op (var_mean) split together
            axis = annotated.get(o, annotated[first])
            if len(bound.shapes[o]) != len(bound.shapes[first]) or \
                    bound.shapes[o][axis] != this_extent:
                raise _refuse(o, axis, op, f"it must be split like {first}, axis "
                                           f"{annotated[first]}")
            _claim(axes, o, axis, op)
            for t, j in operand_axes(bound, op, o, axis).items():
                _claim(axes, t, j, op)
        ops.append(i)
    close()
    return stages


def _claim(axes: dict[str, int | None], tensor: str, axis: int | None, op: Op) -> None:
    """Record how a loop slices ``tensor``: one way for the whole loop."""
    if tensor in axes and axes[tensor] != axis:
        was, now = axes[tensor], axis
        raise PlanError(f"{tensor} would be split two ways in one stream loop: "
                        f"{'whole' if was is None else f'along axis {was}'} and "
                        f"{'whole' if now is None else f'along axis {now}'} "
                        f"(at {_describe(op)})")
    axes[tensor] = axis


def stage_of_ops(bound: Bound) -> dict[int, int]:
    """Op index -> stage index ({} when nothing is stream-parallel)."""
    return {i: s.index for s in stream_stages(bound) for i in s.ops}
