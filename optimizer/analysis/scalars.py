"""Host arithmetic on scalars: what an elementwise op computes when all its operands are scalars.

nvFuser evaluates such expressions on the host (sizes, reciprocals of sizes, epsilons); so do we,
in double precision for floats and with C semantics for integer division.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.opspec import OpClass, get_spec


def _trunc_div(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        if b == 0:
            raise InputError("integer division by zero in a scalar expression")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return _fdiv(a, b)


def _fdiv(a: Any, b: Any) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or (isinstance(a, float) and math.isnan(a)):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _safe(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*a: Any) -> Any:
        try:
            return fn(*a)
        except (ValueError, OverflowError):
            return math.nan
    return call


UNARY: dict[str, Callable[[Any], Any]] = {
    "abs": abs, "neg": lambda x: -x, "relu": lambda x: max(x, 0),
    "exp": _safe(math.exp), "exp2": _safe(lambda x: 2.0 ** x), "expm1": _safe(math.expm1),
    "log": _safe(math.log), "log2": _safe(math.log2), "log10": _safe(math.log10),
    "log1p": _safe(math.log1p), "sqrt": _safe(math.sqrt),
    "rsqrt": _safe(lambda x: 1.0 / math.sqrt(x) if x else math.inf),
    "reciprocal": lambda x: _fdiv(1.0, x), "sin": math.sin, "cos": math.cos,
    "tan": _safe(math.tan), "asin": _safe(math.asin), "acos": _safe(math.acos),
    "atan": math.atan, "sinh": _safe(math.sinh), "cosh": _safe(math.cosh), "tanh": math.tanh,
    "asinh": math.asinh, "acosh": _safe(math.acosh), "atanh": _safe(math.atanh),
    "erf": math.erf, "erfc": math.erfc, "lgamma": _safe(math.lgamma),
    "sigmoid": _safe(_sigmoid), "silu": _safe(lambda x: x * _sigmoid(x)),
    "ceil": lambda x: math.ceil(x) if isinstance(x, float) and math.isfinite(x) else x,
    "floor": lambda x: math.floor(x) if isinstance(x, float) and math.isfinite(x) else x,
    "trunc": lambda x: math.trunc(x) if isinstance(x, float) and math.isfinite(x) else x,
    "round": lambda x: round(x) if isinstance(x, float) and math.isfinite(x) else x,
    "frac": lambda x: x - math.trunc(x) if math.isfinite(x) else math.nan,
    "sign": lambda x: (x > 0) - (x < 0), "signbit": lambda x: math.copysign(1.0, x) < 0,
    "isfinite": lambda x: math.isfinite(x), "isinf": lambda x: math.isinf(x),
    "isnan": lambda x: isinstance(x, float) and math.isnan(x),
    "isneginf": lambda x: x == -math.inf, "isposinf": lambda x: x == math.inf,
    "isreal": lambda x: True, "logical_not": lambda x: not x, "bitwise_not": lambda x: ~x,
}

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": _trunc_div, "truediv": _fdiv, "pow": _safe(lambda a, b: a ** b),
    "maximum": max, "minimum": min, "fmod": _safe(math.fmod),
    "remainder": _safe(lambda a, b: a % b), "mod": _safe(lambda a, b: a % b),
    "atan2": math.atan2, "nextafter": math.nextafter, "gcd": math.gcd,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "logical_and": lambda a, b: bool(a) and bool(b), "logical_or": lambda a, b: bool(a) or bool(b),
    "logical_xor": lambda a, b: bool(a) != bool(b),
    "bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b,
    "bitwise_xor": lambda a, b: a ^ b, "bitwise_left_shift": lambda a, b: a << b,
    "bitwise_right_shift": lambda a, b: a >> b, "logical_right_shift": lambda a, b: a >> b,
}

TERNARY: dict[str, Callable[[Any, Any, Any], Any]] = {
    "where": lambda c, a, b: a if c else b,
    "lerp": lambda s, e, w: s + w * (e - s),
    "clamp": lambda x, lo, hi: min(max(x, lo), hi),
    "threshold": lambda x, t, v: x if x > t else v,
}


def coerce(value: Any, dtype: DType) -> Any:
    """A host value as the given dtype (bool, Python int, float or complex)."""
    if dtype.is_complex:
        return complex(value)
    if isinstance(value, complex):
        raise InputError(f"cannot convert complex {value} to {dtype.value}")
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(f"cannot convert {value} to {dtype.value}")
            return int(value)
        return int(value)
    return float(value)


def eval_scalar_op(name: str, args: list[Any], attrs: dict[str, Any], out: DType) -> Any:
    if name == "cast":
        return coerce(args[0], out)
    if name == "addcmul":
        return coerce(args[0] + args[3] * args[1] * args[2], out)
    table = {1: UNARY, 2: BINARY, 3: TERNARY}.get(len(args), {})
    fn = table.get(name)
    if fn is None:
        raise InputError(f"{name} cannot be evaluated on scalars")
    if out.is_complex:
        args = [args[0]] + [complex(a) for a in args[1:]] if name == "where" else \
            [complex(a) for a in args]
    elif out.is_float:  # float math on the host is double math
        args = [args[0]] + [float(a) for a in args[1:]] if name == "where" else \
            [float(a) for a in args]
    return coerce(fn(*args), out)


RANDOM_OPS = frozenset({"uniform", "normal"})


def baked_scalar_inputs(fusion) -> set[str]:
    """Scalar inputs whose values a plan is built for: sizes, indices, anything other than an
    operand of elementwise math (which kernels take as a parameter at run time). A call with
    another value of one of these needs another plan; the others may change freely."""
    baked: set[str] = set()
    for op in fusion.ops:
        scalar_op = all(o in fusion.scalars for o in op.outputs)
        if scalar_op:
            continue
        refs = op.refs()
        # Elementwise operands, and a random op's bounds, seed and offset (its shape is an
        # attribute), reach kernels as parameters: a new value needs no new plan.
        run_time = get_spec(op.name).op_class is OpClass.POINTWISE or op.name in RANDOM_OPS
        operands = set(op.inputs) if run_time else set()
        baked.update(n for n in refs if n in fusion.scalars and n not in operands)
    for op in reversed(fusion.ops):  # what a baked derived scalar is computed from is baked too
        if any(o in baked for o in op.outputs) and all(o in fusion.scalars for o in op.outputs):
            baked.update(n for n in op.refs() if n in fusion.scalars)
    return baked & set(fusion.scalar_inputs())
