"""Persistent segments: normalization and inner-outer.

One block (or one warp, for short rows) owns a row at a time and walks it in the stages of
``optimizer.schedulers.persistent``: stage s evaluates what it needs at each of the thread's row
positions (``E`` vectors of ``VEC`` elements, kept in registers), accumulates the row reductions
of stage s, and the block combines them; their results are broadcast to every thread and later
stages use them. Values that do not vary along the row (row statistics, per-row inputs) are
computed once per row, outside the per-element loops. Inputs read in several stages are loaded
once into registers; values computed from reduction results that later stages need stay in
registers too.

Inner-outer segments also hold per-thread column accumulators: a thread sees the same columns in
every row, so it sums them across the rows its block takes; a finishing kernel combines the
blocks' partial sums and runs the column epilogue.
"""

from __future__ import annotations

import math

from codegen import cuda
from codegen.emit import Names
from codegen.kernel import (
    Kernel,
    Param,
    SegmentKernels,
    Workspace,
    assemble,
    indent,
    reducer,
    signature,
    tensor_params,
)
from codegen.layout import covering_grid, decompose, index_type
from codegen.reduction import _acc_size
from codegen.regions import LANE, Region, lane_loop, pick_vector
from optimizer.analysis.shapes import Bound
from optimizer.schedulers.kinds import Schedule
from optimizer.schedulers.persistent import COLUMN, is_row_tensor
from optimizer.schedulers.profiles import DeviceProfile


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
        self.itype = index_type(bound, list(schedule.inputs) + list(schedule.outputs),
                                math.prod(self.domain))
        self.aligned: dict[str, int] = {}
        self.params: list[str] = []
        self.name = f"fusecut_segment{index}_{schedule.kind.value}"
        row_inputs = [t for t in schedule.inputs if self.is_row(t)]
        self.vec = pick_vector(bound, row_inputs or list(schedule.inputs), self.domain[-1],
                               max_vector)
        row_vecs = -(-self.row_len // self.vec)
        columns = bool(schedule.outer_reductions)
        # Short rows: a warp per row, eight rows per block. Longer rows: a block per row, each
        # thread holding several vectors (independent loads in flight); inner-outer blocks hold
        # fewer (their column accumulators need registers) and fewer blocks run, so that fewer
        # partial column sums are left for the finishing kernel.
        self.warp_rows = row_vecs <= 128
        if self.warp_rows:
            self.threads_per_row, self.threads = 32, 256
        else:
            per_thread = 2 if columns else 4
            self.threads_per_row = self.threads = max(64, min(1024, -(-row_vecs // per_thread
                                                                       // 32) * 32))
        self.slots = -(-row_vecs // self.threads_per_row)  # E: vectors per thread per row
        self.rows_per_block = self.threads // self.threads_per_row
        self.row_reducers = [reducer(bound, i) for i in schedule.reductions]
        self.col_reducers = [reducer(bound, i) for i in schedule.outer_reductions]
        self.smem_decls: list[str] = []
        self.rvars = [f"i{a}" for a in self.rows_axes]
        self.cvars = [f"c_{a}" for a in self.row_axes]

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

    # ---- the row kernel -----------------------------------------------------------------------

    def build(self) -> SegmentKernels:
        if self.rows == 0:
            return SegmentKernels(self.index, self.kind.value, "", [])
        sched, pers = self.schedule, self.pers
        vec, slots = self.vec, self.slots
        tid = "(threadIdx.x & 31)" if self.warp_rows else "threadIdx.x"
        row_region = self.region(self.rvars, ["0"] * len(self.row_axes), False)
        persisted = list(pers.persisted)
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
        ps += [Param("ws", f"c{k}", f"{r.acc_type}* __restrict__")
               for k, r in enumerate(self.col_reducers)]
        row_blocks = -(-self.rows // self.rows_per_block)
        if self.col_reducers:  # one column partial per block: as many blocks as fit at once
            occupancy = max(1, (2048 if self.warp_rows else 1024) // self.threads)
            blocks = max(1, min(row_blocks, self.profile.sm_count * occupancy))
        else:  # a block per row (group): 5-7% faster on H100 than striding a resident grid
            blocks = covering_grid(self.rows, self.rows_per_block, self.itype)
        how = "a warp" if self.warp_rows else f"{self.threads} threads"
        head = [f"// segment {self.index}: {self.kind.value} over domain {self.domain}: "
                f"{self.rows} rows of {self.row_len}, {how} per row, {slots} x {vec} elements "
                f"per thread, {pers.n_stages} stage(s), on chip: {', '.join(persisted) or '-'}",
                f"typedef {self.itype} index_t;",
                signature(self.name, ps, self.threads) + " {"]
        main = list(self.smem_decls)
        if not self.warp_rows:
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
        main.append(f"for (index_t row = {worker}; row < {self.rows}; row += {step}) {{")
        per_row = decompose("row", [self.domain[a] for a in self.rows_axes], self.rvars,
                            "index_t") + buffers + stage_code
        main += indent(per_row, 2) + ["}"]
        if self.col_reducers:
            main.append("// partial column sums of the rows this block took")
            if self.warp_rows:  # one shared buffer per accumulator type, reused in turn
                for acc_type in dict.fromkeys(r.acc_type for r in self.col_reducers):
                    tag = acc_type.replace(" ", "_")
                    main.append(f"__shared__ {acc_type} colsm_{tag}[{self.rows_per_block}]"
                                f"[{self.row_len}];")
            for k, r in enumerate(self.col_reducers):
                if self.warp_rows:  # combine the block's warps (rows) in shared memory first
                    buf = f"colsm_{r.acc_type.replace(' ', '_')}"
                    main += ["__syncthreads();",
                             f"for (int k = 0; k < {slots}; ++k) {{",
                             f"  const index_t c = (k * 32 + {tid}) * {vec};",
                             f"  if (c < {self.row_len})",
                             f"    for (int {LANE} = 0; {LANE} < {vec}; ++{LANE})",
                             f"      {buf}[threadIdx.x >> 5][c + {LANE}] = "
                             f"colacc{k}[k][{LANE}];",
                             "}",
                             "__syncthreads();",
                             f"for (index_t c = threadIdx.x; c < {self.row_len}; c += "
                             f"blockDim.x) {{",
                             f"  {r.acc_type} a = {buf}[0][c];",
                             f"  for (int w = 1; w < {self.rows_per_block}; ++w) a = "
                             f"{r.functor}(a, {buf}[w][c]);",
                             f"  ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c] = a;",
                             "}"]
                else:
                    main += [f"for (int k = 0; k < {slots}; ++k) {{",
                             f"  const index_t c = (k * {self.threads_per_row} + {tid}) * {vec};",
                             f"  if (c < {self.row_len})",
                             f"    for (int {LANE} = 0; {LANE} < {vec}; ++{LANE})",
                             f"      ws_c{k}[(index_t)blockIdx.x * {self.row_len} + c + {LANE}] = "
                             f"colacc{k}[k][{LANE}];",
                             "}"]
        code = head + indent(main, 2) + ["}"]
        kernels = [Kernel(self.name, ps, (blocks, 1, 1), (self.threads, 1, 1))]
        workspaces: list[Workspace] = []
        notes = {"vector": vec, "slots": slots, "threads": self.threads,
                 "warp_rows": self.warp_rows, "stages": pers.n_stages, "persisted": persisted,
                 "index_type": self.itype}
        if self.col_reducers:
            parts = blocks
            fcode, fk = self.column_finish(parts)
            code += [""] + fcode
            kernels.append(fk)
            workspaces = [Workspace(f"c{k}", parts * self.row_len * _acc_size(r))
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

        def per_row(tensor: str, idx) -> str | None:
            """Values that do not vary along the row are computed once per row."""
            if any(LANE in i or "c_" in i for i in idx):
                return None
            return row_region.em.value(tensor, row_region.index_of(tensor))

        reg.em.delegate = per_row
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
        slot += slot_pre + reg.pre + reg.decls
        if vec > 1:
            slot += ["#pragma unroll", f"for (int {LANE} = 0; {LANE} < {vec}; ++{LANE}) {{"]
            slot += indent(lane_part, 2) + ["}"]
        else:
            slot += lane_loop(1, lane_part)  # declares the lane only if it is read
        slot += reg.post
        if lane_part or slot_pre or reg.pre or reg.post:
            code += ["#pragma unroll", f"for (int k = 0; k < {slots}; ++k) {{",
                     f"  const index_t c = (k * {self.threads_per_row} + {tid}) * {vec};",
                     f"  if (c < {self.row_len}) {{"] + indent(slot, 4) + ["  }", "}"]
        groups: dict[tuple, list[int]] = {}  # reductions sharing type and operation
        for r in mine:
            groups.setdefault((r.acc_type, r.functor, r.identity), []).append(
                self.row_reducers.index(r))
        for (acc_type, functor, identity), ks in groups.items():
            if self.warp_rows:
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
        from codegen.layout import address, tensor_strides

        d = self.fusion.tensors[t].dtype
        idx = reg.index_of(t)
        strides = tensor_strides(self.bound, t)
        lanes = [a for a, i in enumerate(idx) if LANE in i]
        st = cuda.storage(d)
        if (self.vec > 1 and len(lanes) == 1 and strides[lanes[0]] == 1
                and all(x % self.vec == 0 for a, x in enumerate(strides) if a != lanes[0])):
            a = lanes[0]
            base = tuple(self.cvars[-1] if k == a else i for k, i in enumerate(idx))
            slot_pre.append(f"p_{t}[k] = *reinterpret_cast<const fc_vec<{st}, {self.vec}>*>("
                            f"in_{t} + {address(base, strides)});")
            self.aligned[t] = self.vec * d.itemsize
        else:
            lane_first.append(f"p_{t}[k].v[{LANE}] = in_{t}[{address(idx, strides)}];")

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
        ps += [Param("ws", f"c{k}", f"const {r.acc_type}* __restrict__") for k, r in reducers]
        blocks = max(1, -(-self.row_len // 32))
        code = [f"// segment {self.index}: combine {parts} blocks' partial column sums",
                signature(kname, ps, 1024) + " {"] + indent(lines, 2) + ["}"]
        return code, Kernel(kname, ps, (blocks, 1, 1), (32, 32, 1))
