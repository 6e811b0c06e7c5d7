"""The accumulators of a reduction segment, with each online max/sum-exp pair of its schedule
(``Schedule.online``, see ``optimizer.kinds.online``) as one log-sum-exp accumulator
(``fc_lse_f``/``fc_lse_d`` in ``codegen.preamble``): it reads x once and yields both the
maximum and the sum of exp(x - maximum)."""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.codegen import cuda
from fusecut.codegen.code import Code, Stmt, derived, stmt
from fusecut.codegen.index import LANE
from fusecut.codegen.kernel import Reducer, copies_per_visit, reducer
from fusecut.codegen.names import describe_op
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.kinds.rules import Schedule


@dataclass
class OnlineReducer(Reducer):
    sum_op: Op | None = None

    def describe(self) -> str:
        m, s = self.op.outputs[0], self.sum_op.outputs[0]
        return (f"{m} = {describe_op(self.op)}; {s} = sum(exp({self.source} - {m})) over the "
                f"same axes, online in one pass")

    def add(self, acc: Code, x: Code) -> Stmt:
        return stmt(f"fc_lse_add({acc}, {x});", "fc_lse_add", acc, x)

    def results(self, bound: Bound, acc: Code) -> list[tuple[str, Code]]:
        tensors = bound.fusion.tensors
        m, s = self.op.outputs[0], self.sum_op.outputs[0]
        return [(m, derived(cuda.convert(f"{acc}.m", self.value_dtype, tensors[m].dtype), acc)),
                (s, derived(cuda.convert(self.counted(f"fc_lse_sum({acc})"), self.value_dtype,
                                         tensors[s].dtype), acc, "fc_lse_sum"))]


def online_reducer(bound: Bound, max_op: int, sum_op: int, copies: int = 1) -> OnlineReducer:
    fusion = bound.fusion
    op = fusion.ops[max_op]
    vt = fusion.tensors[op.inputs[0]].dtype  # float32 or float64 (the planner's rule)
    acc = "fc_lse_d" if vt is DType.float64 else "fc_lse_f"
    inf = cuda.literal(float("-inf"), vt)
    return OnlineReducer(max_op, op, op.inputs[0], acc, f"{acc}{{{inf}, {cuda.literal(0, vt)}}}",
                         "fc_lseop()", False, vt, frozenset({acc, "fc_lseop"}), copies,
                         sum_op=fusion.ops[sum_op])


def segment_reducers(bound: Bound, schedule: Schedule) -> list[Reducer]:
    """One accumulator per row reduction, an online pair's in place of its max."""
    sums = {s: m for m, s in schedule.online}
    maxes = {m: s for m, s in schedule.online}
    out: list[Reducer] = []
    for i in schedule.reductions:
        if i in sums:
            continue
        copies = copies_per_visit(bound, i, schedule.domain, schedule.reduction_axes)
        out.append(online_reducer(bound, i, maxes[i], copies) if i in maxes else
                   reducer(bound, i, copies))
    return out


def add_batched(region, r: Reducer, acc: Code, x: Code) -> bool:
    """Where one accumulator takes every lane of a vector load (the inner layout), stash the
    lanes and add them together after the lane loop (``fc_lse_add_n``: one compare against the
    running maximum, one rescale at most, independent exps) instead of a dependent update per
    element. False (nothing emitted) where that does not apply."""
    if not isinstance(r, OnlineReducer) or region.vec == 1 or LANE in acc.reads:
        return False
    stash = region.em.names.fresh("lse_x")
    region.decls.append(Stmt(f"{cuda.compute(r.value_dtype)} {stash}[{region.vec}];"))
    region.em.lines.append(stmt(f"{stash}[{LANE}] = {x};", LANE, x))
    region.post.append(stmt(f"fc_lse_add_n({acc}, {stash});", "fc_lse_add_n", acc))
    return True


def acc_size(r: Reducer) -> int:
    """Bytes of an online accumulator (0: not one)."""
    if isinstance(r, OnlineReducer):
        return 16 if r.acc_type == "fc_lse_d" else 8
    return 0


def accumulator_bytes(r: Reducer) -> int:
    """Bytes of a reducer's accumulator (in a workspace or shared memory)."""
    if acc_size(r):
        return acc_size(r)
    if r.welford:
        return 24 if r.acc_type == "fc_welford_d" else 16
    return {"float": 4, "double": 8, "long long": 8, "int": 4, "bool": 1}[r.acc_type]
