"""Tiled transpose: pointwise segments whose tensors disagree on the innermost axis.

The pointwise kernel walks its domain along the innermost axis A. A tensor whose unit-stride
axis is another domain axis B (a permuted input, an input in another stride order, an output
laid out as a permute of the domain) is then read or written a row apart lane by lane: each
element costs a 32-byte sector of its own. The tiled scheme walks the domain in T x T tiles of
(B, A) instead: the inputs read along B are staged through shared-memory tiles, the block
computes along A, and the outputs laid out along B are written through tiles of their own
(``codegen.tiles`` writes that kernel). So both sides are coalesced.

This module decides the scheme, before any of the kernel is written: a survey of the compute
phase's accesses (the emitter run once with a load that only records), each access's address
step along every domain axis read off its typed index (``plain_step``), then B (the axis most
bytes of the mis-laid tensors walk with unit stride), what is staged (tensors that follow
neither axis, as a gather or a reshape's division, keep the direct reads), the tile edge, and
the staging and writing vector widths.

The index of every access is the emitter's (``codegen.emit``): the staging phase evaluates the
same index expressions with the tile's coordinates, so what a tile holds is exactly what the
compute phase reads at each position.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.codegen.code import Code, named
from fusecut.codegen.emit import Emitter
from fusecut.codegen.index import (
    LANE,
    ZERO,
    Add,
    Clamp,
    Const,
    Data,
    Index,
    IndexExpr,
    Mul,
    Paren,
    Sub,
    Var,
    lane_base,
    plus_lane,
    substitute,
    uses,
    variables,
    walk,
)
from fusecut.codegen.launch import segment_index_type, vector_width
from fusecut.codegen.layout import compact_strides, tensor_strides
from fusecut.codegen.names import Names
from fusecut.codegen.resize import NO_RESIZES, whole_vector_resizes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule

MIN_EXTENT = 16  # both tile axes at least this long, or tiles would be mostly empty
SMEM_LIMIT = 48 * 1024  # static shared memory of one block
TILES = (64, 32)  # tile edge, largest first: 64 keeps 8-16 KiB per block in flight


@dataclass(frozen=True)
class Access:
    """A tensor read or written at an index of the domain: ``steps[k]`` is how far its address
    moves when domain index k moves by one (None: not a fixed step, as a reshape's division)."""

    tensor: str
    idx: Index
    steps: tuple[int | None, ...]
    nbytes: int
    portable: bool  # the index names only domain indices: a staging phase can evaluate it

    def along(self, axis: int) -> bool:
        return self.steps[axis] == 1

    def follows(self, axis: int) -> bool:
        """Coalesced when walking ``axis``: unit step or not moving at all."""
        return self.steps[axis] in (0, 1)


def access_steps(idx: Index, strides: tuple[int, ...], axis_of: dict[IndexExpr, int], rank: int,
                 unfold) -> tuple[tuple[int | None, ...], bool]:
    """Per domain axis, the address step of an access at ``idx`` (its components indices of the
    domain variables ``axis_of`` maps to their axes; ``unfold`` folds the vector lane into its
    index), and whether the index reads nothing but them (a staging phase can evaluate it)."""
    steps: list[int | None] = [0] * rank
    portable = True
    for comp, s in zip(idx, strides):
        if s == 0 or comp == ZERO:
            continue
        comp = unfold(comp)
        if any(isinstance(n, Data) or (isinstance(n, Var) and n not in axis_of)
               for n in walk(comp)):
            portable = False
        hit = plain_step(comp, axis_of)
        if hit is not None:
            k, m = hit
            if steps[k] is not None:
                steps[k] += s * m
            continue
        for v in variables(comp):
            k = axis_of.get(Var(v))
            if k is not None:
                steps[k] = None
    return tuple(steps), portable


def plain_step(comp: IndexExpr, axis_of: dict[IndexExpr, int]) -> tuple[int, int] | None:
    """(k, m) where ``comp`` moves m elements per step of domain axis k, in one of the forms the
    emitter writes for a plain domain index xk (the vector lane folded in): the index itself
    ``xk``, a slice's step ``xk * m`` and offset ``(c + xk)``, ``(c + xk * m)``, a cat's or pad's
    shifted clamp ``fc_clampi<t>(xk, c)``, ``fc_clampi<t>((xk - c), c)``; None otherwise."""
    def scaled(e: IndexExpr) -> tuple[int, int] | None:
        if isinstance(e, Var) and e in axis_of:
            return axis_of[e], 1
        if (isinstance(e, Mul) and e.kids[0] in axis_of and isinstance(e.kids[1], Const)
                and e.kids[1].value >= 0):
            return axis_of[e.kids[0]], e.kids[1].value
        return None

    if isinstance(comp, (Var, Mul)):
        return scaled(comp)
    if isinstance(comp, Paren) and isinstance(comp.kids[0], Add):
        terms = comp.kids[0].kids
        if len(terms) == 2 and isinstance(terms[0], Const):
            return scaled(terms[1])
        return None
    if isinstance(comp, Clamp):
        x = comp.kids[0]
        if isinstance(x, Paren) and isinstance(x.kids[0], Sub) \
                and isinstance(x.kids[0].kids[1], Const):
            x = x.kids[0].kids[0]
        return (axis_of[x], 1) if isinstance(x, Var) and x in axis_of else None
    return None


@dataclass(frozen=True)
class TilePlan:
    """The scheme's choice: ``tile`` x ``tile`` tiles of axes (``b``, A); ``staged_reads``: the
    reads (input, index) staged along B; ``staged_writes``: the outputs written through tiles."""

    b: int
    staged_reads: tuple[tuple[str, Index], ...]
    staged_writes: tuple[str, ...]
    tile: int


class TransposeScheme:
    """The tiled scheme's decisions for one segment: the axis A its lanes walk, the vector width,
    every access of the compute phase (a survey: one run of the emitter whose loads only record)
    and, from them, the tile plan (``choose``) and each staged tensor's vector width."""

    def __init__(self, bound: Bound, schedule: Schedule, index: int, vector: int | None,
                 recomputed: frozenset[int]):
        self.bound, self.schedule, self.index = bound, schedule, index
        self.fusion = bound.fusion
        self.domain = list(schedule.domain)
        self.rank = len(self.domain)
        self.recomputed = recomputed
        self.vector = vector
        self.itype = segment_index_type(bound, schedule)
        # the innermost axis that moves: the compute phase's lanes walk it
        self.a = max(k for k, e in enumerate(self.domain) if e > 1)
        self.xs = [ZERO if e == 1 else Var(f"x{k}") for k, e in enumerate(self.domain)]
        self.axis_of = {x: k for k, x in enumerate(self.xs) if x != ZERO}
        self.vec = vector or vector_width(bound, list(schedule.inputs) + list(schedule.outputs),
                                          self.domain[self.a])
        self.lane_of = plus_lane(self.xs[self.a]) if self.vec > 1 else None
        self.domain_idx = tuple(self.lane_of if k == self.a and self.vec > 1 else x
                                for k, x in enumerate(self.xs))
        self.resizes = whole_vector_resizes(bound, schedule.ops, self.vec)
        self.reads_writes = self.accesses()
        if any(lane_base(i) is not None and lane_base(i) != self.xs[self.a]
               and not self.whole_vector(r.tensor, r.idx)
               for r in self.reads_writes[0] for i in r.idx):
            # a piece, or a split axis, read across its rows: read it lane by lane, so that it
            # can be staged
            self.resizes = NO_RESIZES
            self.reads_writes = self.accesses()

    def whole_vector(self, t: str, idx: Index) -> bool:
        """Whether input t is read at ``idx`` as one vector (the lanes walk its unit stride)."""
        lanes = [k for k, i in enumerate(idx) if uses(i, LANE)]
        strides = tensor_strides(self.bound, t)
        return (self.vec > 1 and len(lanes) == 1 and lane_base(idx[lanes[0]]) is not None
                and strides[lanes[0]] == 1
                and all(s % self.vec == 0 for k, s in enumerate(strides) if k != lanes[0]))

    def unfold(self, comp: IndexExpr) -> IndexExpr:
        """An index component with the vector lane folded into the innermost index: what the
        staging phase, which has no lanes, evaluates."""
        return substitute(comp, {self.lane_of: self.xs[self.a]}) if self.lane_of else comp

    # ---- what is read and written, and along which axis --------------------------------------

    def out_idx(self, t: str) -> Index:
        return tuple(ZERO if m is None else self.domain_idx[m] for m in self.schedule.axis_map[t])

    def accesses(self) -> tuple[list[Access], list[Access]]:
        """Every input read the compute phase makes (a dry run of the emitter) and every output
        write."""
        reads: list[Access] = []

        def record(t: str, idx: Index) -> Code:
            steps, portable = access_steps(idx, tensor_strides(self.bound, t), self.axis_of,
                                           self.rank, self.unfold)
            reads.append(Access(t, idx, steps, self.bound.nbytes(t), portable))
            return named(f"ld{len(reads)}")

        em = Emitter(self.bound, self.schedule.ops, set(self.schedule.inputs), record,
                     self.itype, Names(), resizes=self.resizes)
        for t in self.schedule.outputs:
            em.raw(t, self.out_idx(t))
        writes = []
        for t in self.schedule.outputs:
            idx = self.out_idx(t)
            steps, _ = access_steps(idx, compact_strides(self.bound, t), self.axis_of, self.rank,
                                    self.unfold)
            writes.append(Access(t, idx, steps, self.bound.nbytes(t), True))
        return reads, writes

    def full_cover(self, t: str) -> bool:
        """An output that maps every moving domain axis, at full extent: a tile of it is a tile
        of the domain."""
        amap, shape = self.schedule.axis_map[t], self.bound.shapes[t]
        covered = {m: shape[a] for a, m in enumerate(amap) if m is not None}
        return all(covered.get(k) == e for k, e in enumerate(self.domain) if e > 1)

    def choose(self) -> TilePlan | None:
        """The tiles (axis B, staged reads and writes, tile edge), or None when no tensor needs
        a tile."""
        a = self.a
        if self.domain[a] < MIN_EXTENT:
            return None
        reads, writes = self.reads_writes
        weight: dict[int, int] = {}
        for acc in reads + writes:
            if acc.follows(a):
                continue
            for k, s in enumerate(acc.steps):
                if k != a and s == 1 and self.domain[k] >= MIN_EXTENT:
                    weight[k] = weight.get(k, 0) + acc.nbytes
        if not weight:
            return None
        b = max(sorted(weight), key=lambda k: weight[k])
        staged_reads = list(dict.fromkeys(
            (r.tensor, r.idx) for r in reads if r.portable and r.along(b) and not r.follows(a)))
        staged_writes = [w.tensor for w in writes
                         if w.along(b) and not w.follows(a) and self.full_cover(w.tensor)]
        for tile in TILES:
            smem = sum(self.tile_bytes(t, tile) for t, _ in staged_reads) + \
                sum(self.tile_bytes(t, tile) for t in staged_writes)
            if smem <= SMEM_LIMIT:
                return TilePlan(b, tuple(staged_reads), tuple(staged_writes), tile)
        return None

    def tile_bytes(self, t: str, tile: int) -> int:
        return tile * self.row_pitch(t, tile) * self.fusion.tensors[t].dtype.itemsize

    def row_pitch(self, t: str, tile: int) -> int:
        """Elements per shared-memory tile row: the tile plus 4 bytes (an odd word count)."""
        size = self.fusion.tensors[t].dtype.itemsize
        return tile + max(1, 4 // size)

    def stage_vector(self, t: str, idx: Index, b: int, tile: int) -> int:
        """Vector width of a staging read along B: 16 bytes where the B index is plain and
        every other step keeps vectors aligned."""
        if self.vector == 1:
            return 1
        strides = tensor_strides(self.bound, t)
        size = self.fusion.tensors[t].dtype.itemsize
        v = min(16 // size, tile)
        plain = [self.unfold(comp) for comp in idx]
        xb = self.xs[b].name
        while v > 1:
            ok = self.domain[b] % v == 0 and all(
                (comp == self.xs[b] and s == 1) or (not uses(comp, xb) and
                                                     (s % v == 0 or comp == ZERO))
                for comp, s in zip(plain, strides))
            if ok and any(comp == self.xs[b] for comp in plain):
                return v
            v //= 2
        return 1

    def write_vector(self, t: str, b: int, tile: int) -> int:
        if self.vector == 1:
            return 1
        size = self.fusion.tensors[t].dtype.itemsize
        strides = compact_strides(self.bound, t)
        amap = self.schedule.axis_map[t]
        v = min(16 // size, tile)
        while v > 1:
            if self.domain[b] % v == 0 and all(m == b or s % v == 0
                                               for m, s in zip(amap, strides)):
                return v
            v //= 2
        return 1
