"""Symbolic extents in POST /v1/plan (issue 44): an input's shape may give -1 for an extent the
client does not know yet (a batch, a sequence length), as nvFuser's ``define_tensor`` does.

The plan is searched with one stand-in size for every -1 (``size_hint``, else 1024; moved
past any extent the request gives, so that no given extent is mistaken for a symbolic one) and
holds for any size of them: its JSON lists ``valid_for``, and a run of it on tensors of other
sizes rebinds it to them without a search (``optimizer.plan.rebind.bind_symbolic``). Only an
extent the plan does not turn on may be symbolic: a reduced row's length or a hidden size
decides the segments' kinds, and a -1 there is refused, naming the input and axis."""

from __future__ import annotations

from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta
from fusecut.optimizer.ir.wire import InputMetaJSON, meta_from_json
from fusecut.optimizer.plan.rebind import bound_as_planned, fixed_extents

SYMBOLIC = -1
DEFAULT_SIZE = 1024


def has_symbolic(inputs: list[InputMetaJSON]) -> bool:
    return any(SYMBOLIC in (m.shape or ()) for m in inputs)


def stand_in(inputs: list[InputMetaJSON], hint: int | None) -> int:
    """The size planned for every -1: the hint (or 1024), moved up past any extent given."""
    given = {e for m in inputs for e in (m.shape or ()) if e != SYMBOLIC}
    size = hint or DEFAULT_SIZE
    while size in given:
        size += 1
    return size


def symbolic_inputs(fusion: Fusion, inputs: list[InputMetaJSON], hint: int | None
                    ) -> tuple[list[InputMeta], tuple[tuple[int, int], ...]]:
    """The request's input metadata with the stand-in size for every -1, and the symbolic
    (input position, axis) extents. A tensor with a -1 takes no strides (it is dense), and
    the plan may not turn on a symbolic extent."""
    size = stand_in(inputs, hint)
    metas, symbolic = [], []
    for i, m in enumerate(inputs):
        axes = [a for a, e in enumerate(m.shape or ()) if e == SYMBOLIC]
        if axes and m.strides is not None:
            raise InputError(f"input {fusion.inputs[i]}: a shape with -1 ({m.shape}) takes no "
                             f"strides (the tensor is dense), got {m.strides}")
        shape = [size if e == SYMBOLIC else e for e in m.shape] if m.shape is not None else None
        metas.append(meta_from_json(m.model_copy(update={"shape": shape})))
        symbolic += [(i, a) for a in axes]
    if symbolic and size in fixed_extents(bound_as_planned(fusion, metas)):
        where = ", ".join(f"{fusion.inputs[i]} axis {a}" for i, a in symbolic)
        raise InputError(f"-1 extents ({where}): the plan turns on one of them (a row "
                         f"reduction reduces it, or it is the hidden size), so its size must "
                         f"be given")
    return metas, tuple(symbolic)
