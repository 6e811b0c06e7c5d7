"""Which axes of which tensors iterate together: a union-find over (tensor, axis) pairs.

Within a set of ops, an elementwise op ties each of its output's axes to the aligned axes of its
operands; broadcast_in_dim, broadcast, expand, squeeze, permute and reductions tie the axes they
keep. Broadcast axes (concretely: extent 1 or expanded) carry no iteration and are never tied.
View ops that re-index data (reshape, slice, pad, cat, gathers) tie nothing: their outputs start
new axes. This is nvFuser's exact map, restricted to what a segment needs: a reduction segment is
well formed when every tensor's axes land on the axes of one reduction domain.
"""

from __future__ import annotations

from collections.abc import Iterable

from optimizer.analysis.shapes import Bound
from optimizer.ir.fusion import Op
from optimizer.ir.ops_misc import reduction_axes
from optimizer.ir.opspec import OpClass, get_spec

AxisKey = tuple[str, int]


class AxisMap:
    def __init__(self, bound: Bound, ops: Iterable[Op]):
        self.bound = bound
        self._parent: dict[AxisKey, AxisKey] = {}
        for op in ops:
            self._tie_op(op)

    # ---- union-find -------------------------------------------------------------------------

    def _find(self, key: AxisKey) -> AxisKey:
        parent = self._parent.setdefault(key, key)
        if parent != key:
            root = self._find(parent)
            self._parent[key] = root
            return root
        return key

    def _union(self, a: AxisKey, b: AxisKey) -> None:
        if self.is_broadcast(a) or self.is_broadcast(b):
            return
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            # the smaller key wins so that ids do not depend on the order of ties
            lo, hi = (ra, rb) if ra <= rb else (rb, ra)
            self._parent[hi] = lo

    def is_broadcast(self, key: AxisKey) -> bool:
        return self.bound.broadcast[key[0]][key[1]]

    def root(self, tensor: str, axis: int) -> AxisKey | None:
        """The id of an axis, or None for a broadcast axis."""
        if self.is_broadcast((tensor, axis)):
            return None
        return self._find((tensor, axis))

    def ids(self, tensor: str) -> list[AxisKey | None]:
        return [self.root(tensor, a) for a in range(len(self.bound.shapes[tensor]))]

    # ---- per-op ties ----------------------------------------------------------------------------

    def _tie_op(self, op: Op) -> None:
        bound = self.bound
        spec = get_spec(op.name)
        outs = [o for o in op.outputs if o in bound.shapes]
        if not outs:
            return
        tensors = [n for n in op.inputs if n in bound.shapes]
        cls = spec.op_class
        if cls is OpClass.POINTWISE or op.name in ("segment_set", "expand"):
            for out in outs:
                rank = len(bound.shapes[out])
                for t in tensors:
                    off = rank - len(bound.shapes[t])
                    for a in range(len(bound.shapes[t])):
                        self._union((out, off + a), (t, a))
        elif op.name == "broadcast_in_dim":
            for i, d in enumerate(op.attrs["broadcast_dims"]):
                self._union((outs[0], d), (tensors[0], i))
        elif op.name == "broadcast":
            kept = [j for j, f in enumerate(op.attrs["is_broadcast_dim"]) if not f]
            for i, j in enumerate(kept):
                self._union((outs[0], j), (tensors[0], i))
        elif op.name == "squeeze":
            rank = len(bound.shapes[tensors[0]])
            dims = {d % rank for d in op.attrs["dims"]}
            kept = [a for a in range(rank) if a not in dims]
            for j, a in enumerate(kept):
                self._union((outs[0], j), (tensors[0], a))
        elif op.name == "permute":
            for j, a in enumerate(op.attrs["dims"]):
                self._union((outs[0], j), (tensors[0], a % len(bound.shapes[tensors[0]])))
        elif cls is OpClass.REDUCTION:
            src = tensors[0]
            rank = len(bound.shapes[src])
            axes = set(reduction_axes(op.attrs, rank))
            for out in outs:
                if op.attrs["keepdim"]:
                    pairs = [(a, a) for a in range(rank) if a not in axes]
                else:
                    pairs = list(enumerate(a for a in range(rank) if a not in axes))
                for j, a in pairs:
                    self._union((out, j), (src, a))
