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

from fusecut.codegen import cuda
from fusecut.codegen.code import (
    Code,
    Stmt,
    declare,
    derived,
    indent,
    lines,
    named,
    stmt,
)
from fusecut.codegen.cuda import loaded
from fusecut.codegen.index import LANE, ZERO, Clamp, Var, at_lane_zero, uses, walk
from fusecut.codegen.kernel import (
    Kernel,
    KernelParam,
    SegmentKernels,
    Workspace,
    copies_per_visit,
    extent_param,
    kept_domain,
    reducer,
    segment_kernels,
    signature,
    tensor_params,
)
from fusecut.codegen.launch import (
    PrefetchPlan,
    flat_rows,
    is_row_input,
    persistent_launch,
    prefetch_plan,
    slot_index,
)
from fusecut.codegen.layout import (
    address,
    axis_names,
    decompose,
    index_typedefs,
    row_indices,
    tensor_strides,
)
from fusecut.codegen.names import Names
from fusecut.codegen.online import accumulator_bytes
from fusecut.codegen.preamble import IO_PREAMBLE
from fusecut.codegen.regions import Region, lane_for, lane_loop, vector_address
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.kinds.persistent import COLUMN
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile


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
        self.launch = launch = persistent_launch(bound, schedule, profile, max_vector)
        self.rows_axes, self.row_axes = list(launch.rows_axes), list(launch.row_axes)
        self.rows, self.row_len = launch.rows, launch.row_len
        self.itype, self.vec, self.slots = launch.index_type, launch.vector, launch.slots
        self.warp_rows, self.threads = launch.warp_rows, launch.threads
        self.threads_per_row, self.rows_per_block = launch.threads_per_row, launch.rows_per_block
        self.groups, self.norm_group, self.guard = launch.groups, launch.norm_group, launch.guard
        self.pers = schedule.persistence
        self.kind = schedule.kind
        self.names = Names(recomputed)
        self.aligned: dict[str, int] = {}
        self.params: list[str] = []
        self.name = f"fusecut_segment{index}_{schedule.kind.value}"
        self.row_reducers = [reducer(bound, i, copies_per_visit(bound, i, schedule.domain,
                                                                schedule.reduction_axes))
                             for i in schedule.reductions]
        self.col_reducers = [reducer(bound, i, copies_per_visit(bound, i, schedule.domain,
                                                                schedule.outer_axes))
                             for i in schedule.outer_reductions]
        self.smem_decls: list[Stmt] = []
        # one flat row index over several kept axes where every access allows (no division by
        # their extents, none of them in the code: codegen.launch.flat_rows)
        self.flat = flat_rows(bound, schedule, self.rows_axes)
        self.rvars = axis_names("i", self.rows_axes, self.rows_axes, self.flat)
        self.rows_extents = [self.domain[a] for a in self.rows_axes]
        self.cvars = axis_names("c_", self.row_axes, self.rows_axes, self.flat)
        # what the row groups prefetch into shared memory
        self.fetch = (prefetch_plan(bound, schedule, profile, launch)
                      if launch.groups and launch.rows else PrefetchPlan())
        for t in self.fetch.bulk:
            self.aligned[t] = max(self.aligned.get(t, 1), 16)

    def is_row(self, t: str) -> bool:
        return is_row_input(self.schedule, self.row_axes, t)

    def region(self, rows: list[str] | None, cols: list[str] | None, lane: bool) -> Region:
        """A region at the row (group)'s position: ``rows`` name the kept axes' indices and
        ``cols`` the row's (None: index 0 on every axis of theirs)."""
        rows_idx = [Var(n) for n in rows] if rows else [ZERO] * len(self.rows_axes)
        if rows and self.flat:  # the innermost kept axis takes the flat row, the others 0
            rows_idx = [ZERO] * (len(rows) - 1) + [Var(rows[-1])]
        cols_idx = [Var(n) for n in cols] if cols else [ZERO] * len(self.row_axes)
        return Region(self.bound, self.schedule, self.itype,
                      slot_index(self.launch, rows_idx, cols_idx, lane),
                      self.vec if lane else 1, self.aligned, self.params, self.names)

    # ---- inner-outer prefetch -----------------------------------------------------------------

    def slot_of(self, t: str, buf: str) -> Code:
        """Where this thread's slot of input t lies in shared memory, in stage buffer ``buf``
        (a number or a variable): an element pointer expression."""
        if t in self.fetch.fixed:
            return derived(f"(sm_{t} + c)", "c")
        if t in self.fetch.row_scalars:
            return derived(f"(sm_{t} + {buf} * {self.threads} + threadIdx.x)", buf)
        return derived(f"(sm_{t} + ({buf} * {self.rows_per_block} + g) * {self.row_len} + c)",
                       buf, "g", "c")

    def prefetch(self, row: Code, buf: str, first: bool, reuse: bool = False) -> list[Stmt]:
        """Issue the copies of row ``row`` (if it exists) into stage buffer ``buf``: per
        thread, committed as one group (an empty group past the last row keeps the count), and
        on sm_90 one bulk copy per contiguous row tensor, issued by the group's first thread."""
        fusion = self.fusion
        nvars = axis_names("n", self.rows_axes, self.rows_axes, self.flat)
        reg = self.region(nvars, self.cvars, True)
        row_reg = self.region(nvars, None, False)
        body = row_indices(Var("nrow"), self.rows_extents, nvars, self.flat)
        for t in self.fetch.row_scalars:
            size = fusion.tensors[t].dtype.itemsize
            addr = address(row_reg.index_of(t), tensor_strides(self.bound, t))
            slot = self.slot_of(t, buf)
            body.append(stmt(f"fc_cp_async<{size}>({slot}, in_{t} + {addr});", slot, addr))

        def slot_loop(tensors) -> list[Stmt]:
            per_slot = []
            for t in tensors:
                size = self.vec * fusion.tensors[t].dtype.itemsize
                addr = vector_address(self.bound, t, reg.index_of(t), self.vec)
                slot = self.slot_of(t, buf)
                per_slot.append(stmt(f"fc_cp_async<{size}>({slot}, in_{t} + {addr});", slot,
                                     addr))
                self.aligned[t] = max(self.aligned.get(t, 1), min(16, size))
            if not per_slot:
                return []
            return [*lines("#pragma unroll", f"for (int k = 0; k < {self.slots}; ++k) {{"),
                    self.slot_start().indented(2),
                    stmt(f"  if (c < {self.row_len}) {{", "c")] + \
                indent(decompose(Var("c"), [self.domain[a] for a in self.row_axes], self.cvars,
                                 "index_t") + per_slot, 4) + lines("  }", "}")

        fixed = list(self.fetch.fixed) if first else []
        if self.fetch.bulk:
            total = sum(self.row_len * fusion.tensors[t].dtype.itemsize for t in self.fetch.bulk)
            issue = lines(f"if ({self.tid} == 0) {{")
            if reuse:  # the buffer held an earlier row: the group must be done with it
                issue += [stmt(f"  if (it > 0) fc_mbar_wait(&fc_empty[{buf}][g], "
                               f"((it - 1) / {self.fetch.stages}) & 1);", buf, "g")]
            issue += [stmt(f"  fc_mbar_expect_tx(&fc_full[{buf}][g], {total});", buf, "g")]
            for t in self.fetch.bulk:
                nbytes = self.row_len * fusion.tensors[t].dtype.itemsize
                base = address(row_reg.index_of(t), tensor_strides(self.bound, t))
                dst = f"sm_{t} + ({buf} * {self.rows_per_block} + g) * {self.row_len}"
                issue += [stmt(f"  fc_bulk_copy({dst}, in_{t} + {base}, {nbytes}, "
                               f"&fc_full[{buf}][g]);", buf, "g", base)]
            issue += lines("}")
            body += lines("#if __CUDA_ARCH__ >= 900") + issue + \
                slot_loop(fixed + [t for t in self.fetch.staged if t not in self.fetch.bulk]) + \
                lines("#else") + slot_loop(fixed + list(self.fetch.staged)) + lines("#endif")
        else:
            body += slot_loop(fixed + list(self.fetch.staged))
        return [*lines("{"), declare("index_t", "nrow", row).indented(2),
                stmt("  if (nrow < n_rows) {", "nrow")] + \
            indent(body, 4) + lines("  }", "  fc_cp_async_commit();", "}")

    def slot_start(self) -> Stmt:
        """``c``: where this thread's slot k starts in the row."""
        return declare("index_t", "c", f"(k * {self.threads_per_row} + {self.tid}) * {self.vec}")

    def bulk_setup(self) -> list[Stmt]:
        """The mbarriers of the bulk copies: per stage and group, `full` (the copies landed)
        and `empty` (every thread of the group is done with the buffer)."""
        if not self.fetch.bulk:
            return []
        s, groups = self.fetch.stages, self.rows_per_block
        return [*lines("#if __CUDA_ARCH__ >= 900",
                       f"__shared__ __align__(8) unsigned long long fc_full[{s}][{groups}], "
                       f"fc_empty[{s}][{groups}];",
                       f"if ({self.tid} == 0) {{",
                       f"  for (int s = 0; s < {s}; ++s) {{"),
                stmt("    fc_mbar_init(&fc_full[s][g], 1);", "g", "s"),
                stmt(f"    fc_mbar_init(&fc_empty[s][g], {self.threads_per_row});", "g", "s"),
                *lines("  }", "  fc_mbar_fence_init();", "}", "__syncthreads();", "#endif")]

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
        prefetched = self.fetch.staged + self.fetch.fixed
        persisted = [t for t in self.pers.persisted if t not in prefetched] + \
            list(self.fetch.kept)
        row_region = self.region(self.rvars, None, False)
        row_values = self.row_values(row_region)
        buffers = self.buffers(persisted)
        stages = self.stages(row_region, persisted)
        out_main = [t for t in self.schedule.outputs if self.pers.stage[t] < COLUMN]
        ps = tensor_params(self.bound, self.schedule.inputs, out_main, self.params)
        ps += [KernelParam("ws", f"c{k}", f"{r.acc_type}* __restrict__")
               for k, r in enumerate(self.col_reducers)]
        ps.append(extent_param("n_rows", self.rows, self.itype))
        main = self.block_memory()
        worker, step, setup, loop_top = self.row_order()
        main += setup + [stmt(f"for (index_t row = {worker}; row < n_rows; "
                              f"row += {step}) {{", worker, step)]
        main += indent(self.per_row(loop_top + row_values + buffers + stages), 2) + lines("}")
        main += self.column_partials()
        code = self.head(ps, persisted) + indent(main, 2) + lines("}")
        kernels = [Kernel(self.name, ps, (self.launch.blocks, 1, 1), (self.threads, 1, 1),
                          self.fetch.dyn_smem)]
        workspaces: list[Workspace] = []
        if self.col_reducers:
            parts = self.launch.blocks
            fcode, fk = self.column_finish(parts)
            code += lines("") + fcode
            kernels.append(fk)
            workspaces = [Workspace(f"c{k}", parts * self.row_len * accumulator_bytes(r))
                          for k, r in enumerate(self.col_reducers)]
        return segment_kernels(self.index, self.kind.value, code, kernels, workspaces,
                               self.aligned, self.notes(persisted))

    def row_values(self, row_region: Region) -> list[Stmt]:
        """The per-row values prefetched into slots, read from them (and seeded in the row's
        region)."""
        out = []
        for t in self.fetch.row_scalars:
            d = self.fusion.tensors[t].dtype
            slot = self.slot_of(t, "buf")
            out.append(declare(cuda.compute(d), f"r_{t}", loaded(f"*{slot}", d, slot)))
            row_region.seed(t, named(f"r_{t}"))
        return out

    def buffers(self, persisted: list[str]) -> list[Stmt]:
        """The registers that keep values across stages: an input's vectors, a value's lanes."""
        out = []
        for t in persisted:
            d = self.fusion.tensors[t].dtype
            if t in self.schedule.inputs:
                out.append(stmt(f"fc_vec<{cuda.storage(d)}, {self.vec}> p_{t}[{self.slots}];",
                                "fc_vec"))
            else:
                out.append(Stmt(f"{cuda.compute(d)} p_{t}[{self.slots}][{self.vec}];"))
        return out

    def stages(self, row_region: Region, persisted: list[str]) -> list[Stmt]:
        """Every stage of a row, then the outputs that do not vary along the row (one thread
        stores them)."""
        code: list[Stmt] = []
        for s in range(self.pers.n_stages):
            code += self.stage(s, row_region, persisted)
        mark, pre_mark = len(row_region.em.lines), len(row_region.pre)
        for t in self.schedule.outputs:
            if not self.is_row(t) and self.pers.stage[t] < COLUMN:
                row_region.store(t, row_region.raw(t), f"{self.tid} == 0")
        code += lines("// per-row outputs") + row_region.pre[pre_mark:] + \
            row_region.em.lines[mark:]
        for p in row_region.em.params:
            if p not in self.params:
                self.params.append(p)
        return code

    def head(self, ps: list[KernelParam], persisted: list[str]) -> list[Stmt]:
        """The kernel's description, index type and signature (after the prefetch helpers of
        row groups: they declare nothing the kernel may drop)."""
        how = "a warp" if self.warp_rows else f"{self.threads_per_row} threads"
        on_chip = ', '.join(persisted) or '-'
        if self.groups:
            how += f" ({self.rows_per_block} rows per block)"
            on_chip += f"; prefetched {self.fetch.stages} rows deep: " + \
                (", ".join(self.fetch.staged + self.fetch.row_scalars) or "-") + "; read once: " + \
                (", ".join(self.fetch.fixed) or "-")
        shown = kept_domain(self.domain, self.rows_axes, self.flat)
        head = lines(f"// segment {self.index}: {self.kind.value} over domain {shown}: "
                     f"n_rows rows of {self.row_len}, {how} per row, {self.slots} x "
                     f"{self.vec} elements per thread, {self.pers.n_stages} stage(s), on chip: "
                     f"{on_chip}")
        head += [index_typedefs(self.itype),
                 signature(self.name, ps, self.threads, self.launch.min_blocks,
                           self.column_calls())]
        if self.groups:
            head = lines(*IO_PREAMBLE.strip("\n").split("\n"), "") + head
        return head

    def block_memory(self) -> list[Stmt]:
        """Shared memory (the stages' reduction buffers, the prefetch slots) and the column
        accumulators, zeroed."""
        main = list(self.smem_decls)
        if self.fetch.dyn_smem:
            main += lines("extern __shared__ __align__(16) unsigned char fc_dyn[];")
        for t, off in self.fetch.smem_offsets:
            st = cuda.storage(self.fusion.tensors[t].dtype)
            main += lines(f"{st}* sm_{t} = reinterpret_cast<{st}*>(fc_dyn + {off});")
        if not self.warp_rows and not self.groups and not self.norm_group:
            main += [stmt(f"__shared__ {r.acc_type} smem{k}[33];", r.calls)
                     for k, r in enumerate(self.row_reducers)]
        for k, r in enumerate(self.col_reducers):
            main += [stmt(f"{r.acc_type} colacc{k}[{self.slots}][{self.vec}];  "
                          f"// {r.describe()}", r.calls),
                     *lines(f"for (int k = 0; k < {self.slots}; ++k)"),
                     lane_for(self.vec, f"colacc{k}[k][{LANE}] = {r.identity};",
                              r.calls).indented(2)]
        return main

    def row_order(self) -> tuple[Code, Code, list[Stmt], list[Stmt]]:
        """Which rows a warp, block or row group takes: (its first row, the step to its next,
        the statements before the row loop, those at the top of each row). Row groups stride
        over the grid; with a prefetch pipeline, the first rows are issued before the loop and
        each row issues the copies of the row ``stages - 1`` ahead."""
        worker = Code(f"(index_t)blockIdx.x * {self.rows_per_block} + (threadIdx.x >> 5)"
                      if self.warp_rows else "(index_t)blockIdx.x")
        step = Code(f"(index_t)gridDim.x * {self.rows_per_block}" if self.warp_rows
                    else "(index_t)gridDim.x")
        setup: list[Stmt] = []
        loop_top: list[Stmt] = []
        if self.groups or self.norm_group:  # rows strided by the grid
            worker = derived(f"(index_t)blockIdx.x * {self.rows_per_block} + g", "g")
            step = named("step")
            setup += [declare("int", "g", f"threadIdx.x / {self.threads_per_row}", "row group"),
                      declare("index_t", "step", f"(index_t)gridDim.x * {self.rows_per_block}"),
                      *lines("int parity = 0;  // which half of the row reductions' buffers")]
        if self.fetch.stages:
            ahead = self.fetch.stages - 1
            setup += self.bulk_setup()
            setup += lines(f"// prefetch: rows {ahead} ahead")
            for k in range(ahead):
                row = derived(f"{worker} + {k} * step", worker, "step") if k else worker
                setup += self.prefetch(row, str(k), k == 0)
            setup += lines("int buf = 0, it = 0;  // the stage buffer of the current row, "
                           "its index")
            loop_top = [declare("int", "nbuf", f"buf == 0 ? {ahead} : buf - 1",
                                "free since the last row")]
            loop_top += self.prefetch(derived(f"row + {ahead} * step", "step"), "nbuf", False,
                                      True)
            loop_top += lines(f"fc_cp_async_wait<{ahead}>();  // this row's copies have landed")
            if self.fetch.bulk:
                loop_top += [*lines("#if __CUDA_ARCH__ >= 900"),
                             stmt(f"fc_mbar_wait(&fc_full[buf][g], (it / {self.fetch.stages}) "
                                  f"& 1);", "g"),
                             *lines("#endif")]
        return worker, step, setup, loop_top

    def per_row(self, body: list[Stmt]) -> list[Stmt]:
        """A row's work: its indices, ``body``, then the pipeline's and barriers' bookkeeping."""
        out = row_indices(Var("row"), self.rows_extents, self.rvars, self.flat) + body
        if self.fetch.bulk:  # this thread is done with the row's buffer
            out += [*lines("#if __CUDA_ARCH__ >= 900"),
                    stmt("fc_mbar_arrive(&fc_empty[buf][g]);", "g"), *lines("#endif")]
        if self.fetch.stages:
            out += lines(f"buf = buf + 1 == {self.fetch.stages} ? 0 : buf + 1;", "++it;")
        if self.groups or self.norm_group:
            out += lines("parity ^= 1;")
        return out

    def column_partials(self) -> list[Stmt]:
        """The block's partial column sums, written to the workspace (the groups' summed in
        shared memory first)."""
        if not self.col_reducers:
            return []
        out = lines("// partial column sums of the rows this block took")
        if self.rows_per_block > 1:
            return out + self.combine_groups(self.tid)
        for k in range(len(self.col_reducers)):
            out += [*lines(f"for (int k = 0; k < {self.slots}; ++k) {{"),
                    self.slot_start().indented(2),
                    stmt(f"  if (c < {self.row_len})", "c"),
                    lane_for(self.vec, "").indented(4),
                    stmt(f"      ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c + "
                         f"{LANE}] = colacc{k}[k][{LANE}];", "c", LANE),
                    *lines("}")]
        return out

    def notes(self, persisted: list[str]) -> dict[str, object]:
        notes = {"vector": self.vec, "slots": self.slots, "threads": self.threads,
                 "warp_rows": self.warp_rows, "stages": self.pers.n_stages,
                 "persisted": persisted, "index_type": self.itype}
        if self.groups:
            notes.update(rows_per_block=self.rows_per_block, threads_per_row=self.threads_per_row,
                         prefetch_stages=self.fetch.stages,
                         prefetched=list(self.fetch.staged + self.fetch.row_scalars),
                         read_once=list(self.fetch.fixed),
                         smem=self.fetch.dyn_smem)
        return notes

    def stage(self, s: int, row_region: Region, persisted: list[str]) -> list[Stmt]:
        """Stage s: evaluate what it needs at each of the thread's row positions, accumulate
        its row reductions, combine them across the row's threads."""
        mark, pre_mark = len(row_region.em.lines), len(row_region.pre)
        reg = self.region(self.rvars, self.cvars, True)
        from_smem: list[str] = []  # prefetched inputs this stage reads, from their slots
        reg.em.delegate_to(self.once_per_row(reg, row_region, from_smem))
        mine = [r for r in self.row_reducers
                if self.pers.eval_stages[r.op_index] == frozenset({s})]
        slot_pre, lane_first = self.evaluate_stage(s, reg, persisted, mine)
        code = lines(f"// stage {s}: " + ("read the row" if s == 0 else
                                          f"with the results of stage {s - 1}"))
        code += row_region.pre[pre_mark:] + row_region.em.lines[mark:]
        code += [stmt(f"{r.acc_type} acc{self.row_reducers.index(r)} = {r.identity};  "
                      f"// {r.describe()}", r.calls) for r in mine]
        code += self.slot_loop(reg, slot_pre, lane_first, from_smem)
        code += self.combine_row_reductions(s, mine)
        for r in mine:
            for out, expr in r.results(self.bound, Code(f"acc{self.row_reducers.index(r)}")):
                code.append(row_region.result(out, expr))
        return code

    def once_per_row(self, reg: Region, row_region: Region, from_smem: list[str]):
        """The delegate of a stage's region: values that do not vary along the row are computed
        once per row (in ``row_region``); prefetched inputs are read from this thread's
        shared-memory slots (``from_smem`` lists them)."""

        def per_row(tensor: str, idx) -> Code | None:
            if tensor in self.fetch.staged or tensor in self.fetch.fixed:
                if idx == reg.index_of(tensor):
                    from_smem.append(tensor)
                    return loaded(f"q_{tensor}.v[{LANE}]", self.fusion.tensors[tensor].dtype,
                                  f"q_{tensor}", LANE, simple=True)
            # (an index through a clamp, of a pad, cat or gather, is evaluated per element)
            if any(uses(i, LANE, *self.cvars) or any(isinstance(n, Clamp) for n in walk(i))
                   for i in idx):
                return None
            return row_region.em.value(tensor, row_region.index_of(tensor))

        return per_row

    def evaluate_stage(self, s: int, reg: Region, persisted: list[str], mine: list
                       ) -> tuple[list[Stmt], list[Stmt]]:
        """Stage s's work at one row position, into ``reg``: its row and column accumulations,
        the values later stages keep, the row outputs it stores. The persisted inputs are read
        into their registers in stage 0: (their vector loads, their lane-by-lane loads)."""
        sched, pers = self.schedule, self.pers
        slot_pre: list[Stmt] = []
        lane_first: list[Stmt] = []
        for t in persisted:
            d = self.fusion.tensors[t].dtype
            if t in sched.inputs:
                if s == 0:
                    self.buffer_load(t, reg, slot_pre, lane_first)
                reg.seed(t, loaded(f"p_{t}[k].v[{LANE}]", d, LANE, simple=True))
            elif pers.stage[t] < s:
                reg.seed(t, Code(f"p_{t}[k][{LANE}]", frozenset({LANE}), True))
        for r in mine:
            v = reg.value(r.source)
            x = derived(cuda.convert(v, reg.em.dtype(r.source).compute, r.value_dtype), v)
            reg.em.lines.append(r.add(Code(f"acc{self.row_reducers.index(r)}"), x))
        for k, r in enumerate(self.col_reducers):
            if pers.eval_stages[r.op_index] == frozenset({s}):
                v = reg.value(r.source)
                x = derived(cuda.convert(v, reg.em.dtype(r.source).compute, r.value_dtype), v)
                reg.em.lines.append(r.add(derived(f"colacc{k}[k][{LANE}]", LANE), x))
        for t in persisted:
            if t not in sched.inputs and pers.stage[t] == s:
                v = reg.value(t)
                reg.em.lines.append(stmt(f"p_{t}[k][{LANE}] = {v};", LANE, v))
        for t in sched.outputs:
            if self.is_row(t) and pers.stage[t] == s:
                reg.store(t, reg.raw(t))
        reg.finish()
        return slot_pre, lane_first

    def slot_loop(self, reg: Region, slot_pre: list[Stmt], lane_first: list[Stmt],
                  from_smem: list[str]) -> list[Stmt]:
        """The loop over the thread's row positions (slots): the position's indices, its loads
        (from shared memory where prefetched), then each lane's statements, then the vector
        stores; nothing where the stage has no work per position."""
        vec = self.vec
        lane_part = lane_first + reg.em.lines
        slot = decompose(Var("c"), [self.domain[a] for a in self.row_axes], self.cvars,
                         "index_t")
        for t in from_smem:
            st = f"fc_vec<{cuda.storage(self.fusion.tensors[t].dtype)}, {vec}>"
            at = self.slot_of(t, "buf")
            slot_pre.append(declare(st, f"q_{t}", f"*reinterpret_cast<const {st}*>{at}",
                                    reads=(at, "fc_vec")))
        slot += slot_pre + reg.pre + reg.decls
        if vec > 1:
            slot += lines("#pragma unroll") + [lane_for(vec)]
            slot += indent(lane_part, 2) + lines("}")
        else:
            slot += lane_loop(1, lane_part)  # declares the lane only if it is read
        slot += reg.post
        if not (lane_part or slot_pre or reg.pre or reg.post):
            return []
        code = [*lines("#pragma unroll", f"for (int k = 0; k < {self.slots}; ++k) {{"),
                self.slot_start().indented(2)]
        if self.guard:
            return code + [stmt(f"  if (c < {self.row_len}) {{", "c")] + indent(slot, 4) + \
                lines("  }", "}")
        return code + indent(slot, 2) + lines("}")

    def combine_row_reductions(self, s: int, mine: list) -> list[Stmt]:
        """Combine stage s's row accumulators across the row's threads, those of one type and
        operation together: on the row group's named barrier (groups of more than a warp, and
        normalization blocks of several rows), by warp shuffles (a warp a row), or through
        shared memory in one pass for the block."""
        code: list[Stmt] = []
        groups: dict[tuple, list[int]] = {}  # reductions sharing type and operation
        for r in mine:
            groups.setdefault((r.acc_type, r.functor, r.identity), []).append(
                self.row_reducers.index(r))
        for (acc_type, functor, identity), ks in groups.items():
            calls = self.row_reducers[ks[0]].calls
            if (self.groups and self.threads_per_row > 32) or self.norm_group:
                # the row group's named barrier
                buf = f"smem_s{s}_{ks[0]}"
                self.smem_decls.append(stmt(f"__shared__ {acc_type} {buf}[{self.rows_per_block}]"
                                            f"[{64 * len(ks)}];", calls))
                accs = ", ".join(f"acc{k}" for k in ks)
                together = stmt(f"  {acc_type} together[{len(ks)}] = {{{accs}}};", calls)
                code += [*lines("{"), together,
                         stmt(f"  fc_group_reduce_n<{len(ks)}, {self.threads_per_row}>("
                              f"together, {functor}, {identity}, {buf}[g], g + 1, parity);",
                              "g", "fc_group_reduce_n", calls)]
                code += lines(*[f"  acc{k} = together[{n}];" for n, k in enumerate(ks)], "}")
            elif self.warp_rows or self.groups:
                code += [stmt(f"acc{k} = fc_warp_reduce(acc{k}, {functor});", "fc_warp_reduce",
                              calls) for k in ks]
            elif len(ks) == 1:
                code.append(stmt(f"acc{ks[0]} = fc_block_reduce(acc{ks[0]}, {functor}, "
                                 f"{identity}, smem{ks[0]});", "fc_block_reduce", calls))
            else:  # one pass for all of them
                buf = f"smem_s{s}_{ks[0]}"
                self.smem_decls.append(stmt(f"__shared__ {acc_type} {buf}[{33 * len(ks)}];",
                                            calls))
                accs = ", ".join(f"acc{k}" for k in ks)
                together = stmt(f"  {acc_type} together[{len(ks)}] = {{{accs}}};", calls)
                code += [*lines("{"), together,
                         stmt(f"  fc_block_reduce_n<{len(ks)}>(together, {functor}, {identity}, "
                              f"{buf});", "fc_block_reduce_n", calls)]
                code += lines(*[f"  acc{k} = together[{n}];" for n, k in enumerate(ks)], "}")
        return code

    def column_calls(self) -> frozenset[str]:
        """The preamble helpers the column accumulators spell."""
        return frozenset().union(*(r.calls for r in self.col_reducers))

    def buffer_load(self, t: str, reg: Region, slot_pre: list[Stmt], lane_first: list[Stmt]):
        """Read input t's row positions into its register buffer (a vector where possible)."""
        d = self.fusion.tensors[t].dtype
        idx = reg.index_of(t)
        strides = tensor_strides(self.bound, t)
        lanes = [a for a, i in enumerate(idx) if uses(i, LANE)]
        st = cuda.storage(d)
        if (self.vec > 1 and len(lanes) == 1 and strides[lanes[0]] == 1
                and all(x % self.vec == 0 for a, x in enumerate(strides) if a != lanes[0])):
            a = lanes[0]
            base = tuple(at_lane_zero(i) if k == a else i for k, i in enumerate(idx))
            where = address(base, strides)
            slot_pre.append(stmt(f"p_{t}[k] = *reinterpret_cast<const fc_vec<{st}, "
                                 f"{self.vec}>*>(in_{t} + {where});", where, "fc_vec"))
            self.aligned[t] = self.vec * d.itemsize
        else:
            where = address(idx, strides)
            lane_first.append(stmt(f"p_{t}[k].v[{LANE}] = in_{t}[{where}];", LANE, where))

    def combine_groups(self, tid: str) -> list[Stmt]:
        """Sum the row groups' column accumulators in shared memory (the prefetch buffers are
        done with), one accumulator at a time; the block writes one partial row."""
        vec, slots, groups = self.vec, self.slots, self.rows_per_block
        out = lines("fc_cp_async_wait<0>();") if self.fetch.stages else []
        for k, r in enumerate(self.col_reducers):
            buf = f"colsm{k}"
            out += [*lines("__syncthreads();  // shared memory is free for the column sums", "{"),
                    stmt(f"  {r.acc_type}* {buf} = reinterpret_cast<{r.acc_type}*>(fc_dyn);",
                         r.calls),
                    *lines(f"  for (int k = 0; k < {slots}; ++k) {{"),
                    self.slot_start().indented(4),
                    stmt(f"    if (c < {self.row_len})", "c"),
                    lane_for(vec, "").indented(6),
                    stmt(f"        {buf}[g * {self.row_len} + c + {LANE}] = colacc{k}[k][{LANE}];",
                         "g", "c", LANE),
                    *lines("  }", "  __syncthreads();"),
                    stmt(f"  for (index_t c = threadIdx.x; c < {self.row_len}; c += blockDim.x) {{",
                         "c"),
                    stmt(f"    {r.acc_type} a = {buf}[c];", "c", r.calls),
                    stmt(f"    for (int w = 1; w < {groups}; ++w) a = {r.functor}(a, "
                         f"{buf}[w * {self.row_len} + c]);", "c", r.calls),
                    stmt(f"    ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c] = a;", "c"),
                    *lines("  }", "}")]
        return out

    # ---- the column finisher (inner-outer) ----------------------------------------------------

    def column_finish(self, parts: int) -> tuple[list[Stmt], Kernel]:
        """Combine the blocks' partial column sums: a block takes 32 columns, its 32 rows of
        threads stride over the partials, shared memory combines them, then the epilogue."""
        sched = self.schedule
        params: list[str] = []
        names = axis_names("f_", self.row_axes, self.rows_axes, self.flat)
        region = Region(self.bound, sched, self.itype,
                        slot_index(self.launch, [ZERO] * len(self.rows_axes),
                                   [Var(n) for n in names], False), 1,
                        self.aligned, params, self.names)
        reducers = list(enumerate(self.col_reducers))
        body = [stmt(f"__shared__ {r.acc_type} sm{k}[32][33];", r.calls) for k, r in reducers]
        body += [declare("index_t", "col", "(index_t)blockIdx.x * 32 + threadIdx.x")]
        body += [stmt(f"{r.acc_type} acc{k} = {r.identity};", r.calls) for k, r in reducers]
        body += [stmt(f"if (col < {self.row_len}) {{", "col"),
                 *lines(f"  for (int p = threadIdx.y; p < {parts}; p += 32) {{")]
        body += [stmt(f"    acc{k} = {r.functor}(acc{k}, ws_c{k}[(index_t)p * {self.row_len} + "
                      f"col]);", "col", r.calls) for k, r in reducers]
        body += lines("  }", "}")
        body += lines(*[f"sm{k}[threadIdx.y][threadIdx.x] = acc{k};" for k, _ in reducers])
        body += [*lines("__syncthreads();"),
                 stmt(f"if (threadIdx.y == 0 && col < {self.row_len}) {{", "col")]
        epilogue = [stmt(f"for (int y = 1; y < 32; ++y) acc{k} = {r.functor}(acc{k}, "
                         f"sm{k}[y][threadIdx.x]);", r.calls) for k, r in reducers]
        for k, r in reducers:
            for out, expr in r.results(self.bound, Code(f"acc{k}")):
                region.em.lines.append(region.result(out, expr))
        col_outputs = [t for t in sched.outputs if self.pers.stage[t] >= COLUMN]
        for t in col_outputs:
            region.store(t, region.raw(t))
        epilogue += decompose(Var("col"), [self.domain[a] for a in self.row_axes], names,
                              "index_t")
        epilogue += region.finish()
        body += indent(epilogue, 2) + lines("}")
        kname = f"{self.name}_columns"
        ps = tensor_params(self.bound, sched.inputs, col_outputs, params)
        ps += [KernelParam("ws", f"c{k}", f"const {r.acc_type}* __restrict__") for k, r in reducers]
        blocks = max(1, -(-self.row_len // 32))
        code = lines(f"// segment {self.index}: combine {parts} blocks' partial column sums") + \
            [signature(kname, ps, 1024, calls=self.column_calls())] + indent(body, 2) + lines("}")
        return code, Kernel(kname, ps, (blocks, 1, 1), (32, 32, 1))
