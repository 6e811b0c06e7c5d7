"""Concrete metadata of fusion inputs: what a planner needs instead of real tensors.

A tensor input is described by shape, strides and dtype (strides of 0 mark broadcast storage: a
stride-0 axis is read once however long it is). ``fill`` records how a repro's ``inputs = [...]``
list made the tensor (``randn``, ``rand``, ``randint`` ...) so tests and benchmarks can build
real tensors of the same kind. A scalar input carries its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fusecut.optimizer.ir.dtypes import DType


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType
    fill: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def stored_numel(self) -> int:
        """Distinct elements the strides touch: stride-0 axes count once."""
        if self.numel == 0:
            return 0
        return math.prod(e for e, s in zip(self.shape, self.strides) if s != 0)

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes(self.stored_numel)


@dataclass(frozen=True)
class ScalarMeta:
    dtype: DType
    value: bool | int | float | complex | None = None


InputMeta = TensorMeta | ScalarMeta


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for e in reversed(shape):
        strides.append(acc)
        acc *= max(e, 1)
    return tuple(reversed(strides))


def tensor_meta(shape, dtype: DType, strides=None, **fill: Any) -> TensorMeta:
    shape = tuple(int(e) for e in shape)
    strides = contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
    return TensorMeta(shape, strides, dtype, dict(fill))


def scale_metas(metas: list[InputMeta], max_numel: int,
                keep: frozenset[int] = frozenset()) -> list[InputMeta]:
    """The same inputs with every extent shrunk by one factor until each tensor has at most
    ``max_numel`` elements (or none can shrink more); equal extents stay equal, extents in
    ``keep`` keep their size, and stride-0 axes stay stride 0 (for tests that need small
    tensors of the same structure; ``analysis.shapes.shrink_inputs`` keeps the extents a
    definition fixes)."""
    largest = max((m.numel for m in metas if isinstance(m, TensorMeta)), default=0)
    if largest <= max_numel:
        return list(metas)
    factor = 1
    while True:
        factor *= 2
        new = [_scaled_shape(m.shape, factor, keep) for m in metas
               if isinstance(m, TensorMeta)]
        if max((math.prod(s) for s in new), default=0) <= max_numel or factor > 1 << 30:
            break
    out: list[InputMeta] = []
    for m in metas:
        if not isinstance(m, TensorMeta):
            out.append(m)
            continue
        shape = _scaled_shape(m.shape, factor, keep)
        # keep the order of the strides, recompute them densely over the stored axes
        order = sorted((i for i in range(m.rank) if m.strides[i] != 0),
                       key=lambda i: (m.strides[i], i))
        strides = [0] * m.rank
        acc = 1
        for i in order:
            strides[i] = acc
            acc *= max(shape[i], 1)
        out.append(TensorMeta(shape, tuple(strides), m.dtype, m.fill))
    return out


def _scaled_shape(shape: tuple[int, ...], factor: int,
                  keep: frozenset[int] = frozenset()) -> tuple[int, ...]:
    return tuple(e if e <= 8 or e in keep else max(8, e // factor) for e in shape)
