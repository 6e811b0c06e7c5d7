"""Launch decisions: how a generated kernel runs, decided before any of its code is written.

From a segment's schedule, its sizes and the device profile, each kind decides the vector width
(lanes per load and store), the index type (32-bit when every offset fits) and what else shapes
its launch (vectors per thread per step, block shape, split of the reduced axes). The per-kind
generators (``pointwise``, ``transpose``, ``reduction``, ``persistent``) render a kernel from
these decisions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fusecut.codegen.index import ZERO, Index, IndexExpr, Var, plus_lane, uses
from fusecut.codegen.kernel import reducer
from fusecut.codegen.layout import (
    address,
    covering_grid,
    index_type,
    merge_axes,
    tensor_strides,
)
from fusecut.codegen.online import accumulator_bytes
from fusecut.codegen.regions import tensor_index, vector_address
from fusecut.codegen.resize import NO_RESIZES, VectorResizes, whole_vector_resizes
from fusecut.optimizer.analysis.axes import domain_axes
from fusecut.optimizer.analysis.scalars import RANDOM_OPS
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.optimizer.kinds.persistent import COLUMN, is_row_tensor
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile

MAX_VECTOR = 8  # lanes: 16-byte vectors of 16-bit values


@dataclass(frozen=True)
class LaunchDecision:
    """What every generated kernel decides first: ``vector`` lanes per load and store, its
    ``index_type`` (``int`` or ``int64``) and the ``resizes`` (slices, pads, cats) that keep
    its vectors whole."""

    vector: int
    index_type: str
    resizes: VectorResizes = NO_RESIZES


def vector_width(bound: Bound, tensors: Sequence[str], innermost: int,
                 cap: int = MAX_VECTOR) -> int:
    """Lanes of a 16-byte vector of the narrowest of ``tensors`` (at most ``cap``), halved until
    they divide the ``innermost`` extent."""
    smallest = min((bound.fusion.tensors[t].dtype.itemsize for t in tensors), default=4)
    v = max(1, min(cap, 16 // smallest))
    while v > 1 and innermost % v:
        v //= 2
    return v


def segment_index_type(bound: Bound, schedule: Schedule) -> str:
    """The index type of a kernel over the schedule's domain and tensors."""
    return index_type(bound, list(schedule.inputs) + list(schedule.outputs),
                      math.prod(schedule.domain))


def pointwise_launch(bound: Bound, schedule: Schedule, innermost: int,
                     vector: int | None = None) -> LaunchDecision:
    """A pointwise kernel's decisions; ``innermost``: the extent its vectors run along;
    ``vector``: a width the caller imposes (1: the scalar fallback).

    A thread takes one vector. On H100 two a thread were never faster on 16 pointwise regions
    (corpus and Thunder's) and up to 1.5x slower where a vector's loads take many registers:
    Llama-3's RoPE forward (q, k, v, their rotated halves, f32 cos and sin) 179 -> 133 us at
    one, rope_bwd_gqa's pointwise kernel 76 -> 52, nanoGPT's GELU backward 157 -> 139."""
    tensors = list(schedule.inputs) + list(schedule.outputs)
    vec = vector or vector_width(bound, tensors, innermost)
    return LaunchDecision(vec, segment_index_type(bound, schedule),
                          whole_vector_resizes(bound, schedule.ops, vec))


@dataclass(frozen=True)
class RowReductionLaunch:
    """A reduction of the innermost axes (inner layout): a warp per row for short rows (several
    rows a block), else a block of ``per_row`` threads per row, the rows ``split`` in chunks of
    ``chunk`` elements across ``split`` blocks when too few rows fill the GPU.

    ``free_length``: the domain is the one reduced axis (a loss's mean over its rows), whose
    length the code takes at launch with its chunks (``n_reduced``, ``n_chunk``): the code does
    not depend on it, so its decisions may not either. Such a kernel always takes the split
    path (partial results, then a finishing kernel; ``split`` may be 1) and reads whole vectors,
    then the last few elements one at a time."""

    vector: int
    index_type: str
    warp_rows: bool
    per_row: int  # threads per row
    rows_per_block: int
    threads: int  # per block
    split: int
    chunk: int  # elements of a row per block (split > 1)
    blocks: int
    free_length: bool = False

    @property
    def splits(self) -> bool:
        """Whether the code is the split path's (partial results and a finishing kernel)."""
        return self.split > 1 or self.free_length


def row_reduction_launch(bound: Bound, schedule: Schedule, profile: DeviceProfile, rows: int,
                         row_len: int, loaded: Sequence[str], max_vector: int
                         ) -> RowReductionLaunch:
    """``loaded``: the inputs read along the row."""
    innermost = schedule.domain[-1] if schedule.domain else 1
    free_length = list(schedule.domain) == [row_len] and row_len > 1  # see RowReductionLaunch
    # a free length is not divided: vectors as wide as the dtypes allow, the rest one at a time
    vec = vector_width(bound, loaded, 1 << 20 if free_length else innermost, max_vector)
    row_vecs = -(-row_len // vec)
    warp_rows = row_vecs <= 128 and not free_length
    threads = 256
    per_row = 32 if warp_rows else (512 if row_vecs >= 2048 or free_length else 256)
    rows_per_block = threads // per_row if warp_rows else 1
    if not warp_rows:
        threads = per_row
    row_blocks = -(-rows // rows_per_block)
    split = 1
    if not warp_rows and row_blocks < 2 * profile.sm_count and row_vecs >= 4 * per_row:
        split = min(-(-2 * profile.sm_count // row_blocks), row_vecs // (2 * per_row))
        split = max(split, 1)
    chunk = -(-row_vecs // split) * vec
    blocks = max(1, min(row_blocks, profile.sm_count * (2048 // threads)))
    return RowReductionLaunch(vec, segment_index_type(bound, schedule), warp_rows, per_row,
                              rows_per_block, threads, split, chunk, blocks, free_length)


@dataclass(frozen=True)
class ColumnReductionLaunch:
    """A reduction that keeps the innermost axis (outer layout): blocks of ``bx`` x ``by``
    threads, ``vector`` columns a thread, ``grid_x`` blocks across the columns and ``split``
    along the reduced rows."""

    vector: int
    index_type: str
    bx: int
    by: int
    grid_x: int
    split: int


COLUMN_MAX_VECTOR = 8  # columns a thread of a column reduction sums (16-byte bf16 loads)
# Reductions of at most this many rows: each thread sums its columns' rows alone, no shared
# memory (H100: the GQA head sums of rope_bwd_gqa 60 -> 44 us, rope_bwd_gqa_thunder's 59 -> 53)
COLUMN_ALONE_ROWS = 4


def column_reduction_launch(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                            cols: int, rows: int, max_vector: int, whole_rows: bool = False
                            ) -> ColumnReductionLaunch:
    """``cols``: the kept extent; ``rows``: the reduced one. ``whole_rows``: each block takes
    whole rows of the innermost axis and the reduction is not split across blocks (the
    epilogue reads results of the block's other columns, see ``optimizer.kinds.resize``)."""
    innermost = schedule.domain[-1] if schedule.domain else 1
    vec = vector_width(bound, schedule.inputs, innermost, min(COLUMN_MAX_VECTOR, max_vector))
    col_vecs = -(-cols // vec)
    bx = 32
    while bx > 1 and bx // 2 >= col_vecs:
        bx //= 2
    by = 256 // bx
    while by > 1 and (by // 2 >= rows or rows <= COLUMN_ALONE_ROWS) and bx * 2 <= col_vecs:
        # A short reduction (the query heads of a GQA group) leaves rows of the block idle:
        # take fewer rows at a time and more columns; a thread sums a very short one alone.
        by //= 2
        bx *= 2
    if whole_rows:  # a multiple of a row's vectors; 256 threads a block where a row allows
        row_vecs = innermost // vec  # (vec divides the innermost extent)
        bx = row_vecs * max(1, min(round(bx / row_vecs), 256 // row_vecs))
        while by > 1 and bx * by > 256:
            by //= 2
    grid_x = -(-col_vecs // bx)
    split = 1
    if not whole_rows and grid_x < 2 * profile.sm_count and rows >= 64 * by:
        split = min(-(-4 * profile.sm_count // grid_x), rows // (16 * by))
        split = max(split, 1)
    return ColumnReductionLaunch(vec, segment_index_type(bound, schedule), bx, by, grid_x,
                                 split)


FINISH_THREADS = 256


def finish_blocks(outputs: int, profile: DeviceProfile) -> int:
    """Blocks of the kernel that combines split partial results, one thread per output."""
    return max(1, min(-(-outputs // FINISH_THREADS), profile.sm_count * 8))


# ---- persistent kernels (normalization, inner-outer) -------------------------------------------

# Normalization blocks: vectors per thread per row (the device profile's norm_vectors), rows per
# block (see persistent_launch). Measured on H100 (32768 x 4096 bf16): 2 vectors of 8 per thread
# (256-thread rows) beat 4 by 1% on layernorm_fwd and match it elsewhere; 2-4 rows per block,
# resident grids, loading a norm's weights with the row, and one-barrier reductions for
# single-row blocks were no faster.
NORM_ROWS_PER_BLOCK = 1
NORM_MAX_THREADS = 1024  # threads of one row: longer rows hold more vectors per thread
# Input bytes per row from which rows stream (streams_rows): rows of 32 KiB were slower
# streamed on H100 (seed_3334, two f32 rows: 280 against 264 us in registers), group norm's 80 KiB
# rows faster (0.61 of copy bandwidth against 0.34).
NORM_STREAM_BYTES = 64 * 1024
# Rows that draw random numbers (Philox, tens of instructions a value) stream from 16 KiB: the
# next row's copy then overlaps the arithmetic (bias_dropout_add_layernorm's two 8 KiB rows:
# 192 us streamed against 207 in registers).
NORM_STREAM_RANDOM_BYTES = 16 * 1024
# Inner-outer blocks: threads per block (row groups of threads_per_row), blocks per SM, input
# bytes each SM keeps in flight through the prefetch pipeline (32 KiB gives two stages for the
# corpus cases, the fastest measured), and vectors per thread per row.
IO_BLOCK_THREADS = 512
IO_BLOCKS_PER_SM = 1
IO_INFLIGHT_BYTES = 32 * 1024
IO_MAX_STAGES = 4
IO_SLOTS = 2
IO_BULK = True  # sm_90: rows of contiguous inputs move by bulk copies (TMA), not per thread
IO_SMEM_RESERVE = 8 * 1024  # static shared memory (row reductions) and the per-block reserve
IO_KEEP_FLOATS = 48  # registers per thread for row values later stages would recompute


@dataclass(frozen=True)
class PersistentLaunch:
    """A persistent kernel over ``rows`` rows (the kept axes ``rows_axes``) of ``row_len``
    elements (the reduced axes ``row_axes``): ``threads_per_row`` threads a row (a warp for
    short rows: ``warp_rows``), ``rows_per_block`` rows (row groups) a block, each thread
    holding ``slots`` vectors of ``vector`` lanes of its row. ``groups``: resident blocks of row
    groups whose inputs are prefetched through shared memory (inner-outer, and normalizations
    with long rows); ``norm_group``: a normalization block of several rows, each on its own
    named barrier; ``guard``: the per-vector bounds check (threads not all holding whole
    vectors); ``min_blocks``: blocks per SM for ``__launch_bounds__`` (0: none)."""

    vector: int
    index_type: str
    rows_axes: tuple[int, ...]
    row_axes: tuple[int, ...]
    rows: int
    row_len: int
    warp_rows: bool
    threads_per_row: int
    threads: int
    rows_per_block: int
    slots: int
    groups: bool
    norm_group: bool
    guard: bool
    blocks: int
    min_blocks: int


def io_smem_budget(profile: DeviceProfile) -> int:
    """Dynamic shared memory an inner-outer block may use."""
    return profile.smem_per_block // IO_BLOCKS_PER_SM - IO_SMEM_RESERVE


def is_row_input(schedule: Schedule, row_axes: Sequence[int], t: str) -> bool:
    """Whether tensor t varies along the row (the reduced axes)."""
    return is_row_tensor(schedule.axis_map, tuple(row_axes), t)


def column_acc_bytes(bound: Bound, schedule: Schedule) -> int:
    """Bytes of the widest column accumulator of an inner-outer segment (0: none)."""
    return max((accumulator_bytes(reducer(bound, i)) for i in schedule.outer_reductions),
               default=0)


def domain_steps(bound: Bound, schedule: Schedule, t: str) -> dict[int, int]:
    """How far input t's address moves per step of each domain axis it varies along (an axis
    on a run of domain axes moves its stride times the extents inside the run)."""
    strides = tensor_strides(bound, t)
    steps = {}
    for d, entry in enumerate(schedule.axis_map[t]):
        step = strides[d]
        for a in reversed(domain_axes(entry)):
            steps[a] = step
            step *= schedule.domain[a]
    return steps


# op classes whose code reads a row's indices only to address memory: a kernel of them alone
# may index its rows as one flat row (no iota, random number, resize or gather reads a
# per-axis index as a value)
ADDRESS_ONLY = frozenset({OpClass.POINTWISE, OpClass.BROADCAST, OpClass.SQUEEZE,
                          OpClass.REDUCTION, OpClass.SEGMENT_SET})


def flat_rows(bound: Bound, schedule: Schedule, rows_axes: Sequence[int]) -> bool:
    """Whether a persistent kernel indexes its kept axes (``rows_axes``, several) with one flat
    row index: every tensor it reads or writes walks them as one axis (or is broadcast along
    all of them), and no op reads an index but to address memory. Then the code holds none
    of their extents (a [batch, sequence, hidden] normalization takes batch x sequence rows at
    launch) and divides by none of them."""
    if len(rows_axes) < 2 or list(rows_axes) != list(range(rows_axes[0], rows_axes[-1] + 1)):
        return False
    if any(get_spec(bound.fusion.ops[i].name).op_class not in ADDRESS_ONLY
           for i in schedule.ops):
        return False
    extents = [schedule.domain[a] for a in rows_axes]
    walks = []
    for t in list(schedule.inputs) + list(schedule.outputs):
        steps = domain_steps(bound, schedule, t)
        walks.append(tuple(steps.get(a, 0) for a in rows_axes))
    return merge_axes(extents, walks) == [(0, len(rows_axes) - 1)]


def streams_rows(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                 row_axes: Sequence[int], row_len: int) -> bool:
    """Whether a normalization's rows are long enough to stream through shared memory as the
    inner-outer scheme's do (and short enough for two to fit there): a block holding a long
    row in registers reads it, reduces, then writes it, and the blocks of an SM (two at most,
    for such rows) go through these phases together; prefetching the next row while the
    current one is reduced and written keeps memory busy throughout."""
    last = len(schedule.domain) - 1
    if last not in row_axes:
        return False
    # the inputs read along the row and different in every row: a weight the same in every
    # row (or varying along part of it) is read once and stays in cache
    along = [t for t in schedule.inputs
             if (steps := domain_steps(bound, schedule, t)).get(last) == 1
             and not steps.keys() <= set(row_axes)]
    nbytes = sum(-(-row_len * bound.fusion.tensors[t].dtype.itemsize // 16) * 16
                 for t in along)
    random = any(bound.fusion.ops[i].name in RANDOM_OPS for i in schedule.ops)
    least = NORM_STREAM_RANDOM_BYTES if random else NORM_STREAM_BYTES
    return least <= nbytes and 2 * nbytes <= io_smem_budget(profile)


def persistent_launch(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                      max_vector: int) -> PersistentLaunch:
    """A normalization's or inner-outer segment's block shape, vector width and grid;
    ``max_vector``: the widest vector allowed (1: the scalar fallback)."""
    domain = schedule.domain
    rows_axes = tuple(a for a in range(len(domain)) if a not in schedule.reduction_axes)
    row_axes = tuple(schedule.reduction_axes)
    rows = math.prod(domain[a] for a in rows_axes)
    row_len = math.prod(domain[a] for a in row_axes)
    itype = segment_index_type(bound, schedule)
    row_inputs = [t for t in schedule.inputs if is_row_input(schedule, row_axes, t)]
    vec = vector_width(bound, row_inputs or list(schedule.inputs), domain[-1], max_vector)
    row_vecs = -(-row_len // vec)
    columns = bool(schedule.outer_reductions)
    streamed = not columns and streams_rows(bound, schedule, profile, row_axes, row_len)
    # Short rows: a warp per row, eight rows per block. Longer rows: a block per row, each
    # thread holding several vectors (independent loads in flight); inner-outer blocks hold
    # fewer (their column accumulators need registers) and fewer blocks run, so that fewer
    # partial column sums are left for the finishing kernel.
    warp_rows = row_vecs <= 128 and not columns
    groups = columns or streamed  # row groups, prefetched inputs (codegen.persistent)
    if groups:
        per_row = max(32, min(512, -(-row_vecs // IO_SLOTS // 32) * 32))
        n = max(1, IO_BLOCK_THREADS // per_row)
        if per_row > 32:  # named barriers 1..15, one per group
            n = min(15, n)
        # the groups' column sums meet in shared memory at the end
        acc = column_acc_bytes(bound, schedule)
        while n > 1 and n * row_len * acc > io_smem_budget(profile):
            n //= 2
        threads = per_row * n
    elif warp_rows:
        per_row, threads = 32, 256
    else:
        vectors = profile.norm_vectors  # per thread per row: see DeviceProfile
        per_row = max(64, min(NORM_MAX_THREADS, -(-row_vecs // vectors // 32) * 32))
        threads = per_row * max(1, min(NORM_ROWS_PER_BLOCK, 15, 1024 // per_row))  # barriers
    slots = -(-row_vecs // per_row)  # E: vectors per thread per row
    rows_per_block = threads // per_row
    # normalization blocks of several rows: a group of threads per row, meeting on its own
    # named barrier
    norm_group = not columns and not warp_rows and rows_per_block > 1
    # Each thread holding the same number of whole vectors needs no bounds check per vector,
    # and the compiler can then fold what depends on the count (Welford's n and first value):
    # on H100 10% faster for layernorm_fwd, softmax_fwd and softmax_bwd.
    guard = columns or slots * per_row * vec != row_len
    if groups:  # resident blocks striding over the rows (and, inner-outer, one column
        # partial per block): as many blocks as fit at once
        blocks = max(1, min(-(-rows // rows_per_block), profile.sm_count * IO_BLOCKS_PER_SM))
    else:  # a block per row (group): 5-7% faster on H100 than striding a resident grid
        blocks = covering_grid(rows, rows_per_block, itype)
    return PersistentLaunch(vec, itype, rows_axes, row_axes, rows, row_len, warp_rows, per_row,
                            threads, rows_per_block, slots, groups, norm_group, guard, blocks,
                            IO_BLOCKS_PER_SM if groups else 0)


@dataclass(frozen=True)
class PrefetchPlan:
    """What a persistent kernel of row groups prefetches into shared memory, ``stages`` rows
    deep (0: nothing; the rows are read as the normalization scheme reads them): ``staged``
    row tensors per stage and group, ``fixed`` row tensors read once (the same in every row),
    ``row_scalars`` per-row values (a slot per thread and stage); ``bulk``: the staged ones
    moved by bulk copies on sm_90; ``smem_offsets``: where each lies in the ``dyn_smem`` bytes
    of dynamic shared memory (which also hold the groups' column sums at the end); ``kept``:
    values of stage 0 kept in registers for later stages (see ``kept_values``)."""

    staged: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()
    row_scalars: tuple[str, ...] = ()
    stages: int = 0
    bulk: tuple[str, ...] = ()
    smem_offsets: tuple[tuple[str, int], ...] = ()
    dyn_smem: int = 0
    kept: tuple[str, ...] = ()


def slot_index(launch: PersistentLaunch, rows: Sequence[IndexExpr], cols: Sequence[IndexExpr],
               lane: bool) -> Index:
    """The index of every domain axis at a thread's row position: ``rows`` index the kept
    axes, ``cols`` the row's; the innermost one plus the vector lane where ``lane``."""
    out = []
    ri, ci = iter(rows), iter(cols)
    last = len(launch.rows_axes) + len(launch.row_axes) - 1
    for a in range(last + 1):
        if a in launch.row_axes:
            var = next(ci)
            out.append(plus_lane(var) if lane and a == last and launch.vector > 1 else var)
        else:
            out.append(next(ri))
    return tuple(out)


def contiguous_row(bound: Bound, schedule: Schedule, launch: PersistentLaunch, t: str) -> bool:
    """Whether input t's row is one contiguous run of memory, 16-byte aligned (so one bulk
    copy moves it)."""
    size = bound.fusion.tensors[t].dtype.itemsize
    steps = domain_steps(bound, schedule, t)
    if any(a not in steps for a in launch.row_axes) or (launch.row_len * size) % 16:
        return False
    expect = 1
    for a in reversed(launch.row_axes):
        if schedule.domain[a] > 1 and steps[a] != expect:
            return False
        expect *= schedule.domain[a]
    return all((step * size) % 16 == 0 for a, step in steps.items()
               if a not in launch.row_axes)


def prefetch_plan(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                  launch: PersistentLaunch) -> PrefetchPlan:
    """Choose the inputs each thread prefetches into its shared-memory slots, the pipeline
    depth and the shared-memory layout. Row tensors read with whole vectors (of 4, 8 or a
    multiple of 16 bytes) are staged per row, or once if their address does not depend on
    the row; per-row values of 4 or 8 bytes get a slot per thread. The rest is read as the
    normalization scheme reads it."""
    fusion, pers = bound.fusion, schedule.persistence
    used = {n for i, st in pers.eval_stages.items() if min(st) < COLUMN
            for n in fusion.ops[i].inputs}
    rvars = [f"i{a}" for a in launch.rows_axes]
    lane_idx = slot_index(launch, [Var(v) for v in rvars],
                          [Var(f"c_{a}") for a in launch.row_axes], True)
    row_idx = slot_index(launch, [Var(v) for v in rvars], [ZERO] * len(launch.row_axes), False)

    def on_row(addr: IndexExpr) -> bool:
        """Whether an address moves with the row (reads a row index)."""
        return uses(addr, *rvars)

    staged, fixed, row_scalars = [], [], []
    for t in schedule.inputs:
        if t not in used:
            continue
        size = fusion.tensors[t].dtype.itemsize
        if is_row_input(schedule, launch.row_axes, t):
            addr = vector_address(bound, t, tensor_index(schedule, lane_idx, t), launch.vector)
            n = launch.vector * size
            if addr is not None and (n in (4, 8) or n % 16 == 0):
                (staged if on_row(addr) else fixed).append(t)
        elif size in (4, 8) and on_row(address(tensor_index(schedule, row_idx, t),
                                               tensor_strides(bound, t))):
            row_scalars.append(t)
    groups, threads = launch.rows_per_block, launch.threads

    def row_bytes(t):
        return -(-launch.row_len * fusion.tensors[t].dtype.itemsize // 16) * 16

    def scalar_bytes(t):
        return -(-threads * fusion.tensors[t].dtype.itemsize // 16) * 16

    per_row = sum(row_bytes(t) for t in staged)
    per_stage = groups * per_row + sum(scalar_bytes(t) for t in row_scalars)
    fixed_bytes = sum(row_bytes(t) for t in fixed)
    budget = io_smem_budget(profile)
    combine = (groups * launch.row_len * column_acc_bytes(bound, schedule)
               if groups > 1 and schedule.outer_reductions else 0)
    stages = 0
    if per_stage:
        want = 1 + -(-IO_INFLIGHT_BYTES // IO_BLOCKS_PER_SM // max(1, groups * per_row))
        want = max(2, min(IO_MAX_STAGES, want))
        stages = max((s for s in range(2, want + 1) if fixed_bytes + s * per_stage <= budget),
                     default=0)
    if not stages:  # the rows do not fit twice: read them as the normalization scheme does
        staged, fixed, row_scalars = [], [], []
    bulk = [t for t in staged if contiguous_row(bound, schedule, launch, t)] if IO_BULK else []
    offsets, offset = [], 0
    for t in staged:
        offsets.append((t, offset))
        offset += stages * groups * row_bytes(t)
    for t in row_scalars:
        offsets.append((t, offset))
        offset += stages * scalar_bytes(t)
    for t in fixed:
        offsets.append((t, offset))
        offset += row_bytes(t)
    kept = kept_values(bound, schedule, launch) if stages else ()
    return PrefetchPlan(tuple(staged), tuple(fixed), tuple(row_scalars), stages, tuple(bulk),
                        tuple(offsets), max(offset, combine), kept)


def kept_values(bound: Bound, schedule: Schedule, launch: PersistentLaunch) -> tuple[str, ...]:
    """Values of stage 0 that later stages would recompute from the inputs (the normalization
    scheme's projection to inputs), kept in registers instead when they fit: prefetching freed
    the registers that held the inputs, and recomputing costs a second read of the inputs from
    shared memory, their conversion and the arithmetic."""
    fusion, pers = bound.fusion, schedule.persistence
    if pers.n_stages < 2:
        return ()
    evals = pers.eval_stages
    producer = {o: i for i in schedule.ops for o in fusion.ops[i].outputs}
    later = [i for i in schedule.ops
             if 0 not in evals[i] and any(0 < s < COLUMN for s in evals[i])]
    keep = tuple(t for t in dict.fromkeys(n for i in later for n in fusion.ops[i].inputs)
                 if t in producer and 0 in evals[producer[t]]
                 and is_row_input(schedule, launch.row_axes, t) and t not in pers.persisted)
    if len(keep) * launch.slots * launch.vector > IO_KEEP_FLOATS:
        return ()
    return keep
