"""Tensor descriptors: contiguity and stride order from concrete sizes and strides, nvFuser's way.

nvFuser describes an input tensor by its symbolic shape, a ``contiguity`` flag per axis and a
``stride_order``. Two rules matter for fusecut to read nvFuser's definitions unchanged:

- ``compute_tensor_descriptor(sizes, strides)`` (what ``fd.from_pytorch`` and
  ``define_tensor(sizes=, strides=)`` use) sorts the stored axes by stride and gives the
  contiguity in that *allocation* order; stride-0 axes keep their logical position.
- When ``stride_order`` is given, ``contiguity`` is read in allocation order: logical axis ``i``
  has allocation position ``rank - 1 - stride_order[i]``. Without it, allocation order is the
  logical order.
"""

from __future__ import annotations

from collections.abc import Sequence

from fusecut.optimizer.errors import DefinitionError

Contiguity = list[bool | None]


def compute_contiguity(sizes: Sequence[int], strides: Sequence[int]) -> Contiguity:
    """Per logical axis: None for a broadcast axis (extent 1 or stride 0), else whether the axis
    is contiguous with the next stored axis to its right (the innermost needs stride 1)."""
    if len(sizes) != len(strides):
        raise DefinitionError("compute_contiguity: Sizes and strides must have the same number "
                              "of dimensions")
    stored = [i for i in range(len(sizes)) if strides[i] != 0 and sizes[i] != 1]
    out: Contiguity = [None] * len(sizes)
    for k, i in enumerate(stored):
        if k + 1 < len(stored):
            j = stored[k + 1]
            out[i] = strides[i] == strides[j] * sizes[j]
        else:
            out[i] = strides[i] == 1
    return out


def compute_tensor_descriptor(sizes: Sequence[int],
                              strides: Sequence[int]) -> tuple[Contiguity, list[int]]:
    """(contiguity in allocation order, stride_order) of a tensor with these sizes and strides.

    ``stride_order[i]`` is the rank of logical axis ``i``'s stride (``rank - 1`` outermost).
    Axes with stride != 0 are ordered by decreasing stride (ties keep logical order); stride-0
    axes stay at their logical position. An axis is contiguous when its stride equals the next
    stored (non-broadcast) axis's stride times extent, the innermost when its stride is 1.
    """
    if len(sizes) != len(strides):
        raise DefinitionError("compute_tensor_descriptor: Sizes and strides must have the same "
                              "number of dimensions")
    for i, s in enumerate(strides):
        if s < 0:
            raise DefinitionError(f"negative stride on tensor is not supported: strides[{i}]={s}")
    rank = len(sizes)
    stored = sorted((i for i in range(rank) if strides[i] != 0), key=lambda i: -strides[i])
    order = list(stored)
    for i in range(rank):  # stride-0 axes go back to their logical position
        if strides[i] == 0:
            order.insert(i, i)

    def broadcast(i: int) -> bool:
        return strides[i] == 0 or sizes[i] == 1

    contiguity: Contiguity = [None] * rank
    for pos, axis in enumerate(order):
        if broadcast(axis):
            continue
        expected = 1
        for nxt in order[pos + 1:]:
            if not broadcast(nxt):
                expected = strides[nxt] * sizes[nxt]
                break
        contiguity[pos] = strides[axis] == expected
    stride_order = [0] * rank
    for pos, axis in enumerate(order):
        stride_order[axis] = rank - 1 - pos
    return contiguity, stride_order


def check_stride_order(stride_order: Sequence[int], rank: int) -> list[int]:
    """nvFuser's normalisation: entries in [-rank, rank), negative ones wrapped, no repeats."""
    out = []
    for order in stride_order:
        if not -rank <= order < rank:
            bound = f">= {-rank}" if order < 0 else f"< {rank}"
            raise DefinitionError(f"defineTensor stride_order argument is out of range, expects "
                                  f"{bound}, but got: {order}")
        out.append(order % rank)
    if len(set(out)) != len(out):
        raise DefinitionError(f"defineTensor got duplicated stride_order entries: "
                              f"{', '.join(map(str, stride_order))}")
    return out


def allocation_position(axis: int, stride_order: Sequence[int] | None, rank: int) -> int:
    """Where logical ``axis`` sits in allocation order (outermost first)."""
    return axis if not stride_order else rank - 1 - stride_order[axis]


def logical_contiguity(contiguity: Sequence[bool | None], stride_order: Sequence[int] | None
                       ) -> Contiguity:
    """Contiguity given in allocation order (nvFuser's rule with a stride_order) per logical
    axis."""
    rank = len(contiguity)
    return [contiguity[allocation_position(i, stride_order, rank)] for i in range(rank)]


def allocation_contiguity(contiguity: Sequence[bool | None], stride_order: Sequence[int] | None
                          ) -> Contiguity:
    """The inverse of ``logical_contiguity``: per-logical-axis flags in allocation order."""
    rank = len(contiguity)
    out: Contiguity = [None] * rank
    for i in range(rank):
        out[allocation_position(i, stride_order, rank)] = contiguity[i]
    return out
