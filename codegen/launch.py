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

from codegen.layout import index_type
from optimizer.analysis.shapes import Bound
from optimizer.ir.opspec import get_spec
from optimizer.kinds.rules import Schedule
from optimizer.profiles import DeviceProfile

MAX_VECTOR = 8  # lanes: 16-byte vectors of 16-bit values


@dataclass(frozen=True)
class LaunchDecision:
    """What every generated kernel decides first: ``vector`` lanes per load and store, its
    ``index_type`` (``int`` or ``int64``) and ``unroll`` vectors per thread per step."""

    vector: int
    index_type: str
    unroll: int = 1


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


def unroll_for(bound: Bound, schedule: Schedule) -> int:
    """Vectors per thread per step: four for light arithmetic (memory-level parallelism),
    fewer for long chains, whose registers the extra vectors would spill."""
    work = sum(get_spec(bound.fusion.ops[i].name).cost for i in schedule.ops)
    return 4 if work <= 24 else 2 if work <= 64 else 1


def pointwise_launch(bound: Bound, schedule: Schedule, innermost: int,
                     vector: int | None = None) -> LaunchDecision:
    """A pointwise kernel's decisions; ``innermost``: the extent its vectors run along;
    ``vector``: a width the caller imposes (1: the scalar fallback)."""
    tensors = list(schedule.inputs) + list(schedule.outputs)
    return LaunchDecision(vector or vector_width(bound, tensors, innermost),
                          segment_index_type(bound, schedule), unroll_for(bound, schedule))


@dataclass(frozen=True)
class RowReductionLaunch:
    """A reduction of the innermost axes (inner layout): a warp per row for short rows (several
    rows a block), else a block of ``per_row`` threads per row, the rows ``split`` in chunks of
    ``chunk`` elements across ``split`` blocks when too few rows fill the GPU."""

    vector: int
    index_type: str
    warp_rows: bool
    per_row: int  # threads per row
    rows_per_block: int
    threads: int  # per block
    split: int
    chunk: int  # elements of a row per block (split > 1)
    blocks: int


def row_reduction_launch(bound: Bound, schedule: Schedule, profile: DeviceProfile, rows: int,
                         row_len: int, loaded: Sequence[str], max_vector: int
                         ) -> RowReductionLaunch:
    """``loaded``: the inputs read along the row."""
    innermost = schedule.domain[-1] if schedule.domain else 1
    vec = vector_width(bound, loaded, innermost, max_vector)
    row_vecs = -(-row_len // vec)
    warp_rows = row_vecs <= 128
    threads = 256
    per_row = 32 if warp_rows else (512 if row_vecs >= 2048 else 256)
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
                              rows_per_block, threads, split, chunk, blocks)


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


def column_reduction_launch(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                            cols: int, rows: int, max_vector: int) -> ColumnReductionLaunch:
    """``cols``: the kept extent; ``rows``: the reduced one."""
    innermost = schedule.domain[-1] if schedule.domain else 1
    vec = vector_width(bound, schedule.inputs, innermost, min(4, max_vector))
    col_vecs = -(-cols // vec)
    bx = 32
    while bx > 1 and bx // 2 >= col_vecs:
        bx //= 2
    by = 256 // bx
    while by > 1 and by // 2 >= rows and bx * 2 <= col_vecs:
        # A short reduction (the query heads of a GQA group) leaves rows of the block idle:
        # take fewer rows at a time and more columns.
        by //= 2
        bx *= 2
    grid_x = -(-col_vecs // bx)
    split = 1
    if grid_x < 2 * profile.sm_count and rows >= 64 * by:
        split = min(-(-4 * profile.sm_count // grid_x), rows // (16 * by))
        split = max(split, 1)
    return ColumnReductionLaunch(vec, segment_index_type(bound, schedule), bx, by, grid_x,
                                 split)


FINISH_THREADS = 256


def finish_blocks(outputs: int, profile: DeviceProfile) -> int:
    """Blocks of the kernel that combines split partial results, one thread per output."""
    return max(1, min(-(-outputs // FINISH_THREADS), profile.sm_count * 8))
