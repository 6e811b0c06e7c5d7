"""Slices, pads and cats that move whole vectors: which of a kernel's resizes keep its vector
lanes together.

A kernel's lanes cover ``width`` consecutive elements of the innermost axis, starting at a
multiple of the width. Along an axis where a slice starts at a multiple of the width, a pad adds
a multiple of it before the data, or a cat joins pieces whose extents are multiples of it (the
common case: a 128-wide head split into halves of 64), every vector falls inside one piece or in
the padding. The emitter (``codegen.emit``) then reads it as one aligned vector of that piece
(or takes the pad value), chosen once per vector; along any other axis it selects and clamps
lane by lane.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Ref
from fusecut.optimizer.ir.ops_shape import pad_widths_by_axis, slice_bounds


@dataclass(frozen=True)
class VectorResizes:
    """``width`` lanes a vector; ``axes``: the (output tensor, axis) of every resize along which
    vectors stay whole."""

    width: int = 1
    axes: frozenset[tuple[str, int]] = frozenset()

    def whole(self, tensor: str, axis: int) -> bool:
        return self.width > 1 and (tensor, axis) in self.axes


NO_RESIZES = VectorResizes()


def whole_vector_resizes(bound: Bound, ops: Iterable[int], width: int) -> VectorResizes:
    """The resizes among ``ops`` that keep vectors of ``width`` lanes whole, axis by axis: every
    offset and extent the resize involves along the axis is a multiple of the width."""
    if width <= 1:
        return NO_RESIZES
    axes = set()
    for i in ops:
        op = bound.fusion.ops[i]
        if op.name in ("slice", "pad", "cat"):
            out = op.outputs[0]
            axes.update((out, a) for a in _whole_axes(bound, op, width))
    return VectorResizes(width, frozenset(axes))


def _whole_axes(bound: Bound, op, width: int) -> list[int]:
    def whole(*xs: int) -> bool:
        return all(x >= 0 and x % width == 0 for x in xs)

    def value(x) -> int:
        return int(bound.scalars[x.name]) if isinstance(x, Ref) else int(x)

    src = bound.shapes[op.inputs[0]]
    out = bound.shapes[op.outputs[0]]
    if op.name == "cat":
        dim = op.attrs["dim"] % len(out)
        return [dim] if whole(*(bound.shapes[t][dim] for t in op.inputs)) else []
    if op.name == "slice":
        steps = op.attrs["strides"] or [1] * len(src)
        found = []
        for a, e in enumerate(src):
            start, _ = slice_bounds(e, value(op.attrs["start_indices"][a]),
                                    value(op.attrs["end_indices"][a]),
                                    op.attrs["manual_normalization"])
            if steps[a] == 1 and whole(start, e, out[a]):
                found.append(a)
        return found
    widths = [value(w) for w in op.attrs["pad_widths"]]
    return [a for a, (lo, hi) in enumerate(pad_widths_by_axis(len(src), widths))
            if whole(lo, src[a], out[a]) and hi >= 0]
