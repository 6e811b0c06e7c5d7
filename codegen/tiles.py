"""The tiled transpose kernel (``codegen.transpose`` decides the scheme; ``generate_transpose``
here takes its choice and writes the kernel): a block steps over T x T tiles of axes (B, A), each
step in three phases.

1. stage: each input read along B is read along B (16-byte vectors where its layout allows)
   into a shared-memory tile ``s_k[b][a]``;
2. compute: the block walks the tile along A, as the pointwise kernel does, reading the staged
   inputs from their tiles, the others directly, and writing the outputs laid out along B into
   tiles of their own;
3. write: those outputs are stored along B, to every copy along a repeated batch axis.

Every global load of a step is issued before its first barrier. A block takes
``TILES_PER_BLOCK`` consecutive tiles, batch index fastest, where the domain has batch axes and
the grid stays a wave or more: the tiles then share their window of the inputs broadcast over
the batch (RoPE's cos and sin), which comes from L1 (H100, rope_fwd_thunder: 179 us against 189
at one tile a block; 4 and 16 were slower than 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusecut.codegen import cuda
from fusecut.codegen.code import (
    Code,
    Stmt,
    declare,
    derived,
    indent,
    lines,
    stmt,
)
from fusecut.codegen.cuda import loaded
from fusecut.codegen.emit import Emitter
from fusecut.codegen.index import (
    LANE,
    ZERO,
    Add,
    All,
    Const,
    Div,
    Equal,
    Index,
    IndexExpr,
    Paren,
    Var,
    at_lane_zero,
    uses,
    walk,
)
from fusecut.codegen.kernel import Kernel, SegmentKernels, segment_kernels, signature, tensor_params
from fusecut.codegen.layout import (
    address,
    compact_strides,
    covering_grid,
    decompose,
    index_typedefs,
    tensor_strides,
)
from fusecut.codegen.names import Names
from fusecut.codegen.precision import fast_math_tensors
from fusecut.codegen.regions import lane_loop, shorter_axes, vector_read
from fusecut.codegen.transpose import TilePlan, TransposeScheme
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile

THREADS = 256
TILES_PER_BLOCK = 8  # consecutive tiles a block takes where the domain has batch axes
MIN_RUN_BLOCKS = 1024  # blocks the grid keeps when it does (rope_fwd_thunder: 1024)


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




@dataclass(frozen=True)
class Repeat:
    """A batch axis the tile's code names only divided by ``copies``: each tile is computed
    once and written ``copies`` times."""

    axis: int
    copies: int


class TiledKernel:
    """The text of one tiled kernel, phase by phase (``build``)."""

    def __init__(self, scheme: TransposeScheme, plan: TilePlan):
        self.s, self.plan = scheme, plan
        self.fusion = scheme.bound.fusion
        self.a, self.b = scheme.a, plan.b
        self.xa, self.xb = scheme.xs[scheme.a], scheme.xs[plan.b]
        self.aligned: dict[str, int] = {}
        # the shared-memory tiles: of each staged read, and of each output written through one
        self.tile_of = {key: f"s{k}_{key[0]}" for k, key in enumerate(plan.staged_reads)}
        self.out_tile = {t: f"so_{t}" for t in plan.staged_writes}

    def build(self) -> SegmentKernels:
        s, plan = self.s, self.plan
        stage_loads, stage_stores = self.stage_phase()
        compute = _ComputePhase(self)
        direct_loads, compute_lines = compute.build()
        batch_axes = [k for k, e in enumerate(s.domain) if k not in (self.a, self.b) and e > 1]
        repeat = repeated_axis(s.xs, s.domain, batch_axes,
                               stage_loads + direct_loads + stage_stores + compute_lines)
        if list(plan.staged_writes) != list(s.schedule.outputs):
            repeat = None  # an output the compute phase stores needs its own tile per copy
        params = tensor_params(s.bound, s.schedule.inputs, s.schedule.outputs,
                               compute.em.params)
        name = f"fusecut_segment{s.index}_transpose"
        tiles = self.tile_order(batch_axes, repeat)
        step = tiles.position + self.phases(stage_loads, direct_loads, stage_stores,
                                            compute_lines, self.write_phase(repeat))
        body = self.header(name, params, repeat) + indent(self.shared_tiles(), 2) + \
            tiles.loop + indent(step, 4) + lines("  }", "}")
        blocks = covering_grid(-(-tiles.count // tiles.run), 1, s.itype)
        kernel = Kernel(name, params, (blocks, 1, 1), (THREADS, 1, 1))
        notes = {"scheme": "transpose", "tile": plan.tile, "tile_axes": (self.b, self.a),
                 "vector": s.vec, "staged": self.staged_inputs(),
                 "written_through_tiles": list(plan.staged_writes), "index_type": s.itype,
                 "copies": {repeat.axis: repeat.copies} if repeat else {}}
        return segment_kernels(s.index, "pointwise", body, [kernel], [],
                              self.aligned, notes)

    def staged_inputs(self) -> list[str]:
        return list(dict.fromkeys(t for t, _ in self.plan.staged_reads))

    def align(self, t: str, nbytes: int) -> None:
        self.aligned[t] = max(self.aligned.get(t, 1), nbytes)

    # ---- shared memory and positions ----------------------------------------------------------

    def shared_tiles(self) -> list[Stmt]:
        """The tiles, each row padded to an odd number of words (``row_pitch``), so that a
        tile's column does not hit one bank."""
        tile, out = self.plan.tile, []
        for key, name in self.tile_of.items():
            st = cuda.storage(self.fusion.tensors[key[0]].dtype)
            out.append(Stmt(f"__shared__ {st} {name}[{tile}][{self.s.row_pitch(key[0], tile)}];"
                            f"  // {key[0]}, read along axis {self.b}"))
        for t, name in self.out_tile.items():
            st = cuda.storage(self.fusion.tensors[t].dtype)
            out.append(Stmt(f"__shared__ {st} {name}[{tile}][{self.s.row_pitch(t, tile)}];"
                            f"  // {t}, written along axis {self.b}"))
        return out

    def along_b(self, ph: TilePhase) -> tuple[list[Stmt], Code]:
        """A thread's position in a phase walking the tile along B (stage and write): ``sl``
        along A, ``fa`` along B, the domain indices there, and the condition that it lies inside
        the tile and the domain."""
        pos = _tile_position(ph, (self.xa, "a0", self.a), (self.xb, "b0", self.b))
        return pos, self.inside()

    def along_a(self, ph: TilePhase) -> tuple[list[Stmt], Code]:
        """The same for the compute phase, which walks the tile along A."""
        pos = _tile_position(ph, (self.xb, "b0", self.b), (self.xa, "a0", self.a))
        return pos, self.inside()

    def inside(self) -> Code:
        d = self.s.domain
        return derived(f"sl < {self.plan.tile} && {self.xa} < {d[self.a]} && {self.xb} < "
                       f"{d[self.b]}", "sl", self.xa, self.xb)

    # ---- phase 1: stage the inputs read along B ------------------------------------------------

    def stage_phase(self) -> tuple[list[Stmt], list[Stmt]]:
        """The staged inputs' loads (into registers, every global load of the step before the
        barrier) and their stores into the tiles."""
        loads, stores = [], []
        for k, key in enumerate(self.plan.staged_reads):
            load, store = self.stage_read(k, *key)
            loads += load
            stores += store
        return loads, stores

    def stage_read(self, k: int, t: str, idx: Index) -> tuple[list[Stmt], list[Stmt]]:
        s, tile, cell = self.s, self.plan.tile, self.tile_of[(t, idx)]
        d = self.fusion.tensors[t].dtype
        st = cuda.storage(d)
        v = s.stage_vector(t, idx, self.b, tile)
        ph = TilePhase(tile, v)
        where = address(tuple(s.unfold(c) for c in idx), tensor_strides(s.bound, t))
        reg = f"r{k}"
        if v > 1:
            decl = stmt(f"fc_vec<{st}, {v}> {reg}[{ph.iters}];", "fc_vec")
            load = stmt(f"{reg}[it] = *reinterpret_cast<const fc_vec<{st}, {v}>*>(in_{t} + "
                        f"{where});", where, "fc_vec")
            put = lines("#pragma unroll") + [
                stmt(f"for (int j = 0; j < {v}; ++j) {cell}[fa + j][sl] = {reg}[it].v[j];",
                     "fa", "sl")]
            self.align(t, v * d.itemsize)
        else:
            decl = Stmt(f"{st} {reg}[{ph.iters}];")
            load = stmt(f"{reg}[it] = in_{t}[{where}];", where)
            put = [stmt(f"{cell}[fa][sl] = {reg}[it];", "fa", "sl")]
        pos, inside = self.along_b(ph)
        into_tile = derived(f"sl < {tile} && b0 + fa < {s.domain[self.b]} && a0 + sl < "
                            f"{s.domain[self.a]}", "sl", "fa", "a0", "b0")
        return ([decl] + _tile_loop(ph.iters, pos, inside, [load], f"{t}: read along axis "
                                    f"{self.b}"),
                _tile_loop(ph.iters, pos[:2], into_tile, put, f"{t}: into its tile"))

    # ---- phase 3: the outputs laid out along B -------------------------------------------------

    def write_phase(self, repeat: Repeat | None) -> list[Stmt]:
        out = []
        for t in self.plan.staged_writes:
            out += self.write_through_tile(t, repeat)
        return out

    def write_through_tile(self, t: str, repeat: Repeat | None) -> list[Stmt]:
        """Output t from its tile along B, to every copy along a repeated axis."""
        s, tile = self.s, self.plan.tile
        d = self.fusion.tensors[t].dtype
        st = cuda.storage(d)
        v = s.write_vector(t, self.b, tile)
        ph = TilePhase(tile, v)
        idx = tuple((s.xs[m] if repeat is None or m != repeat.axis else
                     Paren(Add(s.xs[m], Var("rep")))) if m is not None else ZERO
                    for m in s.schedule.axis_map[t])
        where = address(idx, compact_strides(s.bound, t))
        copies = [] if repeat is None else \
            lines("#pragma unroll", f"for (int rep = 0; rep < {repeat.copies}; ++rep)")
        if v > 1:
            put = [stmt(f"fc_vec<{st}, {v}> w;", "fc_vec"), *lines("#pragma unroll"),
                   stmt(f"for (int j = 0; j < {v}; ++j) w.v[j] = {self.out_tile[t]}[fa + j][sl];",
                        "fa", "sl")] + copies + [
                stmt(f"*reinterpret_cast<fc_vec<{st}, {v}>*>(out_{t} + {where}) = w;", where,
                     "fc_vec")]
            self.align(t, v * d.itemsize)
        else:
            put = [declare(st, "w", f"{self.out_tile[t]}[fa][sl]", reads=("fa", "sl"))] + \
                copies + [stmt(f"out_{t}[{where}] = w;", where, "w")]
        pos, inside = self.along_b(ph)
        return _tile_loop(ph.iters, pos, inside, put, f"{t}: written along axis {self.b}")

    # ---- the step and the kernel ---------------------------------------------------------------

    def phases(self, stage_loads: list[Stmt], direct_loads: list[Stmt], stage_stores: list[Stmt],
               compute: list[Stmt], writes: list[Stmt]) -> list[Stmt]:
        """One tile step: every global load issued before the first barrier."""
        a, b = self.a, self.b
        step: list[Stmt] = []
        if self.plan.staged_reads:
            step += lines(f"// 1. stage the inputs read along axis {b} in shared memory") + \
                stage_loads + direct_loads + stage_stores + lines("__syncthreads();")
            step += lines(f"// 2. along axis {a}") + compute
        else:
            step += lines(f"// 2. along axis {a}") + direct_loads + compute
        if self.plan.staged_writes:
            step += lines("__syncthreads();", f"// 3. the outputs laid out along axis {b}") + \
                writes
        return step + lines("__syncthreads();  // the tiles are free for the next step")

    def tile_order(self, batch_axes: list[int], repeat: Repeat | None) -> _TileOrder:
        """Which tile a step takes: the grid-stride loop over the tiles, and the tile's start
        (``a0``, ``b0``) and batch indices (a repeated axis at its first copy)."""
        s, tile = self.s, self.plan.tile
        copies = repeat.copies if repeat else 1
        tiles_a = -(-s.domain[self.a] // tile)
        tiles_b = -(-s.domain[self.b] // tile)
        extents = [s.domain[k] // (copies if repeat and k == repeat.axis else 1)
                   for k in batch_axes]
        batch = math.prod(extents)
        count = tiles_a * tiles_b * batch
        # several tiles a block where they share a window (as many batch indices as tiles) and
        # the grid stays about a wave of resident blocks or more (counting the tiles written)
        run = TILES_PER_BLOCK if (batch_axes and batch >= TILES_PER_BLOCK and count * copies
                                  >= MIN_RUN_BLOCKS * TILES_PER_BLOCK) else 1
        if run > 1:  # a block's tiles share their window of the batch-broadcast inputs
            position = [declare("index_t", "batch", f"tile % {batch}"),
                        declare("index_t", "a0", f"((tile / {batch}) % {tiles_a}) * {tile}"),
                        declare("index_t", "b0", f"(tile / {batch * tiles_a}) * {tile}")]
            loop = [declare("index_t", "tile_end", f"((index_t)blockIdx.x + 1) * {run} < "
                            f"{count} ? ((index_t)blockIdx.x + 1) * {run} : {count}"
                            ).indented(2),
                    stmt(f"  for (index_t tile = (index_t)blockIdx.x * {run}; tile < tile_end; "
                         "++tile) {", "tile_end")]
        else:
            position = [declare("index_t", "a0", f"(tile % {tiles_a}) * {tile}"),
                        declare("index_t", "b0", f"((tile / {tiles_a}) % {tiles_b}) * {tile}")]
            if batch_axes:
                position.append(declare("index_t", "batch", f"tile / {tiles_a * tiles_b}"))
            loop = lines(f"  for (index_t tile = blockIdx.x; tile < {count}; "
                         "tile += gridDim.x) {")
        if batch_axes:
            names = [s.xs[k].name + ("_copy" if repeat and k == repeat.axis else "")
                     for k in batch_axes]
            position += decompose(Var("batch"), extents, names, "index_t")
            if repeat:  # the first copy's index: the loads name it only divided by ``copies``
                first = s.xs[repeat.axis].name
                position.append(declare("index_t", first, f"{first}_copy * {copies}",
                                        reads=f"{first}_copy"))
        return _TileOrder(position, loop, count, run)

    def header(self, name: str, params, repeat: Repeat | None) -> list[Stmt]:
        s, plan = self.s, self.plan
        copies = f", each written to {repeat.copies} copies along axis {repeat.axis}" \
            if repeat else ""
        head = lines(f"// segment {s.index}: pointwise over {s.domain}, tiled transpose: "
                     f"{plan.tile} x {plan.tile} tiles of axes ({self.b}, {self.a}){copies}, "
                     f"staged: {', '.join(self.staged_inputs()) or '-'}; written through "
                     f"tiles: {', '.join(plan.staged_writes) or '-'}")
        return head + [index_typedefs(s.itype), signature(name, params, THREADS)]


@dataclass(frozen=True)
class _TileOrder:
    position: list[Stmt]  # the tile's start and batch indices
    loop: list[Stmt]  # the loop over the tiles (its header)
    count: int  # tiles
    run: int  # consecutive tiles a block takes


class _ComputePhase:
    """Phase 2: the block walks the tile along A as the pointwise kernel does. Staged inputs
    come from their tiles; the others are loaded directly (before the barrier, into registers
    per iteration: ``pre`` and their arrays ``decls``), as vectors where they follow A."""

    def __init__(self, kernel: TiledKernel):
        self.k, self.s = kernel, kernel.s
        self.ph = TilePhase(kernel.plan.tile, self.s.vec)
        self.pre: list[Stmt] = []
        self.decls: list[Stmt] = []
        self.vectors: dict[tuple, str] = {}
        s = self.s
        self.em = Emitter(s.bound, s.schedule.ops, set(s.schedule.inputs), self.load, s.itype,
                          Names(s.recomputed), fast_math_tensors(s.bound, s.schedule),
                          resizes=s.resizes)

    def build(self) -> tuple[list[Stmt], list[Stmt]]:
        """(the direct loads, the compute and store loop)."""
        out_decls, stores_after = self.store_outputs()
        pos, inside = self.k.along_a(self.ph)
        body = out_decls + lane_loop(self.s.vec, lines("// per element") + self.em.lines) + \
            stores_after
        direct = self.decls + (_tile_loop(self.ph.iters, pos, inside, self.pre,
                                          f"loads along axis {self.k.a}") if self.pre else [])
        return direct, _tile_loop(self.ph.iters, pos, inside, body, "compute and store")

    def load(self, t: str, idx: Index) -> Code:
        """Input t at ``idx`` for the current lane: from its tile, or loaded before the
        barrier."""
        s, vec = self.s, self.s.vec
        d = s.bound.fusion.tensors[t].dtype
        tile = self.k.tile_of.get((t, idx))
        if tile is not None:
            if vec > 1:
                return loaded(f"{tile}[sl][fa + {LANE}]", d, "sl", "fa", LANE)
            return loaded(f"{tile}[sl][fa]", d, "sl", "fa", simple=True)
        strides = tensor_strides(s.bound, t)
        where = address(idx, strides)
        if not any(uses(i, LANE) for i in idx):  # once per position, into an array
            fresh = self.em.names.fresh(f"ld_{t}")
            self.decls.append(Stmt(f"{cuda.compute(d)} {fresh}[{self.ph.iters}];"))
            value = loaded(f"in_{t}[{where}]", d, where)
            self.pre.append(stmt(f"{fresh}[it] = {value};", value))
            return Code(f"{fresh}[it]", frozenset({fresh}), True)
        if s.whole_vector(t, idx):
            vname = self.vector(t, idx, strides)
            return loaded(f"{vname}[it].v[{LANE}]", d, vname, LANE, simple=True)
        return self.em.let_load(t, loaded(f"in_{t}[{where}]", d, where))

    def vector(self, t: str, idx: Index, strides: tuple[int, ...]) -> str:
        """The register vectors (one per iteration) of input t whose lanes ``idx`` reads."""
        lane = next(k for k, i in enumerate(idx) if uses(i, LANE))
        base = tuple(at_lane_zero(i) if k == lane else i for k, i in enumerate(idx))
        if (t, base) not in self.vectors:
            d = self.s.bound.fusion.tensors[t].dtype
            st, vec = cuda.storage(d), self.s.vec
            vname = self.em.names.fresh(f"vec_{t}")
            self.decls.append(stmt(f"fc_vec<{st}, {vec}> {vname}[{self.ph.iters}];", "fc_vec"))
            first, guard = address(base, strides), self.em.lane_guard(idx[lane])
            read = vector_read(st, vec, f"in_{t} + {first}", guard)
            self.pre.append(stmt(f"{vname}[it] = {read};", first, read))
            self.vectors[(t, base)] = vname
            self.k.align(t, vec * d.itemsize)
        return self.vectors[(t, base)]

    def store_outputs(self) -> tuple[list[Stmt], list[Stmt]]:
        """Store every output: into its tile, as a vector where it follows A, else element by
        element. (the vector registers, the vector stores after the lane loop)"""
        s, em, vec = self.s, self.em, self.s.vec
        out_decls: list[Stmt] = []
        stores_after: list[Stmt] = []
        for t in s.schedule.outputs:
            d = s.bound.fusion.tensors[t].dtype
            idx = s.out_idx(t)
            val = em.raw(t, idx)
            if t in self.k.out_tile:
                cell = f"{self.k.out_tile[t]}[sl][fa + {LANE}]" if vec > 1 else \
                    f"{self.k.out_tile[t]}[sl][fa]"
                stored = cuda.to_storage(val, d)
                em.lines.append(stmt(f"{cell} = {stored};", "sl", "fa",
                                     LANE if vec > 1 else None, val, stored))
                continue
            strides = compact_strides(s.bound, t)
            lanes = [k for k, i in enumerate(idx) if uses(i, LANE)]
            if (vec > 1 and s.full_cover(t) and len(lanes) == 1 and strides[lanes[0]] == 1
                    and all(x % vec == 0 for k, x in enumerate(strides) if k != lanes[0])):
                st = cuda.storage(d)
                out_decls.append(stmt(f"fc_vec<{st}, {vec}> o_{t};", "fc_vec"))
                stored = cuda.to_storage(val, d)
                em.lines.append(stmt(f"o_{t}.v[{LANE}] = {stored};", LANE, val, stored))
                base = tuple(self.k.xa if k == lanes[0] else i for k, i in enumerate(idx))
                where = address(base, strides)
                stores_after.append(stmt(f"*reinterpret_cast<fc_vec<{st}, {vec}>*>(out_{t} + "
                                         f"{where}) = o_{t};", where, "fc_vec"))
                self.k.align(t, vec * d.itemsize)
                continue
            guards = [Equal(s.domain_idx[k], ZERO) for k, e in enumerate(s.domain)
                      if e > 1 and k not in {m for m in s.schedule.axis_map[t] if m is not None}]
            where = address(idx, strides)
            stored = cuda.to_storage(val, d)
            store = f"out_{t}[{where}] = {stored};"
            em.lines.append(stmt(f"if ({All(*guards)}) {store}" if guards else store, guards,
                                 where, val, stored))
        return out_decls, stores_after


def repeated_axis(xs: list[IndexExpr], domain: list[int], batch_axes: list[int],
                  stmts: list[Stmt]) -> Repeat | None:
    """A batch axis k and a factor g > 1 such that the indices ``stmts`` spell (a tile's loads
    and compute) name ``xk`` only as ``(xk / g)``: the g tiles at xk = g*i ... g*i + g-1 hold
    the same values (a repeat, as grouped-query attention's k heads shared by g query heads),
    so one tile is computed and written g times. The first such axis (one factor for all its
    uses)."""
    spelt = [e for s in stmts for e in s.indices]
    for k in batch_axes:
        undivided, factors = 0, set()
        for e in spelt:
            for node in walk(e):
                g = _divisor_of(node, xs[k])
                if g is not None:
                    factors.add(g)
                    undivided -= 1  # the walk meets this division's xk next: not a plain use
                elif node == xs[k]:
                    undivided += 1
        if undivided == 0 and len(factors) == 1:
            g = factors.pop()
            if g > 1 and domain[k] % g == 0:
                return Repeat(k, g)
    return None


def _divisor_of(node: IndexExpr, x: IndexExpr) -> int | None:
    """g where ``node`` is ``(x / g)``."""
    if isinstance(node, Paren) and isinstance(node.kids[0], Div):
        num, den = node.kids[0].kids
        if num == x and isinstance(den, Const):
            return den.value
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
    scheme = TransposeScheme(bound, schedule, index, vector, recomputed)
    plan = scheme.choose()
    return None if plan is None else TiledKernel(scheme, plan).build()
