"""One plan for a range of shapes: a new batch or sequence length without a search (issue 44,
item 2).

What the planner chooses for a fusion turns on its dtypes, ranks and layouts and on the extents
a segment's kind turns on (how long a reduced row is: kept on chip or not, persistent or
tiled), and hardly on how many rows there are: the bytes every cut moves grow with the rows
alike. So shapes that differ only in their *free* extents (``free_extents``: never a reduced
extent or a hidden size, ``fixed_extents``) share a plan: the plan searched at their
``representative``, each free extent rounded up to a power of two, and ``rebind``-ed to each
shape. Rebinding binds the fusion to the shape, classifies each segment again and assembles
the plan, as a restored plan is (``build_plan``): what a search checks, without the search.
Where a segment does not schedule there, or schedules as another kind, the plan does not hold
(None): the caller plans that shape itself. The range a plan holds for is so the shapes whose
free extents round to its representative's, less those where rebinding says it does not
hold.

Deterministic: a shape's plan depends on the shape and the options only (its representative's
search, then this), never on which shapes came before.
"""

from __future__ import annotations

from dataclasses import replace

from fusecut.optimizer.analysis.shapes import Bound, bind
from fusecut.optimizer.errors import FusecutError, InputError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, contiguous_strides
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.optimizer.ir.rng import seed_implicit_rng
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.options import KINDS
from fusecut.optimizer.plan.build import build_plan
from fusecut.optimizer.plan.plan import Plan
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.result import SolverReport

REBOUND = "REBOUND"  # the solver status of a rebound plan: no search ran


def _moving_axes(m: TensorMeta) -> list[int]:
    """The axes a tensor's elements lie along (not expanded, not 1), outermost stride first."""
    return sorted((a for a, (e, s) in enumerate(zip(m.shape, m.strides)) if s != 0 and e != 1),
                  key=lambda a: -m.strides[a])


def _dense(m: TensorMeta) -> bool:
    moving = _moving_axes(m)
    return tuple(m.strides[a] for a in moving) == \
        tuple(contiguous_strides([m.shape[a] for a in moving]))


def fixed_extents(bound: Bound) -> set[int]:
    """The extents a plan turns on: what a reduction of rows reduces (its innermost axis and
    any other, some axis kept: a row's length decides whether it stays on chip), and the
    innermost extent of the inputs of the largest rank (a hidden size). Not what a column sum
    or a whole reduction reduces (a weight's gradient over the rows, a loss's mean): its kind
    does not turn on how many there are, and rebinding checks that anyway."""
    fusion = bound.fusion
    fixed = set()
    for op in fusion.ops:
        if op.inputs and get_spec(op.name).op_class is OpClass.REDUCTION:
            shape = bound.shapes[op.inputs[0]]
            axes = reduction_axes(op.attrs, len(shape))
            if len(shape) - 1 in axes and len(axes) < len(shape):
                fixed |= {shape[a] for a in axes if shape[a] > 1}
    tensors = [m for m in bound.inputs.values() if isinstance(m, TensorMeta) and m.shape]
    top = max((m.rank for m in tensors), default=0)
    return fixed | {m.shape[-1] for m in tensors if m.rank == top and m.shape[-1] > 1}


def free_extents(metas: list[InputMeta], fixed: set[int]) -> set[int]:
    """The extents a plan does not turn on: those of dense inputs, never a ``fixed`` one, never
    0 or 1. A value, not an axis: the same extent (the rows of the logits and of their 1-D
    labels, the sequence of hidden states and of their per-row statistics) stays one extent."""
    dense = [m for m in metas if isinstance(m, TensorMeta) and m.shape and _dense(m)]
    return {e for m in dense for e in m.shape if e > 1} - fixed


def representative(metas: list[InputMeta], fixed: set[int]) -> list[InputMeta]:
    """The shape whose plan serves ``metas``: every free extent rounded up to a power of two
    (equal extents stay equal), dense tensors laid out as before."""
    free = free_extents(metas, fixed)
    out: list[InputMeta] = []
    for m in metas:
        if isinstance(m, ScalarMeta) or not m.shape or not _dense(m):
            out.append(m)
            continue
        shape = tuple(1 << (e - 1).bit_length() if e in free else e for e in m.shape)
        moving = _moving_axes(m)
        dense = dict(zip(moving, contiguous_strides([shape[a] for a in moving])))
        strides = tuple(0 if s == 0 else dense.get(a, s) for a, s in enumerate(m.strides))
        out.append(TensorMeta(shape, strides, m.dtype, m.fill))
    return out


def representative_fusion(fusion: Fusion, metas: list[InputMeta], fixed: set[int]) -> Fusion:
    """``fusion`` as its representative shape's definition: every literal extent of a shape
    list (``broadcast_in_dim``'s, ``reshape``'s, ``full``'s ... and what ``define_tensor``
    declared) that is a free extent of ``metas`` rounded up as ``representative`` rounds it.
    Thunder and the torch.compile backend write a definition per shape, its sizes in it: two
    shapes of one range then share the representative's definition, and its search. The
    fusion itself where nothing changes."""
    up = {e: 1 << (e - 1).bit_length() for e in free_extents(metas, fixed)}

    def mapped(shape):
        return type(shape)(up.get(x, x) if type(x) is int else x for x in shape)

    ops = []
    for op in fusion.ops:
        lists = [p.name for p in get_spec(op.name).params if p.kind == "SH"
                 and isinstance(op.attrs.get(p.name), (list, tuple))]
        ops.append(replace(op, attrs={**op.attrs, **{n: mapped(op.attrs[n]) for n in lists}})
                   if lists else op)
    tensors = {n: replace(t, declared_shape=mapped(t.declared_shape))
               if t.declared_shape is not None else t for n, t in fusion.tensors.items()}
    if ops == fusion.ops and tensors == fusion.tensors:
        return fusion
    return replace(fusion, ops=ops, tensors=tensors)


def bound_as_planned(fusion: Fusion, metas: list[InputMeta]) -> Bound:
    """``fusion`` bound to ``metas`` as ``make_plan`` binds it (unseeded random ops seeded)."""
    return bind(*seed_implicit_rng(fusion, metas))


def rebind(plan: Plan, fusion: Fusion, metas: list[InputMeta], bound: Bound | None = None
           ) -> Plan | None:
    """``plan``'s segmentation for ``fusion`` bound to ``metas`` (``bound``: that binding,
    where the caller made it already), or None where it does not hold: the fusion does not
    bind to them, or a segment does not schedule there, or not as the same kind."""
    kinds = frozenset(Kind(k) for k in plan.options.get("kinds", KINDS.default))
    groups = [(frozenset(s.schedule.ops), frozenset(s.schedule.outputs)) for s in plan.segments]
    report = SolverReport(REBOUND, message=f"plan {plan.plan_id}'s segmentation, bound to "
                                           "these extents (no search)")
    try:
        graph = SegGraph(bound or bound_as_planned(fusion, metas), plan.profile, kinds)
        made = build_plan(graph, groups, plan.segmenter, report, None, plan.options)
    except FusecutError:
        return None
    if [s.kind for s in made.segments] != [s.kind for s in plan.segments]:
        return None
    return replace(made, rebound_from=plan.plan_id)


def bind_symbolic(plan: Plan, metas: list[InputMeta]) -> Plan | None:
    """``plan``, asked for with symbolic extents (``Plan.symbolic``), at the inputs ``metas``:
    itself where they are the ones it was planned at, else rebound to them (None where its
    segments do not schedule there as planned). An InputError names what breaks the pattern:
    an input of another dtype or rank, an extent other than the one given, a symbolic extent
    below 2, or a tensor that is not dense."""
    fusion = plan.fusion
    names = fusion.caller_inputs()
    if len(metas) != len(names):
        raise InputError(f"plan {plan.plan_id} takes {len(names)} inputs, got {len(metas)}")
    symbolic = set(plan.symbolic)
    for i, (name, meta) in enumerate(zip(names, metas)):
        want = plan.bound.inputs[name]
        if isinstance(want, ScalarMeta) or not isinstance(meta, TensorMeta):
            if type(meta) is not type(want) or meta.dtype != want.dtype:
                raise InputError(f"input {name}: plan {plan.plan_id} takes {want}, got {meta}")
            continue
        if meta.dtype != want.dtype or meta.rank != want.rank:
            raise InputError(f"input {name}: plan {plan.plan_id} takes a {want.rank}-D "
                             f"{want.dtype.value} tensor, got a {meta.rank}-D "
                             f"{meta.dtype.value} one")
        for axis, (got, planned) in enumerate(zip(meta.shape, want.shape)):
            if (i, axis) in symbolic and got < 2:
                raise InputError(f"input {name} axis {axis}: a symbolic extent of plan "
                                 f"{plan.plan_id} must be at least 2, got {got}")
            if (i, axis) not in symbolic and got != planned:
                raise InputError(f"input {name} axis {axis}: plan {plan.plan_id} was made for "
                                 f"extent {planned}, got {got}")
        if any(i == j for j, _ in symbolic) and not _dense(meta):
            raise InputError(f"input {name}: a tensor with symbolic extents must be dense, got "
                             f"strides {list(meta.strides)} for shape {list(meta.shape)}")
    if [plan.bound.inputs[n] for n in names] == list(metas):
        return plan
    return rebind(plan, fusion, list(metas))
