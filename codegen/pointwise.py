"""Pointwise segments: one grid-stride loop over the reference output's domain.

Each thread takes VEC consecutive elements of the innermost axis per vector (16-byte vectors
where the innermost extent allows) and up to four vectors per step, whose loads are all issued
before any is used (memory-level parallelism): inputs that follow the innermost axis with unit
stride are loaded as one vector, inputs broadcast along it once per vector, others per element; the
reference output (and any output laid out like it) is stored as one vector. Other outputs are
written where their index is in range, once per element.

Adjacent domain axes that every tensor the kernel reads or writes walks contiguously (or is
broadcast along) share one index: a contiguous [8192, 14336] domain is indexed flat, without a
division and a remainder by 14336 per vector (measured on H100: SwiGLU 255 -> 231 us). The
emitter still names one index per domain axis; each access is rewritten onto the merged indices,
and a kernel that needs a per-axis index anyway (slice, pad, iota, a guarded store) keeps them.
``codegen.indexing`` decides which, on a survey of the accesses, before the kernel is written.
"""

from __future__ import annotations

from dataclasses import replace

from fusecut.codegen import cuda
from fusecut.codegen.code import (
    Code,
    Stmt,
    declare,
    derived,
    drop_unread,
    indent,
    lines,
    named,
    names,
    stmt,
)
from fusecut.codegen.cuda import loaded
from fusecut.codegen.emit import Emitter
from fusecut.codegen.index import LANE, All, Index, IndexExpr, Var, at_lane_zero, lane_base, uses
from fusecut.codegen.indexing import (
    Indexing,
    direct_indexing,
    laid_out_like_the_domain,
    output_index,
    store_guards,
)
from fusecut.codegen.kernel import (
    Kernel,
    SegmentKernels,
    extent_param,
    joined,
    outer_free,
    segment_kernels,
    signature,
    tensor_params,
)
from fusecut.codegen.lanes import lane_map
from fusecut.codegen.launch import LaunchDecision, segment_index_type
from fusecut.codegen.layout import (
    address,
    compact_strides,
    covering_grid,
    decompose,
    index_typedefs,
    numel,
    tensor_strides,
)
from fusecut.codegen.names import Names
from fusecut.codegen.precision import fast_math_tensors
from fusecut.codegen.regions import lane_for, vector_read
from fusecut.codegen.tiles import generate_transpose
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.optimizer.kinds.rules import Schedule, embed
from fusecut.optimizer.profiles import DeviceProfile

THREADS = 256
# a tiled segment splits off its untiled part only where the inputs both kernels read are at
# most this fraction of its bytes (read twice, they should cost next to nothing)
SHARED_READS = 16


def generate_pointwise(bound: Bound, schedule: Schedule, profile: DeviceProfile, index: int,
                       vector: int | None = None,
                       recomputed: frozenset[int] = frozenset()) -> SegmentKernels:
    """The pointwise kernel of a segment (``recomputed``: its ops that also run in another
    segment, marked in comments), indexing adjacent domain axes that every tensor it
    reads or writes walks contiguously (or not at all) with one flat index: the per-axis
    indices of a row-major domain cost a division and a remainder per vector (by a constant, but
    several instructions and registers for each of the vectors in flight). A segment whose
    tensors disagree on the innermost axis gets the tiled kernel (``codegen.transpose``), or
    two kernels where part of it needs no tiles (``_split_off_untiled``)."""
    if numel(schedule.domain) == 0:
        return SegmentKernels(index, "pointwise", "", [])
    schedule = without_unwritten_axes(bound, schedule)
    tiled = generate_transpose(bound, schedule, profile, index, vector, recomputed)
    if tiled is not None:  # its tensors disagree on the innermost axis
        return _split_off_untiled(bound, schedule, profile, index, vector, recomputed) or tiled
    return _direct(bound, schedule, index, vector, recomputed)


# op classes whose every element depends only on the same element of their operands
ELEMENTWISE = frozenset({OpClass.POINTWISE, OpClass.BROADCAST})


def without_unwritten_axes(bound: Bound, schedule: Schedule) -> Schedule:
    """The schedule with extent 1 on the domain axes no output is written along, where nothing
    the segment reads varies along them either (an attention mask broadcast over the batch,
    ``where(mask, 0, -inf)``): every value along such an axis is the same, and a kernel over
    the whole domain would compute each one once per position and store it at the first."""
    covered = {m for t in schedule.outputs for m in schedule.axis_map[t] if m is not None}
    unwritten = {a for a, e in enumerate(schedule.domain) if e > 1 and a not in covered}
    if not unwritten or schedule.ref is None:
        return schedule
    fusion = bound.fusion
    if any(get_spec(fusion.ops[i].name).op_class not in ELEMENTWISE
           and fusion.ops[i].name != "full" for i in schedule.ops):
        return schedule
    for t in schedule.inputs:
        placed = embed(bound, t, schedule.ref)
        if placed is None or unwritten & {m for m in placed if m is not None}:
            return schedule
    domain = tuple(1 if a in unwritten else e for a, e in enumerate(schedule.domain))
    return replace(schedule, domain=domain)


def _split_off_untiled(bound: Bound, schedule: Schedule, profile: DeviceProfile, index: int,
                       vector: int | None, recomputed: frozenset[int]) -> SegmentKernels | None:
    """A tiled segment as two kernels, or None: the components of its op graph whose own
    kernel would not be tiled run in a direct kernel (vectorised, axes merged where it can),
    the rest in the tiled one, instead of being walked tile by tile with it (RoPE forward: q's
    RoPE and v's repeat beside k's transposed RoPE). Only where both kernels index alike (one
    ``index_t`` per source) and the inputs both read are small: they are read twice."""
    direct_ops: list[int] = []
    tiled_ops: list[int] = []
    for ops in op_components(bound, schedule):
        part = restricted(bound, schedule, ops)
        needs_tiles = generate_transpose(bound, part, profile, index, vector, recomputed)
        (direct_ops if needs_tiles is None else tiled_ops).extend(ops)
    direct, tiled = restricted(bound, schedule, direct_ops), restricted(bound, schedule, tiled_ops)
    if (not direct.outputs or not tiled.outputs
            or sorted(direct.outputs + tiled.outputs) != sorted(schedule.outputs)
            or segment_index_type(bound, direct) != segment_index_type(bound, tiled)):
        return None  # an output no op of the segment writes; or two index types
    total = sum(bound.nbytes(t) for t in schedule.inputs + schedule.outputs)
    shared = set(direct.inputs) & set(tiled.inputs)
    if sum(bound.nbytes(t) for t in shared) * SHARED_READS > total:
        return None
    second = generate_transpose(bound, tiled, profile, index, vector, recomputed)
    if second is None:
        return None
    first = _direct(bound, direct, index, vector, recomputed)
    writes = {first.kernels[0].name: list(direct.outputs),
              second.kernels[0].name: list(tiled.outputs)}
    return joined([first, second], second.notes | {"writes": writes, "direct": first.notes})


def op_components(bound: Bound, schedule: Schedule) -> list[list[int]]:
    """The segment's ops (program order) in the connected components of its own op graph: ops
    connected through a tensor or scalar one of them computes; what they read from global
    memory connects nothing. Components in the order of their first op."""
    fusion = bound.fusion
    producer = {t: i for i in schedule.ops for t in fusion.ops[i].outputs}
    parent = {i: i for i in schedule.ops}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in schedule.ops:
        for t in fusion.ops[i].inputs:
            if t in producer:
                parent[root(i)] = root(producer[t])
    components: dict[int, list[int]] = {}
    for i in schedule.ops:
        components.setdefault(root(i), []).append(i)
    return list(components.values())


def restricted(bound: Bound, schedule: Schedule, ops) -> Schedule:
    """The part of a pointwise schedule that runs ``ops``: the inputs they read and the outputs
    they write, over the segment's domain (so its kernel indexes them as the segment's would)."""
    fusion = bound.fusion
    kept = set(ops)
    read = {t for i in kept for t in fusion.ops[i].inputs}
    written = {t for i in kept for t in fusion.ops[i].outputs}
    outputs = tuple(t for t in schedule.outputs if t in written)
    return replace(schedule, ops=tuple(i for i in schedule.ops if i in kept),
                   inputs=tuple(t for t in schedule.inputs if t in read), outputs=outputs,
                   axis_map={t: schedule.axis_map[t] for t in outputs})


def _direct(bound: Bound, schedule: Schedule, index: int, vector: int | None,
            recomputed: frozenset[int]) -> SegmentKernels:
    """The direct (untiled) kernel, with adjacent axes merged where every access allows
    (``codegen.indexing`` decides on a survey of the accesses, before the kernel is written)."""
    ix, launch = direct_indexing(bound, schedule, vector)
    loads = _Loads(bound, ix, launch)
    em = Emitter(bound, schedule.ops, set(schedule.inputs), loads.load, launch.index_type,
                 Names(recomputed), fast_math_tensors(bound, schedule), ix.flat_index(bound),
                 launch.resizes)
    loads.em = em
    stores_after, vec_outputs = _store_outputs(bound, schedule, ix, em, loads.aligned)
    n_vec = numel(ix.domain) // ix.vec
    params = tensor_params(bound, schedule.inputs, schedule.outputs, em.params) + \
        [extent_param("n_vec", n_vec, launch.index_type)]
    step = loads.decls + drop_unread(_position(ix) + _compute(bound, ix, em, loads,
                                                              stores_after, vec_outputs))
    kname = f"fusecut_segment{index}_pointwise"
    # One vector per thread over the whole domain (measured on H100: 4-8% faster than a grid of
    # 8 blocks per SM striding over it; two vectors a thread were never faster, see
    # codegen.launch.pointwise_launch).
    blocks = covering_grid(n_vec, THREADS, launch.index_type)
    kernel = Kernel(kname, params, (blocks, 1, 1), (THREADS, 1, 1))
    body = _grid_stride_loop(index, kname, ix, launch, params, step)
    notes = {"vector": ix.vec, "index_type": launch.index_type} | \
        ({"indexed_as": ix.extents} if ix.merged else {})
    return segment_kernels(index, "pointwise", body, [kernel], [], loads.aligned,
                          notes)


class _Loads:
    """The reads of a direct kernel's inputs: a vector load per aligned vector of an input that
    follows the lanes (or a lane map into it), one load per vector where the index does not
    move with the lane, both issued before any compute (``pre``, and ``decls`` for the lane
    maps), and a read per lane otherwise. ``em``: the emitter they load for, set once made."""

    def __init__(self, bound: Bound, ix: Indexing, launch: LaunchDecision):
        self.bound, self.ix, self.vec = bound, ix, launch.vector
        self.em: Emitter | None = None
        self.pre: list[Stmt] = []  # the vector's loads, issued before any compute
        self.decls: list[Stmt] = []  # constant lane maps
        self.aligned: dict[str, int] = {}
        self._vectors: dict[tuple, str] = {}
        self._lane_maps: dict[tuple[int, ...], str] = {}  # lane -> element of its vector
        self._starts: dict[tuple, Index] = {}  # a permuted-lane vector's first address

    def load(self, t: str, idx: Index) -> Code:
        """Input t's value at ``idx`` (the emitter's per-axis index) for the current lane."""
        em, vec = self.em, self.vec
        d = self.bound.fusion.tensors[t].dtype
        inside = self.ix.within(self.bound, t, idx)
        idx, strides = self.ix.addressed(idx, tensor_strides(self.bound, t))
        where = address(idx, strides)

        def scalar(value: Code) -> Code:
            if inside is None:
                return value
            return derived(f"({inside} ? {value} : ({cuda.compute(d)})0)", inside, value)

        if not any(uses(i, LANE) for i in idx):  # once per vector
            if self._ready_before_compute(where, inside):
                fresh = em.names.fresh(f"ld_{t}")
                value = scalar(loaded(f"in_{t}[{where}]", d, where))
                self.pre.append(declare(cuda.compute(d), fresh, value))
                return named(fresh)
            return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))
        if inside is not None and uses(inside, LANE):  # a read per lane
            return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))
        lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]
        # the innermost index, or a whole vector of a slice, pad or cat piece (codegen.resize)
        first = lane_base(idx[lanes[0]]) if vec > 1 and len(lanes) == 1 else None
        base = tuple(at_lane_zero(i) if a == lanes[0] else i for a, i in enumerate(idx))
        if (first is not None and strides[lanes[0]] == 1
                and all(s % vec == 0 for a, s in enumerate(strides) if a != lanes[0])):
            guards = [g for g in (inside, em.lane_guard(idx[lanes[0]])) if g is not None]
            if self._ready_before_compute(base, guards):
                vname = self._vector(t, base, strides, All(*guards) if guards else None)
                return loaded(f"{vname}.v[{LANE}]", d, vname, LANE, simple=True)
            return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))
        permuted = self._permuted_lanes(t, idx, strides, lanes)
        if permuted is not None and not self._ready_before_compute(permuted[0], inside):
            permuted = None
        if permuted is not None:  # lanes that take other elements of their own vector
            base, offsets = permuted
            if offsets not in self._lane_maps:
                self._lane_maps[offsets] = em.names.fresh("lanes")
                self.decls.append(Stmt(f"constexpr int {self._lane_maps[offsets]}[{vec}] = "
                                       f"{{{', '.join(map(str, offsets))}}};"))
            vname, lanes_of = self._vector(t, base, strides, inside), self._lane_maps[offsets]
            return loaded(f"{vname}.v[{lanes_of}[{LANE}]]", d, vname, lanes_of, LANE)
        return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))

    def _ready_before_compute(self, *parts) -> bool:
        """Whether a load whose address and guard spell ``parts`` can be issued before the
        compute. Its address may read values the per-element code computed: a gather's index
        (an iota, a where over a loaded label). Where all of them are the same for every lane
        they move up with the statements they need, and the load is issued after them (a
        vector load keeps its one 16-byte read); where one of them reads the lane, the load
        stays a read per lane after the code that computes its address."""
        em = self.em
        computed = {s.declares: k for k, s in enumerate(em.lines) if s.declares is not None}
        pending = [n for n in names(*parts) if n in computed]
        moving: set[int] = set()
        while pending:
            k = computed[pending.pop()]
            if k in moving:
                continue
            if LANE in em.lines[k].reads:
                return False
            moving.add(k)
            pending += [n for n in em.lines[k].reads if n in computed]
        if moving:
            self.pre += [em.lines[k] for k in sorted(moving)]
            em.lines[:] = [line for k, line in enumerate(em.lines) if k not in moving]
        return True

    def _vector(self, t: str, base: Index, strides: tuple[int, ...],
                guard: IndexExpr | None) -> str:
        """The register vector of input t whose first lane is at ``base`` (loaded once)."""
        key = (t, base)
        if key not in self._vectors:
            d = self.bound.fusion.tensors[t].dtype
            st = cuda.storage(d)
            self._vectors[key] = self.em.names.fresh(f"vec_{t}")
            first = address(base, strides)
            read = vector_read(st, self.vec, f"in_{t} + {first}", guard)
            self.pre.append(declare(f"fc_vec<{st}, {self.vec}>", self._vectors[key], read,
                                    reads=(first, guard)))
            self.aligned[t] = self.vec * d.itemsize
        return self._vectors[key]

    def _permuted_lanes(self, t: str, idx: Index, strides: tuple[int, ...], lanes: list[int]
                        ) -> tuple[Index, tuple[int, ...]] | None:
        """(the aligned vector's first index, lane map) where input t's lanes all read elements
        of the vector at the innermost index (``codegen.lanes``); per-axis indexing only."""
        vec, ix = self.vec, self.ix
        if vec == 1 or ix.merged or len(lanes) != 1 or strides[lanes[0]] != 1 or not ix.rank:
            return None
        if any(s % vec for a, s in enumerate(strides) if a != lanes[0]):
            return None
        if self.bound.shapes[t][lanes[0]] % vec:  # an aligned vector lies inside t
            return None
        mapped = lane_map(idx[lanes[0]], ix.xs[-1].name, vec)
        if mapped is None or mapped.offsets == tuple(range(vec)):
            return None
        # equal starts written differently share one vector (its first spelling names it)
        same_vector = tuple(mapped.values if a == lanes[0] else i for a, i in enumerate(idx))
        start = tuple(mapped.start if a == lanes[0] else i for a, i in enumerate(idx))
        return self._starts.setdefault((t, same_vector), start), mapped.offsets


def _store_outputs(bound: Bound, schedule: Schedule, ix: Indexing, em: Emitter,
                   aligned: dict[str, int]) -> tuple[list[Stmt], list[str]]:
    """Store every output: lane by lane into a register vector stored whole after the lane
    loop where it is laid out like the domain (returned: those stores, and the outputs), else
    element by element where its index is in range."""
    fusion = bound.fusion
    stores_after: list[Stmt] = []
    vec_outputs: list[str] = []
    for t in schedule.outputs:
        d = fusion.tensors[t].dtype
        val = em.raw(t, output_index(schedule, ix, t))
        if laid_out_like_the_domain(bound, schedule, t) and ix.vec > 1:
            stored = cuda.to_storage(val, d)
            em.lines.append(stmt(f"o_{t}.v[{LANE}] = {stored};", LANE, val, stored))
            vec_outputs.append(t)
            where = address(*ix.addressed(tuple(ix.xs), compact_strides(bound, t)))
            stores_after.append(stmt(f"*reinterpret_cast<fc_vec<{cuda.storage(d)}, {ix.vec}>*>("
                                     f"out_{t} + {where}) = o_{t};", where, "fc_vec"))
            aligned[t] = ix.vec * d.itemsize
            continue
        guards = store_guards(bound, schedule, ix, t)
        where = address(*ix.addressed(output_index(schedule, ix, t), compact_strides(bound, t)))
        stored = cuda.to_storage(val, d)
        store = f"out_{t}[{where}] = {stored};"
        em.lines.append(stmt(f"if ({All(*guards)}) {store}" if guards else store, guards, where,
                             val, stored))
    return stores_after, vec_outputs


def _position(ix: Indexing) -> list[Stmt]:
    """The thread's vector's position: its flat index, split over the runs (each kernel
    declares the indices it needs: a broadcast or unit axis may need none)."""
    flat = [declare("index_t", "flat", f"v * {ix.vec}")] if ix.rank else []
    return flat + decompose(Var("flat"), ix.extents, [r.name for r in ix.run_names], "index_t",
                            unsigned=True)


def _compute(bound: Bound, ix: Indexing, em: Emitter, loads: _Loads, stores_after: list[Stmt],
             vec_outputs: list[str]) -> list[Stmt]:
    """The loads, then the values and stores of each lane, then the vector stores."""
    out = lines("// loads") + loads.pre if loads.pre else []
    out += lines("// compute and store")
    for t in vec_outputs:
        out.append(stmt(f"fc_vec<{cuda.storage(bound.fusion.tensors[t].dtype)}, {ix.vec}> "
                        f"o_{t};", "fc_vec"))
    if ix.vec > 1:
        out += lines("#pragma unroll") + [lane_for(ix.vec)]
        out += lines("  // per element") + indent(em.lines, 2) + lines("}")
    else:
        out += lines("// per element") + em.lines
    if stores_after:
        out += lines("// vector stores") + stores_after
    return out


def _grid_stride_loop(index: int, kname: str, ix: Indexing, launch: LaunchDecision, params,
                      step: list[Stmt]) -> list[Stmt]:
    """The kernel: a grid-stride loop over the domain's ``n_vec`` vectors (a launch argument:
    the code does not depend on the outermost extent), ``step`` its body."""
    indexed = f", indexed as {outer_free(ix.extents)}" if ix.merged else ""
    body = lines(f"// segment {index}: pointwise over {outer_free(ix.domain)}{indexed}, "
                 f"n_vec vectors of {ix.vec}")
    body += [index_typedefs(launch.index_type, unsigned=True),
             signature(kname, params, THREADS),
             stmt("  for (index_t v = (index_t)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec; "
                  "v += (index_t)gridDim.x * blockDim.x) {", "n_vec")]
    return body + indent(step, 4) + lines("  }", "}")
