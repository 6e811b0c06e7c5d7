"""Persistent segments: normalization and inner-outer.

One block (or one warp, for short rows) owns a row at a time and walks it in the stages of
``optimizer.kinds.persistent``: stage s evaluates what it needs at each of the thread's row
positions (``E`` vectors of ``VEC`` elements, kept in registers), accumulates the row reductions
of stage s, and the block combines them; their results are broadcast to every thread and later
stages use them. Values that do not vary along the row (row statistics, per-row inputs) are
computed once per row, outside the per-element loops. Inputs read in several stages are loaded
once into registers; values computed from reduction results that later stages need stay in
registers too.

Inner-outer segments also hold per-thread column accumulators: a thread sees the same columns in
every row, so it sums them across the rows it takes; a finishing kernel combines the blocks'
partial sums and runs the column epilogue. Their blocks are resident for the whole kernel (one per
SM) and hold several row groups, each walking its own rows (strided by the grid); the groups'
column sums are combined in shared memory at the end, so one partial row per block is left for
the finishing kernel. Registers hold the column accumulators, not the inputs: the inputs of the
next row are prefetched into shared memory while the group works on the current one (on sm_90,
one bulk copy (TMA) per contiguous row tensor, issued by the group's first thread and completed
on an mbarrier; otherwise each thread copies its own slots with ``cp.async``, so no barrier is
needed), and every stage reads the row from there. Stage-0 values that later stages would
recompute are kept in registers when they fit. Row reductions of a group meet on the group's
named barrier, so groups never wait for each other.
Measured on H100 (layernorm_bwd, 32768 x 4096 bf16): holding the inputs in registers (the
normalization scheme) left no registers for the column accumulators at full occupancy and
blocks whose loads waited out each row's reductions: 0.63 of the copy bandwidth; this scheme
reaches 0.81-0.83. Deeper prefetch (3-4 rows), more blocks per SM, 1024-thread blocks and
contiguous runs of rows per block were each slower.
"""

from __future__ import annotations

import math
import re

from codegen import cuda
from codegen.emit import Names
from codegen.kernel import (
    Kernel,
    KernelParam,
    SegmentKernels,
    Workspace,
    assemble,
    indent,
    reducer,
    signature,
    tensor_params,
)
from codegen.launch import segment_index_type, vector_width
from codegen.layout import address, covering_grid, decompose, tensor_strides
from codegen.online import accumulator_bytes
from codegen.regions import LANE, Region, at_lane_zero, lane_loop
from optimizer.analysis.axes import domain_axes
from optimizer.analysis.shapes import Bound
from optimizer.kinds.persistent import COLUMN, is_row_tensor
from optimizer.kinds.rules import Schedule
from optimizer.profiles import DeviceProfile

# Normalization blocks: vectors per thread per row, rows per block (see _Persistent.__init__).
# Measured on H100 (32768 x 4096 bf16): 2 vectors of 8 per thread (256-thread rows) beat 4 by
# 1% on layernorm_fwd and match it elsewhere; 2-4 rows per block, resident grids, loading a
# norm's weights with the row, and one-barrier reductions for single-row blocks were no faster.
NORM_VECTORS = 2
NORM_ROWS_PER_BLOCK = 1
NORM_MAX_THREADS = 1024  # threads of one row: longer rows hold more vectors per thread
NORM_STREAM_BYTES = 32 * 1024  # input bytes per row from which rows stream (streams_rows)
# Inner-outer blocks: threads per block (row groups of threads_per_row), blocks per SM, input
# bytes each SM keeps in flight through the prefetch pipeline (32 KiB gives two stages for the
# corpus cases, the fastest measured), and vectors per thread per row.
IO_BLOCK_THREADS = 512
IO_BLOCKS_PER_SM = 1
IO_INFLIGHT_BYTES = 32 * 1024
IO_MAX_STAGES = 4
IO_SLOTS = 2
IO_BULK = True  # sm_90: rows of contiguous inputs move by bulk copies (TMA), not per thread
IO_KEEP_FLOATS = 48  # registers per thread for row values later stages would recompute
IO_SMEM_RESERVE = 8 * 1024  # static shared memory (row reductions) and the per-block reserve

IO_PREAMBLE = r"""
// ---- inner-outer: prefetch through shared memory, group reductions ------------------------
// Copy BYTES (4, 8 or a multiple of 16) from global to this thread's own shared-memory slot,
// asynchronously; a commit closes a group of copies, wait<N> leaves at most N groups in flight.
template <int BYTES>
__device__ __forceinline__ void fc_cp_async(void* dst, const void* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
#if __CUDA_ARCH__ >= 800
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s + 16 * i),
                   "l"((const char*)src + 16 * i) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(BYTES)
                 : "memory");
  }
#else
  (void)s;
  for (int i = 0; i < BYTES / 4; ++i) ((int*)dst)[i] = ((const int*)src)[i];
#endif
}
__device__ __forceinline__ void fc_cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void fc_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#if __CUDA_ARCH__ >= 900
// Bulk copies (TMA) into shared memory, completed on an mbarrier; the barrier's phase parity
// says which completion a waiter waits for.
__device__ __forceinline__ unsigned fc_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void fc_mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fc_smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void fc_mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void fc_mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(fc_smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fc_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fc_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void fc_mbar_wait(unsigned long long* bar, int parity) {
  asm volatile("{\n .reg .pred p;\n FC_WAIT_%=:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra FC_WAIT_%=;\n}" ::"r"(fc_smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void fc_bulk_copy(void* dst, const void* src, unsigned bytes,
                                             unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
               "%2, [%3];" ::"r"(fc_smem_addr(dst)), "l"(src), "r"(bytes),
               "r"(fc_smem_addr(bar)) : "memory");
}
#endif
"""


def generate_persistent(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                        index: int, vector: int | None = None,
                        recomputed: frozenset[int] = frozenset()) -> SegmentKernels:
    """``recomputed``: ops of the segment that also run in another one (marked in comments)."""
    return _Persistent(bound, schedule, profile, index, vector or 8, recomputed).build()


class _Persistent:
    def __init__(self, bound, schedule, profile, index, max_vector, recomputed=frozenset()):
        self.bound, self.schedule, self.profile, self.index = bound, schedule, profile, index
        self.fusion = bound.fusion
        self.domain = list(schedule.domain)
        self.rows_axes = [a for a in range(len(self.domain))
                          if a not in schedule.reduction_axes]
        self.row_axes = list(schedule.reduction_axes)
        self.rows = math.prod(self.domain[a] for a in self.rows_axes)
        self.row_len = math.prod(self.domain[a] for a in self.row_axes)
        self.pers = schedule.persistence
        self.kind = schedule.kind
        self.names = Names(recomputed)
        self.itype = segment_index_type(bound, schedule)
        self.aligned: dict[str, int] = {}
        self.params: list[str] = []
        self.name = f"fusecut_segment{index}_{schedule.kind.value}"
        row_inputs = [t for t in schedule.inputs if self.is_row(t)]
        self.vec = vector_width(bound, row_inputs or list(schedule.inputs), self.domain[-1],
                                max_vector)
        row_vecs = -(-self.row_len // self.vec)
        columns = bool(schedule.outer_reductions)
        streamed = not columns and self.streams_rows()
        # Short rows: a warp per row, eight rows per block. Longer rows: a block per row, each
        # thread holding several vectors (independent loads in flight); inner-outer blocks hold
        # fewer (their column accumulators need registers) and fewer blocks run, so that fewer
        # partial column sums are left for the finishing kernel.
        self.warp_rows = row_vecs <= 128 and not columns
        self.row_reducers = [reducer(bound, i) for i in schedule.reductions]
        self.col_reducers = [reducer(bound, i) for i in schedule.outer_reductions]
        if columns or streamed:  # row groups of threads_per_row threads (module docstring)
            self.threads_per_row = max(32, min(512, -(-row_vecs // IO_SLOTS // 32) * 32))
            groups = max(1, IO_BLOCK_THREADS // self.threads_per_row)
            if self.threads_per_row > 32:  # named barriers 1..15, one per group
                groups = min(15, groups)
            # the groups' column sums meet in shared memory at the end
            acc = max((accumulator_bytes(r) for r in self.col_reducers), default=0)
            while groups > 1 and groups * self.row_len * acc > self.smem_budget:
                groups //= 2
            self.threads = self.threads_per_row * groups
        elif self.warp_rows:
            self.threads_per_row, self.threads = 32, 256
        else:
            self.threads_per_row = max(64, min(NORM_MAX_THREADS,
                                               -(-row_vecs // NORM_VECTORS // 32) * 32))
            self.threads = self.threads_per_row * max(1, min(
                NORM_ROWS_PER_BLOCK, 15, 1024 // self.threads_per_row))  # named barriers 1..15
        self.slots = -(-row_vecs // self.threads_per_row)  # E: vectors per thread per row
        self.rows_per_block = self.threads // self.threads_per_row
        self.smem_decls: list[str] = []
        self.rvars = [f"i{a}" for a in self.rows_axes]
        self.cvars = [f"c_{a}" for a in self.row_axes]
        self.groups = columns or streamed  # row groups, prefetched inputs
        # normalization blocks of several rows: a group of threads per row, meeting on its own
        # named barrier
        self.norm_group = not columns and not self.warp_rows and self.rows_per_block > 1
        # Each thread holding the same number of whole vectors needs no bounds check per vector,
        # and the compiler can then fold what depends on the count (Welford's n and first value):
        # on H100 10% faster for layernorm_fwd, softmax_fwd and softmax_bwd.
        self.guard = columns or self.slots * self.threads_per_row * self.vec != self.row_len
        # prefetched inputs: row tensors (per stage and group, or once if the same in every
        # row) and per-row values (a slot per thread and stage); see plan_prefetch
        self.staged: list[str] = []
        self.fixed: list[str] = []
        self.row_scalars: list[str] = []
        self.stages = 0
        self.bulk: list[str] = []  # staged inputs moved by bulk copies (sm_90)
        self.smem_offsets: dict[str, int] = {}
        self.dyn_smem = 0

    def streams_rows(self) -> bool:
        """Whether a normalization's rows are long enough to stream through shared memory as
        the inner-outer scheme's do (and short enough for two to fit there): a block holding
        a long row in registers reads it, reduces, then writes it, and the blocks of an SM (two
        at most, for such rows) go through these phases together; prefetching the next row
        while the current one is reduced and written keeps memory busy throughout."""
        last = len(self.domain) - 1
        if last not in self.row_axes:
            return False
        # the inputs read along the row (a weight varying along part of it stays in cache)
        along = [t for t in self.schedule.inputs if self.domain_steps(t).get(last) == 1]
        nbytes = sum(-(-self.row_len * self.fusion.tensors[t].dtype.itemsize // 16) * 16
                     for t in along)
        return NORM_STREAM_BYTES <= nbytes and 2 * nbytes <= self.smem_budget

    @property
    def smem_budget(self) -> int:
        """Dynamic shared memory an inner-outer block may use."""
        return self.profile.smem_per_block // IO_BLOCKS_PER_SM - IO_SMEM_RESERVE

    def is_row(self, t: str) -> bool:
        return is_row_tensor(self.schedule.axis_map, tuple(self.row_axes), t)

    def p_idx(self, rows: list[str], cols: list[str], lane: bool) -> tuple[str, ...]:
        out = []
        ri, ci = iter(rows), iter(cols)
        last = len(self.domain) - 1
        for a in range(len(self.domain)):
            if a in self.row_axes:
                var = next(ci)
                out.append(f"({var} + {LANE})" if lane and a == last and self.vec > 1 else var)
            else:
                out.append(next(ri))
        return tuple(out)

    def region(self, rows, cols, lane) -> Region:
        return Region(self.bound, self.schedule, self.itype, self.p_idx(rows, cols, lane),
                      self.vec if lane else 1, self.aligned, self.params, self.names)

    # ---- inner-outer prefetch -----------------------------------------------------------------

    def plan_prefetch(self) -> None:
        """Choose the inputs each thread prefetches into its shared-memory slots, the pipeline
        depth and the shared-memory layout. Row tensors read with whole vectors (of 4, 8 or a
        multiple of 16 bytes) are staged per row, or once if their address does not depend on
        the row; per-row values of 4 or 8 bytes get a slot per thread. The rest is read as the
        normalization scheme reads it."""
        sched, fusion = self.schedule, self.fusion
        used = {n for i, st in self.pers.eval_stages.items() if min(st) < COLUMN
                for n in fusion.ops[i].inputs}
        lane_reg = self.region(self.rvars, self.cvars, True)
        row_reg = self.region(self.rvars, ["0"] * len(self.row_axes), False)
        by_row = re.compile(r"\b(" + "|".join(self.rvars) + r")\b") if self.rvars else None

        def on_row(addr: str) -> bool:
            return bool(by_row and by_row.search(addr))

        for t in sched.inputs:
            if t not in used:
                continue
            size = fusion.tensors[t].dtype.itemsize
            if self.is_row(t):
                addr = self.vector_address(t, lane_reg)
                n = self.vec * size
                if addr is not None and (n in (4, 8) or n % 16 == 0):
                    (self.staged if on_row(addr) else self.fixed).append(t)
            elif size in (4, 8) and on_row(address(row_reg.index_of(t),
                                                   tensor_strides(self.bound, t))):
                self.row_scalars.append(t)
        groups, threads = self.rows_per_block, self.threads

        def row_bytes(t):
            return -(-self.row_len * fusion.tensors[t].dtype.itemsize // 16) * 16

        per_row = sum(row_bytes(t) for t in self.staged)
        per_stage = groups * per_row + sum(
            -(-threads * fusion.tensors[t].dtype.itemsize // 16) * 16 for t in self.row_scalars)
        fixed = sum(row_bytes(t) for t in self.fixed)
        budget = self.smem_budget
        combine = (groups * self.row_len * max(accumulator_bytes(r) for r in self.col_reducers)
                   if groups > 1 and self.col_reducers else 0)
        stages = 0
        if per_stage:
            want = 1 + -(-IO_INFLIGHT_BYTES // IO_BLOCKS_PER_SM // max(1, groups * per_row))
            want = max(2, min(IO_MAX_STAGES, want))
            stages = max((s for s in range(2, want + 1) if fixed + s * per_stage <= budget),
                         default=0)
        if not stages:  # the rows do not fit twice: read them as the normalization scheme does
            self.staged, self.fixed, self.row_scalars = [], [], []
            fixed = per_stage = 0
        self.stages = stages
        if IO_BULK:
            self.bulk = [t for t in self.staged if self.contiguous_row(t)]
            for t in self.bulk:
                self.aligned[t] = max(self.aligned.get(t, 1), 16)
        offset = 0
        for t in self.staged:
            self.smem_offsets[t] = offset
            offset += stages * groups * row_bytes(t)
        for t in self.row_scalars:
            self.smem_offsets[t] = offset
            offset += stages * -(-threads * fusion.tensors[t].dtype.itemsize // 16) * 16
        for t in self.fixed:
            self.smem_offsets[t] = offset
            offset += row_bytes(t)
        self.dyn_smem = max(offset, combine)

    def kept(self) -> list[str]:
        """Values of stage 0 that later stages would recompute from the inputs (the
        normalization scheme's projection to inputs), kept in registers instead when they fit:
        prefetching freed the registers that held the inputs, and recomputing costs a second
        read of the inputs from shared memory, their conversion and the arithmetic."""
        if not self.stages or self.pers.n_stages < 2:
            return []
        fusion, evals = self.fusion, self.pers.eval_stages
        producer = {o: i for i in self.schedule.ops for o in fusion.ops[i].outputs}
        later = [i for i in self.schedule.ops
                 if 0 not in evals[i] and any(0 < s < COLUMN for s in evals[i])]
        keep = [t for t in dict.fromkeys(n for i in later for n in fusion.ops[i].inputs)
                if t in producer and 0 in evals[producer[t]] and self.is_row(t)
                and t not in self.pers.persisted]
        if len(keep) * self.slots * self.vec > IO_KEEP_FLOATS:
            return []
        return keep

    def vector_address(self, t: str, reg: Region) -> str | None:
        """The address of input t's first element at a thread's vector slot, if the vector is
        contiguous in memory (else None)."""
        idx = reg.index_of(t)
        strides = tensor_strides(self.bound, t)
        lanes = [a for a, i in enumerate(idx) if LANE in i]
        if self.vec == 1 and not lanes:
            return address(idx, strides)
        if (self.vec > 1 and len(lanes) == 1 and strides[lanes[0]] == 1
                and all(x % self.vec == 0 for a, x in enumerate(strides) if a != lanes[0])):
            a = lanes[0]
            return address(tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx)),
                           strides)
        return None

    def slot_of(self, t: str, buf: str) -> str:
        """Where this thread's slot of input t lies in shared memory, in stage buffer ``buf``
        (an element pointer expression)."""
        if t in self.fixed:
            return f"(sm_{t} + c)"
        if t in self.row_scalars:
            return f"(sm_{t} + {buf} * {self.threads} + threadIdx.x)"
        return f"(sm_{t} + ({buf} * {self.rows_per_block} + g) * {self.row_len} + c)"

    def prefetch(self, row: str, buf: str, first: bool, reuse: bool = False) -> list[str]:
        """Issue the copies of row ``row`` (if it exists) into stage buffer ``buf``: per
        thread, committed as one group (an empty group past the last row keeps the count), and
        on sm_90 one bulk copy per contiguous row tensor, issued by the group's first thread."""
        fusion = self.fusion
        nvars = [f"n{a}" for a in self.rows_axes]
        reg = self.region(nvars, self.cvars, True)
        row_reg = self.region(nvars, ["0"] * len(self.row_axes), False)
        body = decompose("nrow", [self.domain[a] for a in self.rows_axes], nvars, "index_t")
        for t in self.row_scalars:
            size = fusion.tensors[t].dtype.itemsize
            addr = address(row_reg.index_of(t), tensor_strides(self.bound, t))
            body.append(f"fc_cp_async<{size}>({self.slot_of(t, buf)}, in_{t} + {addr});")

        def slot_loop(tensors):
            per_slot = []
            for t in tensors:
                size = self.vec * fusion.tensors[t].dtype.itemsize
                src = f"in_{t} + {self.vector_address(t, reg)}"
                per_slot.append(f"fc_cp_async<{size}>({self.slot_of(t, buf)}, {src});")
                self.aligned[t] = max(self.aligned.get(t, 1), min(16, size))
            if not per_slot:
                return []
            return ["#pragma unroll", f"for (int k = 0; k < {self.slots}; ++k) {{",
                    f"  const index_t c = (k * {self.threads_per_row} + {self.tid}) * "
                    f"{self.vec};",
                    f"  if (c < {self.row_len}) {{"] + \
                indent(decompose("c", [self.domain[a] for a in self.row_axes], self.cvars,
                                 "index_t") + per_slot, 4) + ["  }", "}"]

        fixed = self.fixed if first else []
        if self.bulk:
            total = sum(self.row_len * fusion.tensors[t].dtype.itemsize for t in self.bulk)
            issue = [f"if ({self.tid} == 0) {{"]
            if reuse:  # the buffer held an earlier row: the group must be done with it
                issue += [f"  if (it > 0) fc_mbar_wait(&fc_empty[{buf}][g], "
                          f"((it - 1) / {self.stages}) & 1);"]
            issue += [f"  fc_mbar_expect_tx(&fc_full[{buf}][g], {total});"]
            for t in self.bulk:
                nbytes = self.row_len * fusion.tensors[t].dtype.itemsize
                base = address(row_reg.index_of(t), tensor_strides(self.bound, t))
                dst = f"sm_{t} + ({buf} * {self.rows_per_block} + g) * {self.row_len}"
                issue += [f"  fc_bulk_copy({dst}, in_{t} + {base}, {nbytes}, &fc_full[{buf}][g]);"]
            issue.append("}")
            body += ["#if __CUDA_ARCH__ >= 900"] + issue + \
                slot_loop(fixed + [t for t in self.staged if t not in self.bulk]) + \
                ["#else"] + slot_loop(fixed + self.staged) + ["#endif"]
        else:
            body += slot_loop(fixed + self.staged)
        return ["{", f"  const index_t nrow = {row};", f"  if (nrow < {self.rows}) {{"] + \
            indent(body, 4) + ["  }", "  fc_cp_async_commit();", "}"]

    def bulk_setup(self) -> list[str]:
        """The mbarriers of the bulk copies: per stage and group, `full` (the copies landed)
        and `empty` (every thread of the group is done with the buffer)."""
        if not self.bulk:
            return []
        s, groups = self.stages, self.rows_per_block
        return ["#if __CUDA_ARCH__ >= 900",
                f"__shared__ __align__(8) unsigned long long fc_full[{s}][{groups}], "
                f"fc_empty[{s}][{groups}];",
                f"if ({self.tid} == 0) {{",
                f"  for (int s = 0; s < {s}; ++s) {{",
                "    fc_mbar_init(&fc_full[s][g], 1);",
                f"    fc_mbar_init(&fc_empty[s][g], {self.threads_per_row});",
                "  }",
                "  fc_mbar_fence_init();",
                "}",
                "__syncthreads();",
                "#endif"]

    def contiguous_row(self, t: str) -> bool:
        """Whether input t's row is one contiguous run of memory, 16-byte aligned (so one bulk
        copy moves it)."""
        size = self.fusion.tensors[t].dtype.itemsize
        steps = self.domain_steps(t)
        if any(a not in steps for a in self.row_axes) or (self.row_len * size) % 16:
            return False
        expect = 1
        for a in reversed(self.row_axes):
            if self.domain[a] > 1 and steps[a] != expect:
                return False
            expect *= self.domain[a]
        return all((step * size) % 16 == 0 for a, step in steps.items()
                   if a not in self.row_axes)

    def domain_steps(self, t: str) -> dict[int, int]:
        """How far input t's address moves per step of each domain axis it varies along (an
        axis on a run of domain axes moves its stride times the extents inside the run)."""
        strides = tensor_strides(self.bound, t)
        steps = {}
        for d, entry in enumerate(self.schedule.axis_map[t]):
            step = strides[d]
            for a in reversed(domain_axes(entry)):
                steps[a] = step
                step *= self.domain[a]
        return steps

    @property
    def tid(self) -> str:
        """The thread's index within its row (group)."""
        if self.threads_per_row == self.threads:
            return "threadIdx.x"
        if self.threads_per_row == 32:
            return "(threadIdx.x & 31)"
        return f"(threadIdx.x % {self.threads_per_row})"

    # ---- the row kernel -----------------------------------------------------------------------

    def build(self) -> SegmentKernels:
        if self.rows == 0:
            return SegmentKernels(self.index, self.kind.value, "", [])
        sched, pers = self.schedule, self.pers
        vec, slots = self.vec, self.slots
        if self.groups:
            self.plan_prefetch()
        tid = self.tid
        row_region = self.region(self.rvars, ["0"] * len(self.row_axes), False)
        prefetched = self.staged + self.fixed
        persisted = [t for t in pers.persisted if t not in prefetched] + self.kept()
        row_values = []  # per-row values, from their prefetch slots
        for t in self.row_scalars:
            d = self.fusion.tensors[t].dtype
            name = f"r_{t}"
            row_values.append(f"const {cuda.compute(d)} {name} = "
                              f"{cuda.to_compute('*' + self.slot_of(t, 'buf'), d)};")
            row_region.seed(t, name)
        buffers = []  # registers that keep values across stages
        for t in persisted:
            d = self.fusion.tensors[t].dtype
            buffers.append(f"fc_vec<{cuda.storage(d)}, {vec}> p_{t}[{slots}];"
                           if t in sched.inputs else f"{cuda.compute(d)} p_{t}[{slots}][{vec}];")
        stage_code: list[str] = []
        for s in range(pers.n_stages):
            stage_code += self.stage(s, row_region, persisted, tid)
        # outputs that do not vary along the row: one thread stores them
        mark, pre_mark = len(row_region.em.lines), len(row_region.pre)
        for t in sched.outputs:
            if not self.is_row(t) and pers.stage[t] < COLUMN:
                row_region.store(t, row_region.raw(t), f"{tid} == 0")
        stage_code += ["// per-row outputs"] + row_region.pre[pre_mark:] + \
            row_region.em.lines[mark:]
        for p in row_region.em.params:
            if p not in self.params:
                self.params.append(p)
        out_main = [t for t in sched.outputs if pers.stage[t] < COLUMN]
        ps = tensor_params(self.bound, sched.inputs, out_main, self.params)
        ps += [KernelParam("ws", f"c{k}", f"{r.acc_type}* __restrict__")
               for k, r in enumerate(self.col_reducers)]
        row_blocks = -(-self.rows // self.rows_per_block)
        if self.groups:  # resident blocks striding over the rows (and, inner-outer, one
            # column partial per block): as many blocks as fit at once
            blocks = max(1, min(row_blocks, self.profile.sm_count * IO_BLOCKS_PER_SM))
        else:  # a block per row (group): 5-7% faster on H100 than striding a resident grid
            blocks = covering_grid(self.rows, self.rows_per_block, self.itype)
        how = "a warp" if self.warp_rows else f"{self.threads_per_row} threads"
        on_chip = ', '.join(persisted) or '-'
        if self.groups:
            how += f" ({self.rows_per_block} rows per block)"
            on_chip += f"; prefetched {self.stages} rows deep: " + \
                (", ".join(self.staged + self.row_scalars) or "-") + "; read once: " + \
                (", ".join(self.fixed) or "-")
        head = [f"// segment {self.index}: {self.kind.value} over domain {self.domain}: "
                f"{self.rows} rows of {self.row_len}, {how} per row, {slots} x {vec} elements "
                f"per thread, {pers.n_stages} stage(s), on chip: {on_chip}",
                f"typedef {self.itype} index_t;",
                signature(self.name, ps, self.threads,
                          IO_BLOCKS_PER_SM if self.groups else 0) + " {"]
        if self.groups:
            head = IO_PREAMBLE.strip("\n").split("\n") + [""] + head
        main = list(self.smem_decls)
        if self.dyn_smem:
            main.append("extern __shared__ __align__(16) unsigned char fc_dyn[];")
        for t, off in self.smem_offsets.items():
            st = cuda.storage(self.fusion.tensors[t].dtype)
            main.append(f"{st}* sm_{t} = reinterpret_cast<{st}*>(fc_dyn + {off});")
        if not self.warp_rows and not self.groups and not self.norm_group:
            main += [f"__shared__ {r.acc_type} smem{k}[33];"
                     for k, r in enumerate(self.row_reducers)]
        for k, r in enumerate(self.col_reducers):
            main += [f"{r.acc_type} colacc{k}[{slots}][{vec}];  // {r.describe()}",
                     f"for (int k = 0; k < {slots}; ++k)",
                     f"  for (int {LANE} = 0; {LANE} < {vec}; ++{LANE}) colacc{k}[k][{LANE}] = "
                     f"{r.identity};"]
        worker = (f"(index_t)blockIdx.x * {self.rows_per_block} + (threadIdx.x >> 5)"
                  if self.warp_rows else "(index_t)blockIdx.x")
        step = (f"(index_t)gridDim.x * {self.rows_per_block}" if self.warp_rows
                else "(index_t)gridDim.x")
        loop_top: list[str] = []
        if self.groups or self.norm_group:  # rows strided by the grid
            worker, step = f"(index_t)blockIdx.x * {self.rows_per_block} + g", "step"
            main += [f"const int g = threadIdx.x / {self.threads_per_row};  // row group",
                     f"const index_t step = (index_t)gridDim.x * {self.rows_per_block};",
                     "int parity = 0;  // which half of the row reductions' buffers"]
        if self.stages:
            ahead = self.stages - 1
            main += self.bulk_setup()
            main.append(f"// prefetch: rows {ahead} ahead")
            for k in range(ahead):
                main += self.prefetch(f"{worker} + {k} * step" if k else worker, str(k),
                                      k == 0)
            main.append("int buf = 0, it = 0;  // the stage buffer of the current row, its index")
            loop_top = [f"const int nbuf = buf == 0 ? {ahead} : buf - 1;  // free since the last "
                        f"row"]
            loop_top += self.prefetch(f"row + {ahead} * step", "nbuf", False, True)
            loop_top += [f"fc_cp_async_wait<{ahead}>();  // this row's copies have landed"]
            if self.bulk:
                loop_top += ["#if __CUDA_ARCH__ >= 900",
                             f"fc_mbar_wait(&fc_full[buf][g], (it / {self.stages}) & 1);",
                             "#endif"]
        main.append(f"for (index_t row = {worker}; row < {self.rows}; row += {step}) {{")
        per_row = decompose("row", [self.domain[a] for a in self.rows_axes], self.rvars,
                            "index_t") + loop_top + row_values + buffers + stage_code
        if self.bulk:  # this thread is done with the row's buffer
            per_row += ["#if __CUDA_ARCH__ >= 900", "fc_mbar_arrive(&fc_empty[buf][g]);",
                        "#endif"]
        if self.stages:
            per_row.append(f"buf = buf + 1 == {self.stages} ? 0 : buf + 1;")
            per_row.append("++it;")
        if self.groups or self.norm_group:
            per_row.append("parity ^= 1;")
        main += indent(per_row, 2) + ["}"]
        if self.col_reducers:
            main.append("// partial column sums of the rows this block took")
            if self.rows_per_block > 1:
                main += self.combine_groups(tid)
            else:
                for k in range(len(self.col_reducers)):
                    main += [f"for (int k = 0; k < {slots}; ++k) {{",
                             f"  const index_t c = (k * {self.threads_per_row} + {tid}) * {vec};",
                             f"  if (c < {self.row_len})",
                             f"    for (int {LANE} = 0; {LANE} < {vec}; ++{LANE})",
                             f"      ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c + {LANE}] = "
                             f"colacc{k}[k][{LANE}];",
                             "}"]
        code = head + indent(main, 2) + ["}"]
        kernels = [Kernel(self.name, ps, (blocks, 1, 1), (self.threads, 1, 1), self.dyn_smem)]
        workspaces: list[Workspace] = []
        notes = {"vector": vec, "slots": slots, "threads": self.threads,
                 "warp_rows": self.warp_rows, "stages": pers.n_stages, "persisted": persisted,
                 "index_type": self.itype}
        if self.groups:
            notes.update(rows_per_block=self.rows_per_block, threads_per_row=self.threads_per_row,
                         prefetch_stages=self.stages,
                         prefetched=self.staged + self.row_scalars, read_once=self.fixed,
                         smem=self.dyn_smem)
        if self.col_reducers:
            parts = blocks
            fcode, fk = self.column_finish(parts)
            code += [""] + fcode
            kernels.append(fk)
            workspaces = [Workspace(f"c{k}", parts * self.row_len * accumulator_bytes(r))
                          for k, r in enumerate(self.col_reducers)]
        return SegmentKernels(self.index, self.kind.value, assemble(code), kernels, workspaces,
                              self.aligned, notes)

    def stage(self, s: int, row_region: Region, persisted: list[str], tid: str) -> list[str]:
        """Stage s: evaluate what it needs at each of the thread's row positions, accumulate
        its row reductions, combine them across the row's threads."""
        sched, pers = self.schedule, self.pers
        vec, slots = self.vec, self.slots
        mark, pre_mark = len(row_region.em.lines), len(row_region.pre)
        reg = self.region(self.rvars, self.cvars, True)
        from_smem: list[str] = []  # prefetched inputs this stage reads, from their slots

        def per_row(tensor: str, idx) -> str | None:
            """Values that do not vary along the row are computed once per row; prefetched
            inputs are read from this thread's shared-memory slots."""
            if tensor in self.staged or tensor in self.fixed:
                if idx == reg.index_of(tensor):
                    from_smem.append(tensor)
                    return cuda.to_compute(f"q_{tensor}.v[{LANE}]",
                                           self.fusion.tensors[tensor].dtype)
            if any(LANE in i or "c_" in i for i in idx):
                return None
            return row_region.em.value(tensor, row_region.index_of(tensor))

        reg.em.delegate_to(per_row)
        slot_pre: list[str] = []
        lane_first: list[str] = []
        for t in persisted:
            d = self.fusion.tensors[t].dtype
            if t in sched.inputs:
                if s == 0:
                    self.buffer_load(t, reg, slot_pre, lane_first)
                reg.seed(t, cuda.to_compute(f"p_{t}[k].v[{LANE}]", d))
            elif pers.stage[t] < s:
                reg.seed(t, f"p_{t}[k][{LANE}]")
        mine = [r for r in self.row_reducers if pers.eval_stages[r.op_index] == frozenset({s})]
        for r in mine:
            x = cuda.convert(reg.value(r.source), reg.em.dtype(r.source).compute, r.value_dtype)
            reg.em.lines.append(r.add(f"acc{self.row_reducers.index(r)}", x))
        for k, r in enumerate(self.col_reducers):
            if pers.eval_stages[r.op_index] == frozenset({s}):
                x = cuda.convert(reg.value(r.source), reg.em.dtype(r.source).compute,
                                 r.value_dtype)
                reg.em.lines.append(r.add(f"colacc{k}[k][{LANE}]", x))
        for t in persisted:
            if t not in sched.inputs and pers.stage[t] == s:
                reg.em.lines.append(f"p_{t}[k][{LANE}] = {reg.value(t)};")
        for t in sched.outputs:
            if self.is_row(t) and pers.stage[t] == s:
                reg.store(t, reg.raw(t))
        reg.finish()
        lane_part = lane_first + reg.em.lines
        code = [f"// stage {s}: " + ("read the row" if s == 0 else
                                     f"with the results of stage {s - 1}")]
        code += row_region.pre[pre_mark:] + row_region.em.lines[mark:]
        code += [f"{r.acc_type} acc{self.row_reducers.index(r)} = {r.identity};  "
                 f"// {r.describe()}" for r in mine]
        slot = decompose("c", [self.domain[a] for a in self.row_axes], self.cvars, "index_t")
        for t in from_smem:
            st = f"fc_vec<{cuda.storage(self.fusion.tensors[t].dtype)}, {vec}>"
            slot_pre.append(f"const {st} q_{t} = *reinterpret_cast<const {st}*>"
                            f"{self.slot_of(t, 'buf')};")
        slot += slot_pre + reg.pre + reg.decls
        if vec > 1:
            slot += ["#pragma unroll", f"for (int {LANE} = 0; {LANE} < {vec}; ++{LANE}) {{"]
            slot += indent(lane_part, 2) + ["}"]
        else:
            slot += lane_loop(1, lane_part)  # declares the lane only if it is read
        slot += reg.post
        if lane_part or slot_pre or reg.pre or reg.post:
            code += ["#pragma unroll", f"for (int k = 0; k < {slots}; ++k) {{",
                     f"  const index_t c = (k * {self.threads_per_row} + {tid}) * {vec};"]
            if self.guard:
                code += [f"  if (c < {self.row_len}) {{"] + indent(slot, 4) + ["  }", "}"]
            else:
                code += indent(slot, 2) + ["}"]
        groups: dict[tuple, list[int]] = {}  # reductions sharing type and operation
        for r in mine:
            groups.setdefault((r.acc_type, r.functor, r.identity), []).append(
                self.row_reducers.index(r))
        for (acc_type, functor, identity), ks in groups.items():
            if (self.groups and self.threads_per_row > 32) or self.norm_group:
                # the row group's named barrier
                buf = f"smem_s{s}_{ks[0]}"
                self.smem_decls.append(f"__shared__ {acc_type} {buf}[{self.rows_per_block}]"
                                       f"[{64 * len(ks)}];")
                accs = ", ".join(f"acc{k}" for k in ks)
                code += ["{", f"  {acc_type} together[{len(ks)}] = {{{accs}}};",
                         f"  fc_group_reduce_n<{len(ks)}, {self.threads_per_row}>(together, "
                         f"{functor}, {identity}, {buf}[g], g + 1, parity);"]
                code += [f"  acc{k} = together[{n}];" for n, k in enumerate(ks)] + ["}"]
            elif self.warp_rows or self.groups:
                code += [f"acc{k} = fc_warp_reduce(acc{k}, {functor});" for k in ks]
            elif len(ks) == 1:
                code.append(f"acc{ks[0]} = fc_block_reduce(acc{ks[0]}, {functor}, {identity}, "
                            f"smem{ks[0]});")
            else:  # one pass for all of them
                buf = f"smem_s{s}_{ks[0]}"
                self.smem_decls.append(f"__shared__ {acc_type} {buf}[{33 * len(ks)}];")
                accs = ", ".join(f"acc{k}" for k in ks)
                code += ["{", f"  {acc_type} together[{len(ks)}] = {{{accs}}};",
                         f"  fc_block_reduce_n<{len(ks)}>(together, {functor}, {identity}, {buf});"]
                code += [f"  acc{k} = together[{n}];" for n, k in enumerate(ks)] + ["}"]
        for r in mine:
            for out, expr in r.results(self.bound, f"acc{self.row_reducers.index(r)}"):
                code.append(row_region.result(out, expr))
        return code

    def buffer_load(self, t: str, reg: Region, slot_pre: list[str], lane_first: list[str]):
        """Read input t's row positions into its register buffer (a vector where possible)."""
        d = self.fusion.tensors[t].dtype
        idx = reg.index_of(t)
        strides = tensor_strides(self.bound, t)
        lanes = [a for a, i in enumerate(idx) if LANE in i]
        st = cuda.storage(d)
        if (self.vec > 1 and len(lanes) == 1 and strides[lanes[0]] == 1
                and all(x % self.vec == 0 for a, x in enumerate(strides) if a != lanes[0])):
            a = lanes[0]
            base = tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx))
            slot_pre.append(f"p_{t}[k] = *reinterpret_cast<const fc_vec<{st}, {self.vec}>*>("
                            f"in_{t} + {address(base, strides)});")
            self.aligned[t] = self.vec * d.itemsize
        else:
            lane_first.append(f"p_{t}[k].v[{LANE}] = in_{t}[{address(idx, strides)}];")

    def combine_groups(self, tid: str) -> list[str]:
        """Sum the row groups' column accumulators in shared memory (the prefetch buffers are
        done with), one accumulator at a time; the block writes one partial row."""
        vec, slots, groups = self.vec, self.slots, self.rows_per_block
        lines = ["fc_cp_async_wait<0>();"] if self.stages else []
        for k, r in enumerate(self.col_reducers):
            buf = f"colsm{k}"
            lines += ["__syncthreads();  // shared memory is free for the column sums",
                      "{",
                      f"  {r.acc_type}* {buf} = reinterpret_cast<{r.acc_type}*>(fc_dyn);",
                      f"  for (int k = 0; k < {slots}; ++k) {{",
                      f"    const index_t c = (k * {self.threads_per_row} + {tid}) * {vec};",
                      f"    if (c < {self.row_len})",
                      f"      for (int {LANE} = 0; {LANE} < {vec}; ++{LANE})",
                      f"        {buf}[g * {self.row_len} + c + {LANE}] = colacc{k}[k][{LANE}];",
                      "  }",
                      "  __syncthreads();",
                      f"  for (index_t c = threadIdx.x; c < {self.row_len}; c += blockDim.x) {{",
                      f"    {r.acc_type} a = {buf}[c];",
                      f"    for (int w = 1; w < {groups}; ++w) a = {r.functor}(a, "
                      f"{buf}[w * {self.row_len} + c]);",
                      f"    ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c] = a;",
                      "  }",
                      "}"]
        return lines

    # ---- the column finisher (inner-outer) ----------------------------------------------------

    def column_finish(self, parts: int) -> tuple[list[str], Kernel]:
        """Combine the blocks' partial column sums: a block takes 32 columns, its 32 rows of
        threads stride over the partials, shared memory combines them, then the epilogue."""
        sched = self.schedule
        params: list[str] = []
        names = [f"f_{a}" for a in self.row_axes]
        region = Region(self.bound, sched, self.itype,
                        self.p_idx(["0"] * len(self.rows_axes), names, False), 1, self.aligned,
                        params, self.names)
        reducers = list(enumerate(self.col_reducers))
        lines = [f"__shared__ {r.acc_type} sm{k}[32][33];" for k, r in reducers]
        lines += ["const index_t col = (index_t)blockIdx.x * 32 + threadIdx.x;"]
        lines += [f"{r.acc_type} acc{k} = {r.identity};" for k, r in reducers]
        lines += [f"if (col < {self.row_len}) {{",
                  f"  for (int p = threadIdx.y; p < {parts}; p += 32) {{"]
        lines += [f"    acc{k} = {r.functor}(acc{k}, ws_c{k}[(index_t)p * {self.row_len} + col]);"
                  for k, r in reducers]
        lines += ["  }", "}"]
        lines += [f"sm{k}[threadIdx.y][threadIdx.x] = acc{k};" for k, _ in reducers]
        lines += ["__syncthreads();", f"if (threadIdx.y == 0 && col < {self.row_len}) {{"]
        epilogue = [f"for (int y = 1; y < 32; ++y) acc{k} = {r.functor}(acc{k}, "
                    f"sm{k}[y][threadIdx.x]);" for k, r in reducers]
        for k, r in reducers:
            for out, expr in r.results(self.bound, f"acc{k}"):
                region.em.lines.append(region.result(out, expr))
        col_outputs = [t for t in sched.outputs if self.pers.stage[t] >= COLUMN]
        for t in col_outputs:
            region.store(t, region.raw(t))
        epilogue += decompose("col", [self.domain[a] for a in self.row_axes], names, "index_t")
        epilogue += region.finish()
        lines += indent(epilogue, 2) + ["}"]
        kname = f"{self.name}_columns"
        ps = tensor_params(self.bound, sched.inputs, col_outputs, params)
        ps += [KernelParam("ws", f"c{k}", f"const {r.acc_type}* __restrict__") for k, r in reducers]
        blocks = max(1, -(-self.row_len // 32))
        code = [f"// segment {self.index}: combine {parts} blocks' partial column sums",
                signature(kname, ps, 1024) + " {"] + indent(lines, 2) + ["}"]
        return code, Kernel(kname, ps, (blocks, 1, 1), (32, 32, 1))
