"""Reduction segments: every reduction reduces the same axes R of one domain P.

- inner layout (the innermost axis of P is reduced): a warp per row for short rows, a block per
  row otherwise; threads stride over the row with vector loads, reduce with warp shuffles and
  shared memory, and one thread runs the epilogue on the reduced domain.
- outer layout (the innermost axis is kept): threads take consecutive columns (vector loads along
  the innermost axis), loop over rows, and combine through shared memory.
When there are too few rows (inner) or columns (outer) to fill the GPU, the reduced axes are split
across blocks: each writes partial accumulators to a workspace and a small finishing kernel
combines them and runs the epilogue. P-domain outputs of the prologue are written in the main loop.
"""

from __future__ import annotations

import math

from fusecut.codegen import cuda
from fusecut.codegen.code import Code, Stmt, declare, derived, indent, lines, stmt
from fusecut.codegen.index import LANE, ZERO, Index, Paren, Select, Var, plus_lane
from fusecut.codegen.kernel import (
    Kernel,
    KernelParam,
    SegmentKernels,
    Workspace,
    extent_param,
    kept_domain,
    segment_kernels,
    signature,
    tensor_params,
)
from fusecut.codegen.launch import (
    FINISH_THREADS,
    MAX_VECTOR,
    ColumnReductionLaunch,
    RowReductionLaunch,
    column_reduction_launch,
    finish_blocks,
    flat_rows,
    row_reduction_launch,
    segment_index_type,
)
from fusecut.codegen.layout import axis_label, axis_names, decompose, index_typedefs, row_indices
from fusecut.codegen.names import Names
from fusecut.codegen.online import accumulator_bytes, add_batched, segment_reducers
from fusecut.codegen.regions import Region, lane_for
from fusecut.optimizer.analysis.axes import domain_axes
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.kinds.gather import ROW_GATHERS
from fusecut.optimizer.kinds.resize import reads_results_shifted
from fusecut.optimizer.kinds.rules import Schedule
from fusecut.optimizer.profiles import DeviceProfile


def _varies_along(schedule: Schedule, tensor: str, axes) -> bool:
    return any(a in axes for m in schedule.axis_map[tensor] for a in domain_axes(m))


def gathers_rows(bound: Bound, schedule: Schedule) -> bool:
    """Whether the segment holds a gather of one element per row (``optimizer.kinds.gather``):
    the only gathers a reduction segment may hold."""
    return any(bound.fusion.ops[i].name in ROW_GATHERS for i in schedule.ops)


def generate_reduction(bound: Bound, schedule: Schedule, profile: DeviceProfile,
                       index: int, vector: int | None = None,
                       recomputed: frozenset[int] = frozenset()) -> SegmentKernels:
    """``recomputed``: ops of the segment that also run in another one (marked in comments)."""
    domain = list(schedule.domain)
    rank = len(domain)
    red_axes = list(schedule.reduction_axes)
    keep_axes = [a for a in range(rank) if a not in red_axes]
    rows = math.prod(domain[a] for a in keep_axes)
    row_len = math.prod(domain[a] for a in red_axes)
    if rows == 0:
        return SegmentKernels(index, "reduction", "", [])
    inner = rank == 0 or (rank - 1) in red_axes
    builder = _Builder(bound, schedule, profile, index, keep_axes, red_axes, rows, row_len,
                       Names(recomputed), inner)
    max_vector = vector or MAX_VECTOR
    if inner:
        loaded = [t for t in schedule.inputs if _varies_along(schedule, t, red_axes)]
        return builder.build_inner(row_reduction_launch(
            bound, schedule, profile, rows, row_len, loaded or schedule.inputs, max_vector))
    staged = reads_results_shifted(bound, schedule.ops, schedule.reductions)
    return builder.build_outer(column_reduction_launch(bound, schedule, profile, rows, row_len,
                                                       max_vector, staged), staged)


class _Builder:
    def __init__(self, bound, schedule, profile, index, keep_axes, red_axes, rows, row_len,
                 names: Names, inner: bool):
        self.bound, self.schedule, self.profile, self.index = bound, schedule, profile, index
        self.keep_axes, self.red_axes = keep_axes, red_axes
        self.rows, self.row_len = rows, row_len
        self.domain = list(schedule.domain)
        self.reducers = segment_reducers(bound, schedule)
        self.itype = segment_index_type(bound, schedule)
        self.aligned: dict[str, int] = {}
        self.loop_outputs = [t for t in schedule.outputs
                             if _varies_along(schedule, t, red_axes)]
        self.epilogue_outputs = [t for t in schedule.outputs if t not in self.loop_outputs]
        self.name = f"fusecut_segment{index}_reduction"
        self.names = names
        # rows reduced along the innermost axes, indexed as one flat row where every access
        # allows (codegen.launch.flat_rows): no division by their extents, none in the code
        self.flat = inner and flat_rows(bound, schedule, keep_axes)
        self.keep_names = axis_names("i", keep_axes, keep_axes, self.flat)
        self.kept_extents = [self.domain[a] for a in keep_axes]
        # the domain in the comments: a 1-D reduction's only axis is its free length
        # (n_reduced), shown as a kept outermost one is
        self.shown_domain = kept_domain(
            self.domain, keep_axes or ([0] if len(self.domain) == 1 else []), self.flat)

    # ---- pieces ---------------------------------------------------------------------------

    def p_idx(self, keep_names: list[str], red_names: list[str] | None, lane_axis: int | None
              ) -> Index:
        """The domain's index from the kept axes' index names and the reduced axes' (None:
        index 0), lane by lane along ``lane_axis``."""
        out = []
        ki, ri = iter(keep_names), iter(red_names or ())
        last_kept = self.keep_axes[-1] if self.keep_axes else None
        for a in range(len(self.domain)):
            if a not in self.red_axes:
                var = Var(next(ki))
                if self.flat and a != last_kept:  # the flat row is the innermost kept index
                    var = ZERO
            else:
                var = ZERO if red_names is None else Var(next(ri))
            out.append(plus_lane(var) if a == lane_axis else var)
        return tuple(out)

    def accumulation_loop(self, vec: int, acc_of, flat: str) -> tuple[list[Stmt], list[str]]:
        """The body of the loop over the reduced axes (their index decomposed from ``flat``):
        accumulate, store loop outputs. Also the scalar parameters it reads."""
        red_names = axis_names("r", self.red_axes, self.keep_axes, self.flat)
        params: list[str] = []
        lane_axis = len(self.domain) - 1 if vec > 1 else None
        loop = Region(self.bound, self.schedule, self.itype,
                      self.p_idx(self.keep_names, red_names, lane_axis), vec, self.aligned,
                      params, self.names)
        self.accumulate(loop, acc_of)
        red_ext = [self.domain[a] for a in self.red_axes]
        return loop.lane_block(decompose(Var(flat), red_ext, red_names, "index_t")), params

    def accumulate(self, region: Region, acc_of) -> None:
        """Add each reduction's input (at this region's index) to its accumulator; store the
        loop outputs."""
        for r in self.reducers:
            v = region.value(r.source)
            x = derived(cuda.convert(v, region.em.dtype(r.source).compute, r.value_dtype), v)
            if not add_batched(region, r, acc_of(r), x):
                region.em.lines.append(r.add(acc_of(r), x))
        for t in self.loop_outputs:
            region.store(t, region.raw(t))

    def epilogue(self, region: Region, result_of, guard: str | None = None) -> None:
        """Seed the reduction results and store the reduced-domain outputs."""
        for r in self.reducers:
            for out, expr in r.results(self.bound, result_of(r)):
                region.em.lines.append(region.result(out, expr))
        for t in self.epilogue_outputs:
            region.store(t, region.raw(t), guard)

    def finish_kernel(self, parts: int, ws_of) -> tuple[list[Stmt], Kernel]:
        """Combine ``parts`` partial accumulators per reduced-domain element, then the
        epilogue."""
        names = axis_names("o", self.keep_axes, self.keep_axes, self.flat)
        params: list[str] = []
        region = Region(self.bound, self.schedule, self.itype,
                        self.p_idx(names, None, None), 1,
                        self.aligned, params, self.names)
        combine = [stmt(f"{r.acc_type} acc{k} = {r.identity};  // {r.describe()}", r.calls)
                   for k, r in enumerate(self.reducers)]
        combine += lines("for (index_t p = 0; p < n_parts; ++p) {")
        combine += [stmt(f"  acc{k} = {r.functor}(acc{k}, {ws_of(r, k)}[(index_t)p * "
                         "n_outputs + o]);", r.calls) for k, r in enumerate(self.reducers)]
        combine += lines("}")
        ids = {id(r): k for k, r in enumerate(self.reducers)}
        self.epilogue(region, lambda r: Code(f"acc{ids[id(r)]}"))
        body_lines = row_indices(Var("o"), self.kept_extents, names, self.flat) + combine + \
            region.finish()
        kname = f"{self.name}_finish"
        ps = self.kernel_params(self.epilogue_outputs, params, "const ") + \
            [extent_param("n_outputs", self.rows, self.itype),
             extent_param("n_parts", parts, self.itype)]
        threads = FINISH_THREADS
        blocks = finish_blocks(self.rows, self.profile)
        code = lines(f"// segment {self.index}: combine n_parts partial results per output "
                     "element")
        code += [signature(kname, ps, threads, calls=self.calls()),
                 *lines("  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; "
                        "o < n_outputs; o += (index_t)gridDim.x * blockDim.x) {")]
        code += indent(body_lines, 4) + lines("  }", "}")
        return code, Kernel(kname, ps, (blocks, 1, 1), (threads, 1, 1))

    def kernel_params(self, outputs: list[str], params: list[str], workspaces: str | None
                      ) -> list[KernelParam]:
        """The tensors, scalars and (``workspaces``: their pointee qualifier, None for none) the
        partial accumulators a kernel of the segment takes."""
        ps = tensor_params(self.bound, self.schedule.inputs, outputs, params)
        if workspaces is not None:
            ps += [KernelParam("ws", f"r{k}", f"{workspaces}{r.acc_type}* __restrict__")
                   for k, r in enumerate(self.reducers)]
        return ps

    def calls(self) -> frozenset[str]:
        """The preamble helpers the reductions' accumulators spell."""
        return frozenset().union(*(r.calls for r in self.reducers))

    def workspaces(self, parts: int) -> list[Workspace]:
        return [Workspace(f"r{k}", parts * self.rows * accumulator_bytes(r))
                for k, r in enumerate(self.reducers)]

    # ---- inner layout -------------------------------------------------------------------------

    def build_inner(self, launch: RowReductionLaunch) -> SegmentKernels:
        vec, warp_rows, split = launch.vector, launch.warp_rows, launch.split
        acc_of = lambda r: Code(f"acc{self.reducers.index(r)}")  # noqa: E731
        loop_lines, params = self.accumulation_loop(vec, acc_of, "c")
        tail_lines: list[Stmt] = []
        if launch.free_length and vec > 1:  # the elements after the last whole vector
            tail_lines, tail_params = self.accumulation_loop(1, acc_of, "c")
            params += [p for p in tail_params if p not in params]
        tid = "(threadIdx.x & 31)" if warp_rows else "threadIdx.x"
        inner = row_indices(Var("row"), self.kept_extents, self.keep_names, self.flat)
        inner += [stmt(f"{r.acc_type} acc{k} = {r.identity};  // {r.describe()}", r.calls)
                  for k, r in enumerate(self.reducers)]
        before_loop = len(inner)
        inner += self.along_the_row(launch, tid, loop_lines, tail_lines)
        inner += self.reduce_across_the_row(warp_rows)
        if launch.splits:
            inner += lines(f"if ({tid} == 0) {{")
            inner += lines(*[f"  ws_r{k}[(index_t)blockIdx.y * n_rows + row] = acc{k};"
                             for k in range(len(self.reducers))])
            inner += lines("}")
            out_params = self.loop_outputs
        else:
            inner = self.row_epilogue(inner, before_loop, tid, params)
            out_params = list(self.schedule.outputs)
        row_expr = (f"(index_t)blockIdx.x * {launch.rows_per_block} + (threadIdx.x >> 5)"
                    if warp_rows else "(index_t)blockIdx.x")
        row_step = (f"(index_t)gridDim.x * {launch.rows_per_block}" if warp_rows
                    else "(index_t)gridDim.x")
        body = [stmt(f"__shared__ {r.acc_type} smem{k}[33];", r.calls)
                for k, r in enumerate(self.reducers)]
        body += lines(f"for (index_t row = {row_expr}; row < n_rows; row += {row_step}) {{")
        body += indent(inner, 2) + lines("}")
        ps = self.kernel_params(out_params, params, "" if launch.splits else None) + \
            [extent_param("n_rows", self.rows, self.itype)]
        if launch.free_length:
            ps += [extent_param("n_reduced", self.row_len, self.itype),
                   extent_param("n_chunk", launch.chunk, self.itype)]
        how = "a warp" if warp_rows else f"{launch.per_row} threads"
        note = ", split in chunks of n_chunk across blocks" if launch.free_length else \
            f", split in {split} chunks" if split > 1 else ""
        length = "n_reduced" if launch.free_length else self.row_len
        head = lines(f"// segment {self.index}: reduce {length} elements per row over "
                     f"n_rows rows (domain {self.shown_domain}, reduced axes "
                     f"{[axis_label(a, self.keep_axes, self.flat) for a in self.red_axes]}); "
                     f"{how} per row, {vec} per load{note}")
        head += [index_typedefs(self.itype),
                 signature(self.name, ps, launch.threads,
                           calls=self.calls() if launch.splits else ())]
        kernel = Kernel(self.name, ps, (launch.blocks, split, 1), (launch.threads, 1, 1))
        return self.segment(head + body + lines("}"), kernel, split, launch.splits,
                            {"layout": "inner", "vector": vec, "split": split,
                             "index_type": self.itype})

    def along_the_row(self, launch: RowReductionLaunch, tid: str, loop_lines: list[Stmt],
                      tail_lines: list[Stmt]) -> list[Stmt]:
        """The threads of a row stride over it, a vector each (over a chunk of it where the
        row is split across blocks). A free length (``RowReductionLaunch.free_length``) comes
        at launch with its chunks (a multiple of the vector): whole vectors first, then
        ``tail_lines`` on the last few elements, one a thread."""
        chunk, vec = launch.chunk, launch.vector
        if launch.free_length:
            begin, end = "(index_t)blockIdx.y * n_chunk", \
                "min(n_reduced, (index_t)blockIdx.y * n_chunk + n_chunk)"
        elif launch.split > 1:
            begin = f"(index_t)blockIdx.y * {chunk}"
            end = f"min((index_t){self.row_len}, {begin} + {chunk})"
        else:
            begin, end = "0", f"(index_t){self.row_len}"
        out = [declare("index_t", "c_end", end)]
        vectors_end = "c_end"
        if tail_lines:
            vectors_end = "c_vec_end"
            out.append(declare("index_t", "c_vec_end",
                               f"{begin} + (c_end - {begin}) / {vec} * {vec}", reads="c_end"))
        out += [*lines("#pragma unroll 4"),
                stmt(f"for (index_t c = {begin} + {tid} * {vec}; c < {vectors_end}; "
                     f"c += {launch.per_row * vec}) {{", vectors_end)]
        out += indent(loop_lines, 2) + lines("}")
        if tail_lines:
            out += [stmt(f"for (index_t c = c_vec_end + {tid}; c < c_end; "
                         f"c += {launch.per_row}) {{", "c_vec_end", "c_end")]
            out += indent(tail_lines, 2) + lines("}")
        return out

    def reduce_across_the_row(self, warp_rows: bool) -> list[Stmt]:
        out = lines("// reduce across the threads of the row")
        for k, r in enumerate(self.reducers):
            if warp_rows:
                out += [stmt(f"acc{k} = fc_warp_reduce(acc{k}, {r.functor});",
                             "fc_warp_reduce", r.calls)]
            else:
                out += [stmt(f"acc{k} = fc_block_reduce(acc{k}, {r.functor}, {r.identity}, "
                             f"smem{k});", "fc_block_reduce", r.calls)]
        return out

    def row_epilogue(self, inner: list[Stmt], before_loop: int, tid: str, params: list[str]
                     ) -> list[Stmt]:
        """``inner`` with the epilogue of a row, run by its first thread; a row gather's loads
        (the index, then the element it picks) go out before the row streams in (at
        ``before_loop``), instead of after its reduction: every thread issues them (one address
        per row, a broadcast)."""
        epi = Region(self.bound, self.schedule, self.itype,
                     self.p_idx(self.keep_names, None, None), 1, self.aligned, params,
                     self.names)
        self.epilogue(epi, lambda r: Code(f"acc{self.reducers.index(r)}"))
        epi_lines = epi.finish()
        inner = list(inner)
        if gathers_rows(self.bound, self.schedule) and epi.pre:
            early = lines("// the row's gathered elements, loaded while the row streams in")
            inner[before_loop:before_loop] = early + epi.pre
            epi_lines = epi_lines[len(epi.pre):]
        return inner + lines(f"if ({tid} == 0) {{") + indent(epi_lines, 2) + lines("}")

    def segment(self, code: list[Stmt], kernel: Kernel, split: int, splits: bool,
                notes: dict[str, object]) -> SegmentKernels:
        """The segment's kernels: ``kernel``, and where the reduced axes are split across
        ``split`` blocks (``splits``: its code is the split path's, even for 1), the kernel
        that combines their partial results (and the workspace they meet in)."""
        kernels, workspaces = [kernel], []
        if splits:
            fcode, fk = self.finish_kernel(split, lambda r, i: f"ws_r{i}")
            code = code + lines("") + fcode
            kernels.append(fk)
            workspaces = self.workspaces(split)
        return segment_kernels(self.index, "reduction", code, kernels, workspaces, self.aligned,
                               notes)

    def lane_acc(self, r) -> Code:
        """A reduction's accumulator of the current lane (the outer layout's, one per column)."""
        return derived(f"acc{self.reducers.index(r)}[{LANE}]", LANE)

    def staged_results(self, epi: Region, vec: int):
        """The outer epilogue's delegate: a reduction result at another column of the thread's
        row (along the innermost axis; the block holds whole rows) is read from row 0 of the
        combining buffer, where the block staged its results."""
        last = len(self.domain) - 1
        first_col = self.keep_names[-1]  # the innermost index of the thread's lane 0
        results = {}
        for k, r in enumerate(self.reducers):
            for out, _ in r.results(self.bound, Code("acc")):
                results[out] = (k, r)

        def staged(tensor: str, idx) -> Code | None:
            if tensor not in results:
                return None
            own = epi.index_of(tensor)
            amap = self.schedule.axis_map[tensor]
            along = [j for j, m in enumerate(amap) if m == last]
            if len(along) != 1 or any(a != b for j, (a, b) in enumerate(zip(idx, own))
                                      if j != along[0]):
                raise PlanError(f"{tensor} is read at {[str(i) for i in idx]}: a reduction "
                                f"result is staged along the innermost axis only")
            k, r = results[tensor]
            col = f"threadIdx.x * {vec} + {idx[along[0]]} - {first_col}"
            acc = derived(f"smem{k}[0][{col}]", idx[along[0]], first_col)
            expr = dict(r.results(self.bound, acc))[tensor]
            return epi.em.let_value(tensor, expr, note=" (staged, another column)")

        return staged

    # ---- outer layout -------------------------------------------------------------------------

    def build_outer(self, launch: ColumnReductionLaunch, staged: bool = False
                    ) -> SegmentKernels:
        """``staged``: the epilogue reads results at other columns of the thread's row (RoPE's
        rotate-half of a group sum): the block stages them in shared memory first."""
        vec, by, split = launch.vector, launch.by, launch.split
        loop_lines, params = self.accumulation_loop(vec, self.lane_acc, "r")
        # rows taken by several threads of a block meet in shared memory (and so do staged
        # results); a thread that summed its columns' rows alone needs none
        combine = by > 1 or staged
        body = self.down_the_columns(launch, loop_lines, combine)
        body_end, comb = self.combine_column_rows(launch, combine)
        body += body_end
        if split > 1:
            for k in range(len(self.reducers)):
                comb += [lane_for(vec, ""),
                         stmt(f"  ws_r{k}[(index_t)blockIdx.y * {self.rows} + col + {LANE}] = "
                              f"acc{k}[{LANE}];", "col", LANE)]
            out_params = self.loop_outputs
        else:
            body_end, comb = self.column_epilogue(vec, params, staged, comb)
            body += body_end
            out_params = list(self.schedule.outputs)
        body += indent(comb, 2) + lines("}")
        ps = self.kernel_params(out_params, params, "" if split > 1 else None)
        code = lines(f"// segment {self.index}: reduce {self.row_len} rows for each of "
                     f"{self.rows} columns (domain {self.domain}, reduced axes "
                     f"{self.red_axes}); {vec} columns per thread, {by} rows at a time per "
                     f"block" + (f", {split} blocks per column" if split > 1 else ""))
        code += [index_typedefs(self.itype), signature(self.name, ps, launch.bx * by,
                                                       calls=self.calls() if split > 1 else ())]
        code += indent(body, 2) + lines("}")
        kernel = Kernel(self.name, ps, (launch.grid_x, split, 1), (launch.bx, by, 1))
        return self.segment(code, kernel, split, split > 1, {"layout": "outer", "vector": vec,
                                                  "split": split, "index_type": self.itype})

    def down_the_columns(self, launch: ColumnReductionLaunch, loop_lines: list[Stmt],
                         combine: bool) -> list[Stmt]:
        """A thread's columns (``vector`` of them) and their accumulators, and its walk down
        their rows, ``by`` threads of a block apart (and ``split`` blocks)."""
        vec, bx, by = launch.vector, launch.bx, launch.by
        body = [stmt(f"__shared__ {r.acc_type} smem{k}[{by}][{bx * vec}];", r.calls)
                for k, r in enumerate(self.reducers)] if combine else []
        body += [declare("index_t", "col", f"((index_t)blockIdx.x * {bx} + threadIdx.x) * {vec}"),
                 declare("bool", "active", f"col < {self.rows}", reads="col")]
        body += decompose(Paren(Select(Var("active"), Var("col"), ZERO)),
                          [self.domain[a] for a in self.keep_axes], self.keep_names, "index_t")
        for k, r in enumerate(self.reducers):
            body += [stmt(f"{r.acc_type} acc{k}[{vec}];  // {r.describe()}", r.calls),
                     lane_for(vec, f"acc{k}[{LANE}] = {r.identity};", r.calls)]
        body += [stmt("if (active) {", "active"), *lines("  #pragma unroll 4"),
                 *lines(f"  for (index_t r = (index_t)blockIdx.y * {by} + threadIdx.y; "
                        f"r < {self.row_len}; r += (index_t)gridDim.y * {by}) {{")]
        return body + indent(loop_lines, 4) + lines("  }", "}")

    def combine_column_rows(self, launch: ColumnReductionLaunch, combine: bool
                            ) -> tuple[list[Stmt], list[Stmt]]:
        """(the statements that stage each thread's sums and open the combining thread's block,
        that thread's combining statements): the rows the block's threads took meet in shared
        memory, or each thread summed its columns' rows alone."""
        vec, by = launch.vector, launch.by
        if not combine:
            return [*lines("// each thread summed its columns' rows alone"),
                    stmt("if (active) {", "active")], []
        body = lines("// combine the rows the threads of the block took")
        for k in range(len(self.reducers)):
            body += [lane_for(vec, f"smem{k}[threadIdx.y][threadIdx.x * {vec} + {LANE}] = "
                                   f"acc{k}[{LANE}];")]
        body += [*lines("__syncthreads();"), stmt("if (threadIdx.y == 0 && active) {", "active")]
        comb: list[Stmt] = []
        for k, r in enumerate(self.reducers):
            comb += [*lines(f"for (int y = 1; y < {by}; ++y)"),
                     lane_for(vec, f"acc{k}[{LANE}] = {r.functor}(acc{k}[{LANE}], "
                                   f"smem{k}[y][threadIdx.x * {vec} + {LANE}]);",
                              r.calls).indented(2)]
        return body, comb

    def column_epilogue(self, vec: int, params: list[str], staged: bool, comb: list[Stmt]
                        ) -> tuple[list[Stmt], list[Stmt]]:
        """The epilogue of a thread's columns after ``comb``: (statements that close the
        combining block and stage the results, where the epilogue reads other columns', and
        the combining thread's statements, the epilogue last)."""
        epi = Region(self.bound, self.schedule, self.itype,
                     self.p_idx(self.keep_names, None, len(self.domain) - 1 if vec > 1 else None),
                     vec, self.aligned, params, self.names)
        if staged:
            epi.em.delegate_to(self.staged_results(epi, vec))
        self.epilogue(epi, self.lane_acc)
        body: list[Stmt] = []
        if staged:  # row 0 of each combining buffer takes the block's results
            for k in range(len(self.reducers)):
                comb.append(lane_for(vec, f"smem{k}[0][threadIdx.x * {vec} + {LANE}] = "
                                          f"acc{k}[{LANE}];"))
            body = indent(comb, 2) + lines("}", "__syncthreads();",
                                           "// the epilogue: results of other columns "
                                           "from there")
            body += [stmt("if (threadIdx.y == 0 && active) {", "active")]
            comb = []
        return body, comb + epi.lane_block([])
