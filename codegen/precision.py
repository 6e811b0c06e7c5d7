"""Where a kernel may use fast (approximate) math without it showing in any output.

``__expf``, ``tanh.approx`` and ``__fdividef`` are off by a few units in the last place of a
float; a 16-bit output rounds away 13 more bits. So an op may use them when every path from its
result reaches only bf16/fp16 outputs through continuous ops. A comparison, a select condition,
rounding, or a cast to an integer or bool could turn a last-bit difference into a different
value, and a float32 or float64 output would show it: either keeps the precise function.
"""

from __future__ import annotations

from optimizer.analysis.shapes import Bound
from optimizer.ir.dtypes import DType
from optimizer.schedulers.kinds import Schedule

FAST_OPS = {"exp", "tanh", "sigmoid", "silu", "log", "div", "truediv", "reciprocal"}
DISCRETE = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
            "logical_not", "ceil", "floor", "round", "trunc", "sign", "signbit", "isfinite",
            "isinf", "isnan", "isneginf", "isposinf", "fmod", "remainder", "mod", "frac",
            "take_along_axis", "gather", "index_select"}


def fast_math_tensors(bound: Bound, schedule: Schedule) -> frozenset[str]:
    """Tensors of the segment whose producing op may use fast math."""
    fusion = bound.fusion
    ops = [fusion.ops[i] for i in schedule.ops]
    consumers: dict[str, list] = {}
    for op in ops:
        for n in dict.fromkeys(op.inputs):
            consumers.setdefault(n, []).append(op)
    outputs = set(schedule.outputs)
    safe: dict[str, bool] = {}

    def only_reaches_16bit(t: str) -> bool:
        """Every use of ``t`` is continuous and ends in a 16-bit float output."""
        if t in safe:
            return safe[t]
        safe[t] = False  # cycles cannot happen; this guards re-entry
        ok = True
        if t in outputs and not fusion.tensors[t].dtype.is_half:
            ok = False
        for op in consumers.get(t, ()):
            if not ok:
                break
            if op.name in DISCRETE or (op.name == "where" and op.inputs[0] == t):
                ok = False
            elif op.name == "cast" and fusion.tensors[op.outputs[0]].dtype in (
                    DType.bool, DType.int32, DType.int64):
                ok = False
            else:
                ok = all(only_reaches_16bit(o) for o in op.outputs if o in fusion.tensors)
        if ok and t not in outputs and not consumers.get(t):
            ok = False
        safe[t] = ok
        return ok

    fast = set()
    for op in ops:
        out = op.outputs[0]
        if (op.name in FAST_OPS and out in fusion.tensors
                and fusion.tensors[out].dtype.compute is DType.float32
                and only_reaches_16bit(out)):
            fast.add(out)
    return frozenset(fast)
