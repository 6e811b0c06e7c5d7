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
"""

from __future__ import annotations

import re
from dataclasses import replace

from fusecut.codegen import cuda
from fusecut.codegen.bounds import in_bounds
from fusecut.codegen.code import (
    Code,
    Stmt,
    declare,
    derived,
    drop_unread,
    indent,
    lines,
    loaded,
    named,
    stmt,
    text_of,
)
from fusecut.codegen.emit import Emitter, Names
from fusecut.codegen.index import (
    LANE,
    ZERO,
    All,
    Const,
    Equal,
    Index,
    IndexExpr,
    Less,
    Var,
    at_lane_zero,
    lane_base,
    plus_lane,
    uses,
)
from fusecut.codegen.kernel import (
    Kernel,
    SegmentKernels,
    joined,
    kernel_code,
    signature,
    tensor_params,
)
from fusecut.codegen.lanes import lane_map
from fusecut.codegen.launch import pointwise_launch, segment_index_type
from fusecut.codegen.layout import (
    address,
    compact_strides,
    covering_grid,
    decompose,
    index_typedefs,
    merge_axes,
    numel,
    tensor_strides,
)
from fusecut.codegen.precision import fast_math_tensors
from fusecut.codegen.regions import lane_for, shorter_axes, vector_read
from fusecut.codegen.transpose import generate_transpose
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile

THREADS = 256
# a tiled segment splits off its untiled part only where the inputs both kernels read are at
# most this fraction of its bytes (read twice, they should cost next to nothing)
SHARED_READS = 16


class _Unmergeable(Exception):
    """The kernel with merged axes would still need an index the merge removed."""


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
    tiled = generate_transpose(bound, schedule, profile, index, vector, recomputed)
    if tiled is not None:  # its tensors disagree on the innermost axis
        return _split_off_untiled(bound, schedule, profile, index, vector, recomputed) or tiled
    return _direct(bound, schedule, index, vector, recomputed)


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
    """The direct (untiled) kernel, with adjacent axes merged where every access allows."""
    domain = list(schedule.domain)
    per_axis = [(a, a) for a in range(len(domain))]
    kernels, rows = _generate(bound, schedule, index, vector, recomputed, per_axis)
    if rows is None:  # an access that is not a plain domain index (slice, pad, gather...)
        return kernels
    runs = merge_axes(domain, rows)
    if len(runs) == len(per_axis):
        return kernels
    try:
        return _generate(bound, schedule, index, vector, recomputed, runs)[0]
    except _Unmergeable:  # an op that needs the per-axis indices (iota, a guarded store...)
        return kernels


def _generate(bound: Bound, schedule: Schedule, index: int, vector: int | None,
              recomputed: frozenset[int], runs: list[tuple[int, int]]
              ) -> tuple[SegmentKernels, list | None]:
    """The kernel indexing each run ``(first, last)`` of domain axes with one index, and the
    domain strides of every access it makes (None if one is not a plain domain index)."""
    fusion = bound.fusion
    domain = list(schedule.domain)
    rank = len(domain)
    total = numel(domain)
    kname = f"fusecut_segment{index}_pointwise"
    merged = any(a != b for a, b in runs)
    extents = [numel(domain[a:b + 1]) for a, b in runs]
    # the emitter indexes the domain per axis (x0, x1, ...); accesses are rewritten per run
    xs = [Var(f"x{a}") for a in range(rank)]
    run_names = [xs[a] if a == b else Var(f"x{a}_{b}") for a, b in runs]
    launch = pointwise_launch(bound, schedule, extents[-1] if rank and domain[-1] > 1 else 1,
                              vector)
    vec, itype = launch.vector, launch.index_type
    lane_expr = plus_lane(xs[-1]) if rank and vec > 1 else (xs[-1] if rank else ZERO)
    run_lane = plus_lane(run_names[-1]) if rank and vec > 1 else lane_expr
    domain_idx = tuple(xs[:-1] + [lane_expr]) if rank else ()
    axis_of = {x: a for a, x in enumerate(xs)} | ({lane_expr: rank - 1} if rank else {})
    rows: list[tuple[int, ...]] | None = []

    def view(idx: Index, strides: tuple[int, ...]):
        """An access as the kernel addresses it: per run when axes are merged."""
        nonlocal rows
        ds = [0] * rank  # the stride of each domain axis in this access
        for i, s in zip(idx, strides):
            if s == 0 or i == ZERO:
                continue
            a = axis_of.get(i)
            if a is None or ds[a]:
                ds = None
                break
            ds[a] = s
        if ds is None or rows is None:
            rows = None
        else:
            rows.append(tuple(ds))
        if not merged:
            return idx, strides
        if ds is None:
            raise _Unmergeable
        lane = vec > 1 and lane_expr in idx
        out_idx, out_strides = [], []
        for (a, b), run in zip(runs, run_names):
            inner = max((k for k in range(a, b + 1) if domain[k] != 1), default=None)
            if inner is None or ds[inner] == 0:
                continue
            out_idx.append(run_lane if lane and inner == rank - 1 else run)
            out_strides.append(ds[inner])
        return tuple(out_idx), tuple(out_strides)

    pre: list[Stmt] = []  # the vector's loads, issued before any compute
    decls: list[Stmt] = []  # constant lane maps
    aligned: dict[str, int] = {}
    vec_loads: dict[tuple, str] = {}
    lane_maps: dict[tuple[int, ...], str] = {}  # lane -> element of its vector, by map
    vec_starts: dict[tuple, tuple[str, ...]] = {}  # a permuted-lane vector's first address

    # each domain index's values (the innermost one starts a vector), for codegen.bounds
    ranges = {x.name: (0, e - 1, 1) for x, e in zip(xs, domain)}
    if rank and vec > 1:
        ranges[xs[-1].name], ranges[LANE] = (0, domain[-1] - vec, vec), (0, vec - 1, 1)

    def within(t: str, idx: Index) -> IndexExpr | None:
        """The condition under which input t is read at ``idx``, where the domain reaches
        past t's end (``codegen.bounds``): only the outputs' guarded stores use those values,
        so the threads past it load nothing."""
        conds = [c for i, n in zip(idx, bound.shapes[t]) for c in in_bounds(i, n, ranges)]
        return All(*conds) if conds else None

    def load(t: str, idx: Index) -> Code:
        d = fusion.tensors[t].dtype
        inside = within(t, idx)
        idx, strides = view(idx, tensor_strides(bound, t))
        st, ct = cuda.storage(d), cuda.compute(d)
        where = address(idx, strides)

        def scalar(value: Code) -> Code:
            return derived(f"({inside} ? {value} : ({ct})0)", inside, value) if inside else value

        invariant = not any(uses(i, LANE) for i in idx)
        if invariant:
            name_ = em.names.fresh(f"ld_{t}")
            pre.append(declare(ct, name_, scalar(loaded(f"in_{t}[{where}]", d, where))))
            return named(name_)
        if inside is not None and uses(inside, LANE):  # a read per lane
            return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))
        lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]

        def vector(key: tuple, guard: IndexExpr | None = None) -> str:
            """The register vector of input t at the address ``key[1]`` names (loaded once)."""
            if key not in vec_loads:
                vec_loads[key] = em.names.fresh(f"vec_{t}")
                first = address(key[1], strides)
                read = vector_read(st, vec, f"in_{t} + {first}", guard)
                pre.append(declare(f"fc_vec<{st}, {vec}>", vec_loads[key], read,
                                   reads=(first, guard)))
                aligned[t] = vec * d.itemsize
            return vec_loads[key]

        # the innermost index, or a whole vector of a slice, pad or cat piece
        # (codegen.resize)
        first = lane_base(idx[lanes[0]]) if vec > 1 and len(lanes) == 1 else None
        if (first is not None and strides[lanes[0]] == 1
                and all(s % vec == 0 for a, s in enumerate(strides) if a != lanes[0])):
            base = tuple(at_lane_zero(i) if a == lanes[0] else i for a, i in enumerate(idx))
            guards = [g for g in (inside, em.lane_guard(idx[lanes[0]])) if g is not None]
            vname = vector((t, base), All(*guards) if guards else None)
            return loaded(f"{vname}.v[{LANE}]", d, vname, LANE, simple=True)
        permuted = permuted_lanes(t, idx, strides, lanes)
        if permuted is not None:  # lanes that take other elements of their own vector
            key, offsets = permuted
            if offsets not in lane_maps:
                lane_maps[offsets] = em.names.fresh("lanes")
                decls.append(Stmt(f"constexpr int {lane_maps[offsets]}[{vec}] = "
                                  f"{{{', '.join(map(str, offsets))}}};"))
            vname, lanes_of = vector(key, inside), lane_maps[offsets]
            return loaded(f"{vname}.v[{lanes_of}[{LANE}]]", d, vname, lanes_of, LANE)
        return em.let_load(t, scalar(loaded(f"in_{t}[{where}]", d, where)))

    def permuted_lanes(t: str, idx: Index, strides: tuple[int, ...],
                       lanes: list[int]) -> tuple[tuple, tuple[int, ...]] | None:
        """(vector-load key, lane map) where input t's lanes all read elements of the aligned
        vector at the innermost index (``codegen.lanes``); per-axis indexing only."""
        if vec == 1 or merged or len(lanes) != 1 or strides[lanes[0]] != 1 or not rank:
            return None
        if any(s % vec for a, s in enumerate(strides) if a != lanes[0]):
            return None
        if bound.shapes[t][lanes[0]] % vec:  # an aligned vector lies inside t
            return None
        mapped = lane_map(idx[lanes[0]], xs[-1].name, vec)
        if mapped is None or mapped.offsets == tuple(range(vec)):
            return None
        same_vector = tuple(mapped.values if a == lanes[0] else i for a, i in enumerate(idx))
        if (t, same_vector) not in vec_starts:
            vec_starts[(t, same_vector)] = tuple(
                mapped.start if a == lanes[0] else i for a, i in enumerate(idx))
        return (t, vec_starts[(t, same_vector)]), mapped.offsets

    flat_index = None
    if rank:
        flat_lane = (derived("(unsigned long long)flat", "flat"),
                     derived(f"(unsigned int){LANE}", LANE) if vec > 1 else Code("0u"))

        def flat_index(t: str, idx: Index) -> tuple[Code, Code] | None:
            """The loop's flat counter (a multiple of the vector width) and the lane are the
            linear index of a domain-shaped tensor."""
            return flat_lane if idx == domain_idx and tuple(bound.shapes[t]) == tuple(domain) \
                else None

    em = Emitter(bound, schedule.ops, set(schedule.inputs), load, itype, Names(recomputed),
                 fast_math_tensors(bound, schedule), flat_index, launch.resizes)
    stores_after: list[Stmt] = []
    vec_outputs: list[str] = []
    for t in schedule.outputs:
        d = fusion.tensors[t].dtype
        amap = schedule.axis_map[t]
        shape = bound.shapes[t]
        # laid out like the domain (a broadcast axis is a unit axis of the domain)
        identity = (tuple(shape) == tuple(domain)
                    and all(m == a or (m is None and domain[a] == 1)
                            for a, m in enumerate(amap)))
        out_idx = tuple(ZERO if m is None else domain_idx[m] for m in amap)
        val = em.raw(t, out_idx)
        if identity and vec > 1:
            em.lines.append(stmt(f"o_{t}.v[{LANE}] = {cuda.to_storage(val, d)};", LANE, val))
            vec_outputs.append(t)
            where = address(*view(tuple(xs), compact_strides(bound, t)))
            stores_after.append(stmt(f"*reinterpret_cast<fc_vec<{cuda.storage(d)}, {vec}>*>("
                                     f"out_{t} + {where}) = o_{t};", where))
            aligned[t] = vec * d.itemsize
            continue
        guards = []
        covered = {m for m in amap if m is not None}
        for dax in range(rank):
            if dax not in covered and domain[dax] > 1:  # a unit axis's index is always 0
                guards.append(Equal(domain_idx[dax], ZERO))
        guards += [Less(domain_idx[m], Const(shape[a]))
                   for a, m in shorter_axes(bound, schedule, t)]
        where = address(*view(out_idx, compact_strides(bound, t)))
        store = f"out_{t}[{where}] = {cuda.to_storage(val, d)};"
        em.lines.append(stmt(f"if ({All(*guards)}) {store}" if guards else store, guards, where,
                             val))
    params = tensor_params(bound, schedule.inputs, schedule.outputs, em.params)
    n_vec = total // vec
    # One vector per thread over the whole domain (measured on H100: 4-8% faster than a grid of
    # 8 blocks per SM striding over it; two vectors a thread were never faster, see
    # codegen.launch.pointwise_launch).
    blocks = covering_grid(n_vec, THREADS, itype)
    position = ([declare("index_t", "flat", f"v * {vec}")] if rank else []) + \
        decompose(Var("flat"), extents, [r.name for r in run_names], "index_t", unsigned=True)
    compute = []
    for t in vec_outputs:
        compute.append(Stmt(f"fc_vec<{cuda.storage(fusion.tensors[t].dtype)}, {vec}> o_{t};"))
    if vec > 1:
        compute += lines("#pragma unroll") + [lane_for(vec)]
        compute += lines("  // per element") + indent(em.lines, 2) + lines("}")
    else:
        compute += lines("// per element") + em.lines
    if stores_after:
        compute += lines("// vector stores") + stores_after
    # each kernel declares the indices it needs (a broadcast or unit axis may need none)
    step = decls + drop_unread(position + (lines("// loads") + pre if pre else []) +
                               lines("// compute and store") + compute)
    indexed = f", indexed as {extents}" if merged else ""
    body = lines(f"// segment {index}: pointwise over {domain} ({total} elements{indexed}), "
                 f"{vec} per vector")
    body += [index_typedefs(itype, unsigned=True), Stmt(signature(kname, params, THREADS) + " {"),
             declare("index_t", "n_vec", str(n_vec)).indented(2),
             stmt("  for (index_t v = (index_t)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec; "
                  "v += (index_t)gridDim.x * blockDim.x) {", "n_vec")]
    body += indent(step, 4) + lines("  }", "}")
    text = text_of(body)
    if merged and any(re.search(rf"\b{xs[k].name}\b", text) for a, b in runs if a != b
                      for k in range(a, b + 1)):
        raise _Unmergeable
    kernel = Kernel(kname, params, (blocks, 1, 1), (THREADS, 1, 1))
    notes = {"vector": vec, "index_type": itype} | ({"indexed_as": extents} if merged else {})
    return SegmentKernels(index, "pointwise", kernel_code(body), [kernel], [], aligned,
                          notes), rows
