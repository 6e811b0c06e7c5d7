"""Tiled transpose: pointwise segments whose tensors disagree on the innermost axis.

The pointwise kernel walks its domain along the innermost axis A. A tensor whose unit-stride
axis is another domain axis B (a permuted input, an input in another stride order, an output
laid out as a permute of the domain) is then read or written a row apart lane by lane: each
element costs a 32-byte sector of its own. This scheme walks the domain in T x T tiles of
(B, A), one tile per block step, in three phases:

1. stage: every such input is read along B (16-byte vectors where its layout allows) into a
   shared-memory tile ``s_k[b][a]``;
2. compute: the block walks the tile along A, as the pointwise kernel does (vector loads and
   stores of the tensors that follow A), reading the staged inputs from their tiles and writing
   the outputs laid out along B into tiles of their own;
3. write: those outputs are stored along B.

So both sides are coalesced. The shared-memory rows are padded by 4 bytes (an odd number of
words per row), so that walking a tile's column does not hit one bank. Which axis is B is the
one most bytes of the mis-laid tensors walk with unit stride; tensors that follow neither axis
(a gather, a reshape's division) keep the pointwise kernel's direct reads.

The index of every access is the emitter's (``codegen.emit``): the staging phase evaluates the
same index expressions with the tile's coordinates, so what a tile holds is exactly what the
compute phase reads at each position.

Batched tiles: a block takes consecutive tiles, batch index fastest, so that inputs broadcast
over the batch come from L1. A batch axis that every load names only divided by g (a repeat, as
grouped-query attention's k heads for g query heads each) gives g tiles of equal values: the
block computes one and writes it to the g copies (``repeated_axis``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fusecut.codegen import cuda
from fusecut.codegen.code import (
    Code,
    Stmt,
    declare,
    derived,
    indent,
    lines,
    loaded,
    named,
    stmt,
)
from fusecut.codegen.emit import Emitter, Names
from fusecut.codegen.index import (
    LANE,
    ZERO,
    Add,
    All,
    Clamp,
    Const,
    Data,
    Equal,
    Index,
    IndexExpr,
    Mul,
    Paren,
    Sub,
    Var,
    at_lane_zero,
    lane_base,
    plus_lane,
    substitute,
    uses,
    variables,
    walk,
)
from fusecut.codegen.kernel import (
    Kernel,
    SegmentKernels,
    kernel_code,
    signature,
    tensor_params,
)
from fusecut.codegen.launch import segment_index_type, vector_width
from fusecut.codegen.layout import (
    address,
    compact_strides,
    covering_grid,
    decompose,
    index_typedefs,
    tensor_strides,
)
from fusecut.codegen.precision import fast_math_tensors
from fusecut.codegen.regions import lane_loop, shorter_axes, vector_read
from fusecut.codegen.resize import NO_RESIZES, whole_vector_resizes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile

THREADS = 256
MIN_EXTENT = 16  # both tile axes at least this long, or tiles would be mostly empty
SMEM_LIMIT = 48 * 1024  # static shared memory of one block
# Consecutive tiles a block takes where the domain has batch axes, the batch index fastest: the
# tiles share their window of inputs broadcast over the batch (RoPE's cos and sin tables), which
# then comes from L1 instead of L2 (H100, rope_fwd_thunder: 179 us against 189 at one tile a
# block; 4 and 16 were slower than 8).
TILES_PER_BLOCK = 8
MIN_RUN_BLOCKS = 1024  # blocks the grid keeps when it does (rope_fwd_thunder: 1024)
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


@dataclass(frozen=True)
class TilePhase:
    """How THREADS threads cover a T x T tile, ``vec`` consecutive elements each along the fast
    axis: thread t takes fast position ``(t % per_row) * vec`` and slow positions
    ``t / per_row + it * rows`` for it < iters (those past the tile do nothing)."""

    tile: int
    vec: int

    @property
    def per_row(self) -> int:
        return self.tile // self.vec

    @property
    def rows(self) -> int:
        return THREADS // self.per_row

    @property
    def iters(self) -> int:
        return -(-self.tile // self.rows)

    def fast(self) -> str:
        return f"(int)(threadIdx.x % {self.per_row}) * {self.vec}"

    def slow(self, it: str) -> str:
        return f"(int)(threadIdx.x / {self.per_row}) + {it} * {self.rows}"


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

    if isinstance(comp, Var):
        return scaled(comp)
    if isinstance(comp, Mul):
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


class _Tiled:
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

    def choose(self):
        """(B, staged reads, staged writes, tile edge), or None when no tensor needs a tile."""
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
                return b, staged_reads, staged_writes, tile
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

    # ---- the kernel ---------------------------------------------------------------------------

    def build(self) -> SegmentKernels | None:
        picked = self.choose()
        if picked is None:
            return None
        b, staged_reads, staged_writes, tile = picked
        a = self.a
        fusion, sched = self.fusion, self.schedule
        xa, xb = self.xs[a], self.xs[b]
        vec = self.vec
        aligned: dict[str, int] = {}
        smem_decls: list[Stmt] = []
        tile_of: dict[tuple[str, Index], str] = {}
        for k, key in enumerate(staged_reads):
            st = cuda.storage(fusion.tensors[key[0]].dtype)
            tile_of[key] = f"s{k}_{key[0]}"
            smem_decls.append(Stmt(f"__shared__ {st} {tile_of[key]}[{tile}]"
                                   f"[{self.row_pitch(key[0], tile)}];  // {key[0]}, read along "
                                   f"axis {b}"))
        out_tile = {}
        for t in staged_writes:
            st = cuda.storage(fusion.tensors[t].dtype)
            out_tile[t] = f"so_{t}"
            smem_decls.append(Stmt(f"__shared__ {st} {out_tile[t]}[{tile}]"
                                   f"[{self.row_pitch(t, tile)}];  // {t}, written along axis {b}"))

        # phase 1: stage the inputs read along B
        stage_loads, stage_stores = [], []
        for k, key in enumerate(staged_reads):
            t, idx = key
            d = fusion.tensors[t].dtype
            st = cuda.storage(d)
            v = self.stage_vector(t, idx, b, tile)
            ph = TilePhase(tile, v)
            where = address(tuple(self.unfold(c) for c in idx), tensor_strides(self.bound, t))
            reg = f"r{k}"
            pos = _tile_position(ph, (xa, "a0", a), (xb, "b0", b))
            inside = derived(f"sl < {tile} && {xa} < {self.domain[a]} && {xb} < "
                             f"{self.domain[b]}", "sl", xa, xb)
            if v > 1:
                stage_loads.append(Stmt(f"fc_vec<{st}, {v}> {reg}[{ph.iters}];"))
                load = stmt(f"{reg}[it] = *reinterpret_cast<const fc_vec<{st}, {v}>*>(in_{t} + "
                            f"{where});", where)
                put = lines("#pragma unroll") + [
                    stmt(f"for (int j = 0; j < {v}; ++j) {tile_of[key]}[fa + j][sl] = "
                         f"{reg}[it].v[j];", "fa", "sl")]
                aligned[t] = max(aligned.get(t, 1), v * d.itemsize)
            else:
                stage_loads.append(Stmt(f"{st} {reg}[{ph.iters}];"))
                load = stmt(f"{reg}[it] = in_{t}[{where}];", where)
                put = [stmt(f"{tile_of[key]}[fa][sl] = {reg}[it];", "fa", "sl")]
            stage_loads += _tile_loop(ph.iters, pos, inside, [load], f"{t}: read along axis {b}")
            stage_stores += _tile_loop(ph.iters, pos[:2],
                                       derived(f"sl < {tile} && b0 + fa < {self.domain[b]} && "
                                               f"a0 + sl < {self.domain[a]}", "sl", "fa", "a0",
                                               "b0"), put, f"{t}: into its tile")

        # phase 2: compute along A
        pre: list[Stmt] = []
        decls: list[Stmt] = []
        vec_loads: dict[tuple, str] = {}
        cph = TilePhase(tile, vec)

        def load(t: str, idx: Index) -> Code:
            d = fusion.tensors[t].dtype
            if (t, idx) in tile_of:
                if vec > 1:
                    return loaded(f"{tile_of[(t, idx)]}[sl][fa + {LANE}]", d, "sl", "fa", LANE)
                return loaded(f"{tile_of[(t, idx)]}[sl][fa]", d, "sl", "fa", simple=True)
            strides = tensor_strides(self.bound, t)
            st, ct = cuda.storage(d), cuda.compute(d)
            where = address(idx, strides)
            if not any(uses(i, LANE) for i in idx):
                fresh = em.names.fresh(f"ld_{t}")
                decls.append(Stmt(f"{ct} {fresh}[{cph.iters}];"))
                pre.append(stmt(f"{fresh}[it] = {loaded(f'in_{t}[{where}]', d)};", where))
                return Code(f"{fresh}[it]", frozenset({fresh}), True)
            lanes = [k for k, i in enumerate(idx) if uses(i, LANE)]
            if self.whole_vector(t, idx):
                base = tuple(at_lane_zero(i) if k == lanes[0] else i for k, i in enumerate(idx))
                if (t, base) not in vec_loads:
                    vname = em.names.fresh(f"vec_{t}")
                    decls.append(Stmt(f"fc_vec<{st}, {vec}> {vname}[{cph.iters}];"))
                    first, guard = address(base, strides), em.lane_guard(idx[lanes[0]])
                    read = vector_read(st, vec, f"in_{t} + {first}", guard)
                    pre.append(stmt(f"{vname}[it] = {read};", first, guard))
                    vec_loads[(t, base)] = vname
                    aligned[t] = max(aligned.get(t, 1), vec * d.itemsize)
                vname = vec_loads[(t, base)]
                return loaded(f"{vname}[it].v[{LANE}]", d, vname, LANE, simple=True)
            return em.let_load(t, loaded(f"in_{t}[{where}]", d, where))

        em = Emitter(self.bound, sched.ops, set(sched.inputs), load, self.itype,
                     Names(self.recomputed), fast_math_tensors(self.bound, sched),
                     resizes=self.resizes)
        out_decls: list[Stmt] = []
        stores_after: list[Stmt] = []
        for t in sched.outputs:
            d = fusion.tensors[t].dtype
            idx = self.out_idx(t)
            val = em.raw(t, idx)
            if t in out_tile:
                cell = f"{out_tile[t]}[sl][fa + {LANE}]" if vec > 1 else f"{out_tile[t]}[sl][fa]"
                em.lines.append(stmt(f"{cell} = {cuda.to_storage(val, d)};", "sl", "fa",
                                     LANE if vec > 1 else None, val))
                continue
            strides = compact_strides(self.bound, t)
            lanes = [k for k, i in enumerate(idx) if uses(i, LANE)]
            amap = sched.axis_map[t]
            if (vec > 1 and self.full_cover(t) and len(lanes) == 1
                    and strides[lanes[0]] == 1
                    and all(s % vec == 0 for k, s in enumerate(strides) if k != lanes[0])):
                st = cuda.storage(d)
                out_decls.append(Stmt(f"fc_vec<{st}, {vec}> o_{t};"))
                em.lines.append(stmt(f"o_{t}.v[{LANE}] = {cuda.to_storage(val, d)};", LANE, val))
                base = tuple(xa if k == lanes[0] else i for k, i in enumerate(idx))
                where = address(base, strides)
                stores_after.append(stmt(f"*reinterpret_cast<fc_vec<{st}, {vec}>*>(out_{t} + "
                                         f"{where}) = o_{t};", where))
                aligned[t] = max(aligned.get(t, 1), vec * d.itemsize)
                continue
            guards = []
            covered = {m for m in amap if m is not None}
            for k, e in enumerate(self.domain):
                if k not in covered and e > 1:
                    guards.append(Equal(self.domain_idx[k], ZERO))
            where = address(idx, strides)
            store = f"out_{t}[{where}] = {cuda.to_storage(val, d)};"
            em.lines.append(stmt(f"if ({All(*guards)}) {store}" if guards else store, guards,
                                 where, val))
        cpos = _tile_position(cph, (xb, "b0", b), (xa, "a0", a))
        cinside = derived(f"sl < {tile} && {xa} < {self.domain[a]} && {xb} < {self.domain[b]}",
                          "sl", xa, xb)
        body_lines = out_decls + lane_loop(vec, lines("// per element") + em.lines) + \
            stores_after
        direct_loads = decls + (_tile_loop(cph.iters, cpos, cinside, pre,
                                           f"loads along axis {a}") if pre else [])
        compute = _tile_loop(cph.iters, cpos, cinside, body_lines, "compute and store")

        batch_axes = [k for k, e in enumerate(self.domain) if k not in (a, b) and e > 1]
        repeat = repeated_axis([str(x) for x in self.xs], self.domain, batch_axes,
                               [s.text for s in stage_loads + direct_loads + stage_stores +
                                compute])
        if staged_writes != list(sched.outputs):
            repeat = None  # an output the compute phase stores needs its own tile per copy
        copies = repeat[1] if repeat else 1

        # phase 3: outputs along B (to every copy along a repeated axis)
        writes: list[Stmt] = []
        for t in staged_writes:
            d = fusion.tensors[t].dtype
            st = cuda.storage(d)
            v = self.write_vector(t, b, tile)
            ph = TilePhase(tile, v)
            idx = tuple((self.xs[m] if repeat is None or m != repeat[0] else
                         Paren(Add(self.xs[m], Var("rep")))) if m is not None else ZERO
                        for m in sched.axis_map[t])
            where = address(idx, compact_strides(self.bound, t))
            copy_loop = [] if repeat is None else \
                lines("#pragma unroll", f"for (int rep = 0; rep < {copies}; ++rep)")
            pos = _tile_position(ph, (xa, "a0", a), (xb, "b0", b))
            inside = derived(f"sl < {tile} && {xa} < {self.domain[a]} && {xb} < "
                             f"{self.domain[b]}", "sl", xa, xb)
            if v > 1:
                put = [Stmt(f"fc_vec<{st}, {v}> w;"), *lines("#pragma unroll"),
                       stmt(f"for (int j = 0; j < {v}; ++j) w.v[j] = {out_tile[t]}[fa + j][sl];",
                            "fa", "sl")] + copy_loop + [
                       stmt(f"*reinterpret_cast<fc_vec<{st}, {v}>*>(out_{t} + {where}) = w;",
                            where)]
                aligned[t] = max(aligned.get(t, 1), v * d.itemsize)
            else:
                put = [declare(st, "w", f"{out_tile[t]}[fa][sl]", reads=("fa", "sl"))] + \
                    copy_loop + [stmt(f"out_{t}[{where}] = w;", where, "w")]
            writes += _tile_loop(ph.iters, pos, inside, put, f"{t}: written along axis {b}")

        params = tensor_params(self.bound, sched.inputs, sched.outputs, em.params)
        tiles_a = -(-self.domain[a] // tile)
        tiles_b = -(-self.domain[b] // tile)
        extents = [self.domain[k] // (copies if repeat and k == repeat[0] else 1)
                   for k in batch_axes]
        batch = math.prod(extents)
        n_tiles = tiles_a * tiles_b * batch
        name = f"fusecut_segment{self.index}_transpose"
        # several tiles a block where they share a window (as many batch indices as tiles) and
        # the grid stays about a wave of resident blocks or more (counting the tiles written)
        run = TILES_PER_BLOCK if (batch_axes and batch >= TILES_PER_BLOCK and n_tiles * copies
                                  >= MIN_RUN_BLOCKS * TILES_PER_BLOCK) else 1
        if run > 1:  # a block's tiles share their window of the batch-broadcast inputs
            tile_pos = [declare("index_t", "batch", f"tile % {batch}"),
                        declare("index_t", "a0", f"((tile / {batch}) % {tiles_a}) * {tile}"),
                        declare("index_t", "b0", f"(tile / {batch * tiles_a}) * {tile}")]
        else:
            tile_pos = [declare("index_t", "a0", f"(tile % {tiles_a}) * {tile}"),
                        declare("index_t", "b0", f"((tile / {tiles_a}) % {tiles_b}) * {tile}")]
        if batch_axes and run == 1:
            tile_pos.append(declare("index_t", "batch", f"tile / {tiles_a * tiles_b}"))
        if batch_axes:
            names = [self.xs[k].name + ("_copy" if repeat and k == repeat[0] else "")
                     for k in batch_axes]
            tile_pos += decompose(Var("batch"), extents, names, "index_t")
            if repeat:  # the first copy's index: the loads name it only divided by ``copies``
                first = self.xs[repeat[0]].name
                tile_pos.append(declare("index_t", first, f"{first}_copy * {copies}",
                                        reads=f"{first}_copy"))
        # every global load of the step is issued before the first barrier
        step = tile_pos
        if staged_reads:
            step += lines(f"// 1. stage the inputs read along axis {b} in shared memory") + \
                stage_loads + direct_loads + stage_stores + lines("__syncthreads();")
            step += lines(f"// 2. along axis {a}") + compute
        else:
            step += lines(f"// 2. along axis {a}") + direct_loads + compute
        if staged_writes:
            step += lines("__syncthreads();", f"// 3. the outputs laid out along axis {b}") + \
                writes
        step += lines("__syncthreads();  // the tiles are free for the next step")
        body = lines(f"// segment {self.index}: pointwise over {self.domain}, tiled transpose: "
                     f"{tile} x {tile} tiles of axes ({b}, {a})"
                     + (f", each written to {copies} copies along axis {repeat[0]}" if repeat
                        else "")
                     + ", staged: "
                     + (", ".join(dict.fromkeys(t for t, _ in staged_reads)) or "-")
                     + "; written through tiles: " + (", ".join(staged_writes) or "-"))
        body += [index_typedefs(self.itype), Stmt(signature(name, params, THREADS) + " {")]
        body += indent(smem_decls, 2)
        if run > 1:
            body += [declare("index_t", "tile_end", f"((index_t)blockIdx.x + 1) * {run} < "
                             f"{n_tiles} ? ((index_t)blockIdx.x + 1) * {run} : {n_tiles}"
                             ).indented(2),
                     stmt(f"  for (index_t tile = (index_t)blockIdx.x * {run}; tile < tile_end; "
                          "++tile) {", "tile_end")]
        else:
            body += lines(f"  for (index_t tile = blockIdx.x; tile < {n_tiles}; "
                          "tile += gridDim.x) {")
        body += indent(step, 4) + lines("  }", "}")
        blocks = covering_grid(-(-n_tiles // run), 1, self.itype)
        kernel = Kernel(name, params, (blocks, 1, 1), (THREADS, 1, 1))
        notes = {"scheme": "transpose", "tile": tile, "tile_axes": (b, a), "vector": vec,
                 "staged": list(dict.fromkeys(t for t, _ in staged_reads)),
                 "written_through_tiles": staged_writes, "index_type": self.itype,
                 "copies": {repeat[0]: copies} if repeat else {}}
        return SegmentKernels(self.index, "pointwise", kernel_code(body), [kernel], [], aligned,
                              notes)


def repeated_axis(xs: list[str], domain: list[int], batch_axes: list[int], lines: list[str]
                  ) -> tuple[int, int] | None:
    """A batch axis k and a factor g > 1 such that the loads and the compute of a tile name
    ``xk`` only as ``(xk / g)``: the g tiles at xk = g*i ... g*i + g-1 hold the same values (a
    repeat, as grouped-query attention's k heads shared by g query heads), so one tile is
    computed and written g times. The first such axis (one factor for all its uses)."""
    text = "\n".join(lines)
    for k in batch_axes:
        uses = re.findall(rf"\b{xs[k]}\b", text)
        divided = re.findall(rf"\({xs[k]} / (\d+)\)", text)
        factors = {int(g) for g in divided}
        if uses and len(divided) == len(uses) and len(factors) == 1:
            g = factors.pop()
            if g > 1 and domain[k] % g == 0:
                return k, g
    return None


def _tile_loop(iters: int, pos: list[Stmt], inside: Code, body: list[Stmt], what: str
               ) -> list[Stmt]:
    return lines("#pragma unroll", f"for (int it = 0; it < {iters}; ++it) {{  // {what}") + \
        indent(pos, 2) + [stmt(f"  if ({inside}) {{", inside)] + indent(body, 4) + \
        lines("  }", "}")


def _tile_position(ph: TilePhase, slow: tuple[Var, str, int], fast: tuple[Var, str, int]
                   ) -> list[Stmt]:
    """A thread's position in a phase: ``sl`` along the tile's slow axis and ``fa`` along its
    fast one, and the domain indices there; ``slow`` and ``fast``: (the axis's index, the
    tile's start on it, the axis)."""
    (xs, s0, s_axis), (xf, f0, f_axis) = slow, fast
    return [declare("int", "sl", ph.slow("it"), f"along axis {s_axis}"),
            declare("int", "fa", ph.fast(), f"along axis {f_axis}"),
            declare("index_t", xs.name, f"{s0} + sl", reads=(s0, "sl")),
            declare("index_t", xf.name, f"{f0} + fa", reads=(f0, "fa"))]


def generate_transpose(bound: Bound, schedule: Schedule, profile: DeviceProfile, index: int,
                       vector: int | None = None,
                       recomputed: frozenset[int] = frozenset()) -> SegmentKernels | None:
    """The tiled kernel of a pointwise segment, or None when every tensor it reads and writes
    follows the domain's innermost axis (or the tiles would be mostly empty), or when an output
    is shorter than the domain (k's heads beside q's): the direct kernel keeps the loads that
    feed such an output inside their tensors (``codegen.pointwise``), the tiles do not."""
    if len(schedule.domain) < 2 or math.prod(schedule.domain) == 0:
        return None
    if sum(e > 1 for e in schedule.domain) < 2:
        return None
    if any(shorter_axes(bound, schedule, t) for t in schedule.outputs):
        return None
    return _Tiled(bound, schedule, index, vector, recomputed).build()
