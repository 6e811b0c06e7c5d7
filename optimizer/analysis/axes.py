"""Which axes of which tensors iterate together: a union-find over (tensor, axis) pairs.

Within a set of ops, an elementwise op ties each of its output's axes to the aligned axes of its
operands; broadcast_in_dim, broadcast, expand, squeeze, permute and reductions tie the axes they
keep. Broadcast axes (concretely: extent 1 or expanded) carry no iteration and are never tied.
View ops that re-index data (slice, pad, cat, gathers, and reshapes that regroup elements) tie
nothing: their outputs start new axes. A reshape that only splits axes ([N, C, H, W] -> [N, G, C/G,
H, W], as group norm views its channels) or merges them back ties the axes it keeps and records
the split axis as *compound*: the run of axes it is made of, outer first. This is nvFuser's exact
map, restricted to what a segment needs: a reduction segment is well formed when every tensor's
axes land on the axes of one reduction domain, each on one axis or on a run of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.opspec import OpClass, get_spec

AxisKey = tuple[str, int]
Span = tuple[tuple[int, ...], tuple[int, ...]]
# Where a tensor axis lands on a segment's domain: one domain axis, a run of them (a compound
# axis), or nowhere (a broadcast axis).
AxisEntry = int | tuple[int, ...] | None


def domain_axes(entry: AxisEntry) -> tuple[int, ...]:
    """The domain axes an axis-map entry covers: none, one, or a run."""
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def reshape_spans(src: tuple[int, ...], dst: tuple[int, ...]) -> list[Span] | None:
    """How a row-major reshape from ``src`` to ``dst`` regroups axes, as (source axes, target
    axes) spans of equal element counts, each one-to-one, one-to-many (a split) or many-to-one
    (a merge); extent-1 axes belong to no span. None when some span is many-to-many (the
    elements are regrouped: [6, 4] -> [4, 6]) or the tensor is empty."""
    if 0 in src or 0 in dst:
        return None
    a = [k for k, e in enumerate(src) if e != 1]
    b = [k for k, e in enumerate(dst) if e != 1]
    spans: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        ins, outs = [a[i]], [b[j]]
        pa, pb = src[a[i]], dst[b[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                if i == len(a):
                    return None
                ins.append(a[i])
                pa *= src[a[i]]
                i += 1
            else:
                if j == len(b):
                    return None
                outs.append(b[j])
                pb *= dst[b[j]]
                j += 1
        if len(ins) > 1 and len(outs) > 1:
            return None
        spans.append((tuple(ins), tuple(outs)))
    if i != len(a) or j != len(b):
        return None
    return spans


class AxisMap:
    """The ties of a set of ops. Segmenters that grow segments by merging keep one map per
    group: ``fork`` one, ``absorb`` the other group's map into the fork to try a merge, and
    ``commit`` the fork to keep it; the merged map is never rebuilt from the ops."""

    def __init__(self, bound: Bound, ops: Iterable[Op] = ()):
        self.bound = bound
        self._parent: dict[AxisKey, AxisKey] = {}
        self._origin: AxisMap | None = None  # the map this one was forked from
        self._base: dict[AxisKey, AxisKey] | None = None  # its table, read here, never written
        self._ids: dict[str, tuple[AxisKey | None, ...]] = {}  # until the next tie
        # a split or merged axis -> the run of finer axes it is made of (see reshape_spans)
        self._compound: list[tuple[AxisKey, tuple[AxisKey, ...]]] = []
        for op in ops:
            self._tie_op(op)
        self._tie_compounds()

    # ---- incremental merging --------------------------------------------------------------------

    def size(self) -> int:
        """Ties recorded (a merge absorbs the smaller map into the larger)."""
        return len(self._parent) + (len(self._base) if self._base is not None else 0)

    def fork(self) -> AxisMap:
        child = AxisMap(self.bound)
        child._origin, child._base = self, self._parent
        child._compound = list(self._compound)  # few: one per split or merged axis
        return child

    def absorb(self, other: AxisMap) -> None:
        """Add another map's ties (the classes of the union of both maps' ops)."""
        for key, parent in other._items():
            if key != parent:
                self._union(key, parent)
        # (a forwarded op may be in both groups: its record once)
        self._compound = list(dict.fromkeys(self._compound + other._compound))
        if len(self._compound) > 1:  # the union may now split one compound axis alike twice
            self._tie_compounds()

    def commit(self) -> AxisMap:
        """Write a fork's ties into the map it was forked from; returns that map."""
        origin = self._origin
        assert origin is not None, "only a fork can be committed"
        origin._parent.update(self._parent)
        origin._compound = self._compound
        origin._ids.clear()
        self._parent, self._origin, self._base = {}, None, None  # spent
        return origin

    def _items(self):
        if self._base is not None:
            yield from ((k, v) for k, v in self._base.items() if k not in self._parent)
        yield from self._parent.items()

    # ---- union-find -------------------------------------------------------------------------

    def _parent_of(self, key: AxisKey) -> AxisKey:
        parent = self._parent.get(key)
        if parent is None and self._base is not None:
            parent = self._base.get(key)
        return key if parent is None else parent

    def _find(self, key: AxisKey) -> AxisKey:
        root = key
        parent = self._parent_of(root)
        while parent != root:
            root, parent = parent, self._parent_of(parent)
        while key != root:  # path compression (a fork writes only its own table)
            parent = self._parent_of(key)
            if parent != root:
                self._parent[key] = root
            key = parent
        return root

    def _union(self, a: AxisKey, b: AxisKey) -> None:
        if self.is_broadcast(a) or self.is_broadcast(b):
            return
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            # the smaller key wins so that ids do not depend on the order of ties
            lo, hi = (ra, rb) if ra <= rb else (rb, ra)
            self._parent[hi] = lo
            self._ids.clear()

    def tie(self, a: AxisKey, b: AxisKey) -> None:
        """Tie two axes outside the per-op rules (a fork's, for one classification)."""
        self._union(a, b)

    def is_broadcast(self, key: AxisKey) -> bool:
        return self.bound.broadcast[key[0]][key[1]]

    def root(self, tensor: str, axis: int) -> AxisKey | None:
        """The id of an axis, or None for a broadcast axis."""
        if self.is_broadcast((tensor, axis)):
            return None
        return self._find((tensor, axis))

    def ids(self, tensor: str) -> tuple[AxisKey | None, ...]:
        hit = self._ids.get(tensor)
        if hit is None:
            hit = self._ids[tensor] = tuple(self.root(tensor, a)
                                            for a in range(len(self.bound.shapes[tensor])))
        return hit

    def parts(self, axis_id: AxisKey) -> tuple[AxisKey, ...] | None:
        """The ids of the run of axes a compound axis is made of, outer first (None if the axis
        is not compound)."""
        for coarse, fine in self._compound:
            if self._find(coarse) == axis_id:
                return tuple(self._find(k) for k in fine)
        return None

    def _tie_compounds(self) -> None:
        """Two records of one compound axis, split alike, tie their parts axis by axis."""
        changed = True
        while changed:
            changed = False
            seen: dict[tuple, tuple[AxisKey, ...]] = {}
            for coarse, fine in self._compound:
                extents = tuple(self.bound.shapes[t][a] for t, a in fine)
                key = (self._find(coarse), extents)
                if key not in seen:
                    seen[key] = fine
                    continue
                for x, y in zip(seen[key], fine):
                    if self._find(x) != self._find(y):
                        self._union(x, y)
                        changed = True

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
        elif op.name == "reshape":
            src, dst = tensors[0], outs[0]
            spans = reshape_spans(bound.shapes[src], bound.shapes[dst])
            for ins, outs_ in spans or ():
                keys_in = [(src, a) for a in ins]
                keys_out = [(dst, j) for j in outs_]
                if any(self.is_broadcast(k) for k in keys_in + keys_out):
                    continue
                if len(ins) == len(outs_) == 1:
                    self._union(keys_in[0], keys_out[0])
                elif len(ins) == 1:
                    self._compound.append((keys_in[0], tuple(keys_out)))
                else:
                    self._compound.append((keys_out[0], tuple(keys_in)))
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
