"""Memory order: the order in which a dense tensor's axes are laid out, outermost first.

A region's input is often a permuted view (``x.view(b, s, h, d).transpose(1, 2)``). Written in
the logical order, the region's outputs would be transposes of that input: the kernel tiles a
transpose, and the next view that undoes the permutation (``y.transpose(1, 2).reshape(b, s, -1)``)
copies. Like torch's elementwise ops and nvFuser's allocation domain, a region instead writes its
outputs in the memory order of its largest permuted input of the same rank, and hands them back
as permuted views of that layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Order = tuple[int, ...]  # axes, outermost in memory first; the identity is row-major


def memory_order(t: torch.Tensor) -> Order | None:
    """The order of a dense, non-row-major tensor's axes in memory; None for a row-major,
    broadcast, overlapping or gapped one (nothing to follow). Plain arithmetic on the sizes
    and strides (this runs for every argument of every region call)."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    sizes, strides = t.shape, t.stride()
    order = tuple(sorted(range(len(sizes)), key=lambda d: (-strides[d], d)))
    expected = 1  # the permuted view is row-major: each moving axis steps over the inner ones
    for d in reversed(order):
        if sizes[d] != 1:
            if strides[d] != expected:
                return None
            expected *= sizes[d]
    return order


def inverse(order: Sequence[int]) -> Order:
    result = [0] * len(order)
    for position, axis in enumerate(order):
        result[axis] = position
    return tuple(result)


def orders_of(args: Sequence[object]) -> tuple[Order | None, ...]:
    return tuple(memory_order(a) if isinstance(a, torch.Tensor) else None for a in args)


def output_orders(args: Sequence[Any], in_orders: Sequence[Order | None],
                  out_ranks: Sequence[int]) -> tuple[Order | None, ...]:
    """Per output, the memory order to write it in: that of the largest permuted input of its
    rank, if any."""
    by_rank: dict[int, tuple[int, Order]] = {}
    for a, order in zip(args, in_orders):
        if order is None:
            continue
        size = a.numel()
        if len(order) not in by_rank or size > by_rank[len(order)][0]:
            by_rank[len(order)] = (size, order)
    return tuple(by_rank[r][1] if r in by_rank else None for r in out_ranks)
