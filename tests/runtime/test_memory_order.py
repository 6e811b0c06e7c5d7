"""``runtime.memory_order``: a region argument's memory order from its sizes and strides alone
(no permuted view made on every call), the same as the definition by a permuted view."""

from __future__ import annotations

import random

import torch

from fusecut.runtime.memory_order import memory_order, output_orders


def _by_permuted_view(t: torch.Tensor):
    """The definition: the axes by decreasing stride, if that permutation is row-major."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else None


def _layouts(count: int):
    """Permuted, gapped, narrowed, broadcast and unit-axis views of small tensors."""
    rng = random.Random(0)
    for _ in range(count):
        rank = rng.randint(1, 4)
        base = torch.empty([rng.choice([1, 2, 3, 4]) for _ in range(rank)])
        t = base.permute(rng.sample(range(rank), rank))
        kind = rng.randrange(5)
        if kind == 0 and t.shape[-1] > 1:
            t = t[..., ::2]  # gapped
        elif kind == 1 and t.shape[0] > 1:
            t = t.narrow(0, 0, t.shape[0] - 1)  # a gap between outer rows
        elif kind == 2:
            t = t.unsqueeze(rng.randint(0, t.dim()))  # a unit axis anywhere
        elif kind == 3:
            t = t.select(0, 0).unsqueeze(0).expand(3, *t.shape[1:])  # broadcast
        yield t


def test_memory_order_matches_the_permuted_view_definition():
    seen = set()
    for t in _layouts(3000):
        got = memory_order(t)
        assert got == _by_permuted_view(t), (tuple(t.shape), t.stride())
        seen.add(got is None)
    assert seen == {True, False}  # both kinds were drawn


def test_a_transposed_head_layout_and_the_outputs_that_follow_it():
    q = torch.empty(2, 16, 4, 8).transpose(1, 2)  # (b, h, s, d) over (b, s, h, d) memory
    assert memory_order(q) == (0, 2, 1, 3)
    assert memory_order(q.contiguous()) is None
    assert memory_order(torch.empty(4, 8)[:, ::2]) is None  # gapped: nothing to follow
    assert output_orders([q, torch.empty(3)], [memory_order(q), None], [4, 1, 3]) == \
        ((0, 2, 1, 3), None, None)
