"""Where a kernel may use fast (approximate) math without it showing in any output.

``__expf``, ``__fdividef`` and ``fc_erf_fast`` are off by a few units in the last place of a
float, ``fc_tanh_fast`` by at most 1e-5 relative (just above 1/16, where its main form
cancels); a 16-bit output rounds away 13 more bits. So an op may use them when every path from
its result reaches only bf16/fp16 outputs through continuous ops. A comparison, a select
condition, rounding, or a cast to an integer or bool could turn a last-bit difference into a
different value, and a float32 or float64 output would show it: either keeps the precise
function.
"""

from __future__ import annotations

from fusecut.codegen.memo import last_call
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.kinds.rules import Schedule

FAST_OPS = {"exp", "tanh", "erf", "sigmoid", "silu", "log", "div", "truediv", "reciprocal"}
DISCRETE = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
            "logical_not", "ceil", "floor", "round", "trunc", "sign", "signbit", "isfinite",
            "isinf", "isnan", "isneginf", "isposinf", "fmod", "remainder", "mod", "frac",
            "take_along_axis", "gather", "index_select"}


@last_call  # asked again by every region of the segment's kernel
def fast_math_tensors(bound: Bound, schedule: Schedule) -> frozenset[str]:
    """Tensors of the segment whose producing op may use fast math."""
    fusion = bound.fusion
    ops = [fusion.ops[i] for i in schedule.ops]
    consumers: dict[str, list] = {}
    for op in ops:
        for n in dict.fromkeys(op.inputs):
            consumers.setdefault(n, []).append(op)
    outputs = set(schedule.outputs)
    # Whether every use of a tensor is continuous and ends in a 16-bit float output: known for
    # its consumers' results first, walking the ops backwards (program order is topological).
    safe: dict[str, bool] = {}
    for op in reversed(ops):
        for t in op.outputs:
            if t not in fusion.tensors:
                continue
            uses = consumers.get(t, ())
            ok = (t in outputs or bool(uses)) and (
                t not in outputs or fusion.tensors[t].dtype.is_half)
            for user in uses:
                if not ok:
                    break
                if user.name in DISCRETE or (user.name == "where" and user.inputs[0] == t):
                    ok = False
                elif user.name == "cast" and fusion.tensors[user.outputs[0]].dtype in (
                        DType.bool, DType.int32, DType.int64):
                    ok = False
                else:
                    ok = all(safe[o] for o in user.outputs if o in fusion.tensors)
            safe[t] = ok
    return frozenset(op.outputs[0] for op in ops
                     if op.name in FAST_OPS and op.outputs[0] in fusion.tensors
                     and fusion.tensors[op.outputs[0]].dtype.compute is DType.float32
                     and safe[op.outputs[0]])
