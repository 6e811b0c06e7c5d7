"""CUDA C++ spelling of fusecut's types, literals and elementwise math.

Values live in registers in their compute type (float for bf16/fp16, as nvFuser does); an op
whose result type is 16-bit rounds its result, so intermediate values match a framework that
materialises every op. ``unary``/``binary``/``ternary`` return C expressions over operand
expressions already converted to the op's compute type.

A spelling that calls a device helper of ``codegen.preamble`` (``fc_max``, ``fc_f_to_e4m3``...)
is a ``Code`` value that reads the helper's name (``call``): the statements that use it record
it, and the kernel's preamble is linked from what its statements read.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fusecut.codegen.code import Code, names, spelt
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.dtypes import DType

STORAGE = {DType.bool: "bool", DType.int32: "int", DType.int64: "long long",
           DType.float16: "__half", DType.bfloat16: "__nv_bfloat16", DType.float32: "float",
           DType.float64: "double", DType.float8_e4m3fn: "unsigned char",
           DType.float8_e5m2: "unsigned char"}
COMPUTE = {DType.bool: "bool", DType.int32: "int", DType.int64: "long long",
           DType.float16: "float", DType.bfloat16: "float", DType.float32: "float",
           DType.float64: "double", DType.float8_e4m3fn: "float", DType.float8_e5m2: "float"}
# 8-bit floats: bits in an unsigned char, converted by preamble helpers exactly as torch does
_FP8_NAME = {DType.float8_e4m3fn: "e4m3", DType.float8_e5m2: "e5m2"}


def storage(d: DType) -> str:
    return STORAGE[d]


def compute(d: DType) -> str:
    return COMPUTE[d]


def literal(value, d: DType) -> str:
    """A constant of compute type ``d``."""
    if d.is_bool:
        return "true" if value else "false"
    if d.is_int:
        v = int(value)
        return f"{v}LL" if d is DType.int64 else str(v)
    v = float(value)
    if math.isnan(v):
        return "__int_as_float(0x7fc00000)" if d is not DType.float64 else \
            "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(v):
        if d is DType.float64:
            return f"{'-' if v < 0 else ''}__longlong_as_double(0x7ff0000000000000LL)"
        return f"{'-' if v < 0 else ''}__int_as_float(0x7f800000)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return text if d is DType.float64 else f"{text}f"


def narrow(d: DType) -> bool:
    """Stored narrower than its float compute type: an op producing it rounds its result."""
    return d.is_half or d in _FP8_NAME


def call(fn: str, *args: str | Code) -> Code:
    """``fn(args, ...)``, a call of a device helper: reads the helper and what its arguments
    read."""
    values = [a for a in args if isinstance(a, Code)]
    return Code(f"{fn}({', '.join(map(str, args))})", names(fn, values), False, spelt(values))


def to_compute(expr: str | Code, src: DType) -> str | Code:
    """A loaded storage value as its compute type."""
    if src is DType.bfloat16:
        return f"__bfloat162float({expr})"
    if src is DType.float16:
        return f"__half2float({expr})"
    if src in _FP8_NAME:
        return call(f"fc_{_FP8_NAME[src]}_to_f", expr)
    return expr


def loaded(text: str, d: DType, *parts, simple: bool = False) -> Code:
    """A value of storage type ``d`` read at ``text`` (a ``simple`` element: ``vec_T0.v[_lane]``),
    as its compute type, reading what ``parts`` read."""
    value = to_compute(text, d)
    helper = value if isinstance(value, Code) else None
    return Code(str(value), names(helper, *parts), simple and computed_as_stored(d),
                spelt(*parts))


def computed_as_stored(d: DType) -> bool:
    """Whether a loaded value of storage type ``d`` is already of its compute type
    (``to_compute`` leaves it as it is)."""
    return d not in (DType.bfloat16, DType.float16) and d not in _FP8_NAME


def to_storage(expr: str | Code, dst: DType) -> str | Code:
    """A compute value as storage type (round to nearest even for 16-bit and 8-bit floats)."""
    if dst is DType.bfloat16:
        return f"__float2bfloat16({expr})"
    if dst is DType.float16:
        return f"__float2half({expr})"
    if dst in _FP8_NAME:
        return call(f"fc_f_to_{_FP8_NAME[dst]}", expr)
    return expr


def convert(expr: str | Code, src: DType, dst: DType) -> str | Code:
    """Cast a compute value of type ``src`` to compute type of ``dst`` (with 16-bit and 8-bit
    rounding; a double reaches an 8-bit float through float, as in torch)."""
    if src == dst:
        return expr
    if dst.is_bool:
        return f"({expr} != 0)"
    if narrow(dst):
        return round_half(expr if src is DType.float32 else f"(float)({expr})", dst)
    return f"({compute(dst)})({expr})"


def round_half(expr: str | Code, d: DType) -> str | Code:
    """Round a float to ``d``'s precision, staying in float (what storing and reloading does)."""
    return to_compute(to_storage(expr, d), d)


def _f(name: str, d: DType) -> str:
    """The C math function for float (``expf``) or double (``exp``)."""
    return name if d is DType.float64 else f"{name}f"


FAST_UNARY: dict[str, Callable[[str | Code], str | Code]] = {
    "exp": lambda x: f"__expf({x})",
    "tanh": lambda x: call("fc_tanh_fast", x),
    "erf": lambda x: call("fc_erf_fast", x),
    "log": lambda x: f"__logf({x})",
    "sigmoid": lambda x: f"__fdividef(1.0f, 1.0f + __expf(-({x})))",
    "silu": lambda x: f"__fdividef(({x}), 1.0f + __expf(-({x})))",
    "reciprocal": lambda x: f"__fdividef(1.0f, ({x}))",
}


def unary(op: str, x: str | Code, d: DType, fast: bool = False) -> str | Code:
    """``op`` applied to ``x``, a value of compute type ``d`` (the op's compute type); ``fast``
    allows an approximate float32 version (see ``codegen.precision``)."""
    if fast and d is DType.float32 and op in FAST_UNARY:
        return FAST_UNARY[op](x)
    if d.is_float:
        simple = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
                  "log10": "log10", "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan",
                  "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
                  "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh",
                  "atanh": "atanh", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv",
                  "lgamma": "lgamma", "sqrt": "sqrt", "rsqrt": "rsqrt", "ceil": "ceil",
                  "floor": "floor", "trunc": "trunc", "round": "rint", "abs": "fabs"}
        one = literal(1.0, d)
        zero = literal(0.0, d)
        if op in simple:
            return f"{_f(simple[op], d)}({x})"
        table = {
            "neg": f"(-{x})",
            "relu": f"(({x}) <= {zero} ? {zero} : ({x}))",  # relu(nan) is nan
            # correctly rounded like 1/x, without a division
            "reciprocal": f"__drcp_rn({x})" if d is DType.float64 else f"__frcp_rn({x})",
            "sigmoid": f"({one} / ({one} + {_f('exp', d)}(-({x}))))",
            "silu": f"(({x}) / ({one} + {_f('exp', d)}(-({x}))))",
            "frac": f"(({x}) - {_f('trunc', d)}({x}))",
            "sign": f"(({x}) > {zero} ? {one} : (({x}) < {zero} ? -{one} : ({x})))",
            "signbit": f"(signbit({x}) != 0)",
            "isfinite": f"(isfinite({x}) != 0)", "isinf": f"(isinf({x}) != 0)",
            "isnan": f"(isnan({x}) != 0)",
            "isneginf": f"(isinf({x}) && ({x}) < {zero})",
            "isposinf": f"(isinf({x}) && ({x}) > {zero})",
            "isreal": "true", "logical_not": f"(({x}) == {zero})",
        }
        if op in table:
            return table[op]
    else:
        table = {
            "neg": f"(-{x})", "abs": f"(({x}) < 0 ? -({x}) : ({x}))",
            "relu": f"(({x}) > 0 ? ({x}) : 0)", "sign": f"((({x}) > 0) - (({x}) < 0))",
            "bitwise_not": f"(~{x})" if not d.is_bool else f"(!{x})",
            "ceil": x, "floor": x, "trunc": x, "round": x,
            "signbit": f"(({x}) < 0)", "isfinite": "true", "isinf": "false", "isnan": "false",
            "isneginf": "false", "isposinf": "false", "isreal": "true",
            "logical_not": f"(!({x}))",
        }
        if op in table:
            return table[op]
    raise PlanError(f"no CUDA code for {op} on {d.value}")


def reads_operand(op: str, d: DType) -> bool:
    """Whether ``unary(op, x, d)`` reads x: a test the type alone answers (``isreal``; ``isnan``
    of an integer) is a constant."""
    if d.is_float:
        return op != "isreal"
    return op not in ("isfinite", "isinf", "isnan", "isneginf", "isposinf", "isreal")


# Exponents torch's pow_tensor_scalar computes by multiplication, division or square root (1: the
# value itself, 0: one; Thunder's RMSNorm backward raises x to the power 1);
# the same here, so that results match eager torch and cost a few instructions.
SMALL_POWERS = (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0)


def small_power(a: str | Code, exponent: float, d: DType) -> str:
    one = literal(1.0, d)
    return {2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 0.5: f"{_f('sqrt', d)}({a})",
            -0.5: f"{_f('rsqrt', d)}({a})", -1.0: f"({one} / {a})",
            -2.0: f"({one} / ({a} * {a}))", 1.0: f"({a})", 0.0: one}[exponent]


def binary(op: str, a: str | Code, b: str | Code, d: DType, fast: bool = False) -> str | Code:
    """``op`` over ``a`` and ``b`` of compute type ``d`` (the comparison's operand type for
    comparisons); ``fast`` allows an approximate float32 division."""
    if fast and d is DType.float32 and op in ("div", "truediv"):
        return f"__fdividef({a}, {b})"
    common = {"add": f"({a} + {b})", "sub": f"({a} - {b})", "mul": f"({a} * {b})",
              "eq": f"({a} == {b})", "ne": f"({a} != {b})", "lt": f"({a} < {b})",
              "le": f"({a} <= {b})", "gt": f"({a} > {b})", "ge": f"({a} >= {b})",
              "logical_and": f"(({a}) && ({b}))", "logical_or": f"(({a}) || ({b}))",
              "logical_xor": f"((bool)({a}) != (bool)({b}))"}
    if op in common:
        return common[op]
    if d.is_float:
        table = {"div": f"({a} / {b})", "truediv": f"({a} / {b})",
                 "maximum": call("fc_max", a, b), "minimum": call("fc_min", a, b),
                 "fmod": f"{_f('fmod', d)}({a}, {b})", "mod": f"{_f('fmod', d)}({a}, {b})",
                 "remainder": call("fc_remainder", a, b), "pow": f"{_f('pow', d)}({a}, {b})",
                 "atan2": f"{_f('atan2', d)}({a}, {b})",
                 "nextafter": f"{_f('nextafter', d)}({a}, {b})"}
    else:
        table = {"div": call("fc_div", a, b), "maximum": f"(({a}) > ({b}) ? ({a}) : ({b}))",
                 "minimum": f"(({a}) < ({b}) ? ({a}) : ({b}))", "fmod": call("fc_div_rem", a, b),
                 "mod": call("fc_div_rem", a, b), "remainder": call("fc_remainder_int", a, b),
                 "pow": call("fc_ipow", a, b), "bitwise_and": f"({a} & {b})",
                 "bitwise_or": f"({a} | {b})", "bitwise_xor": f"({a} ^ {b})",
                 "bitwise_left_shift": f"({a} << {b})",
                 "bitwise_right_shift": f"({a} >> {b})",
                 "logical_right_shift": call("fc_lshr", a, b)}
    if op in table:
        return table[op]
    raise PlanError(f"no CUDA code for {op} on {d.value}")


def ternary(op: str, a: str | Code, b: str | Code, c: str | Code, d: DType) -> str | Code:
    if op == "where":
        return f"(({a}) ? ({b}) : ({c}))"
    if op == "lerp":  # torch's formula: exact at both ends
        half = literal(0.5, d)
        one = literal(1.0, d)
        return (f"({_f('fabs', d)}({c}) < {half} ? ({a}) + ({c}) * (({b}) - ({a})) : "
                f"({b}) - (({b}) - ({a})) * ({one} - ({c})))")
    if op == "clamp":
        if d.is_float:
            return call("fc_min", call("fc_max", a, b), c)
        return f"(({a}) < ({b}) ? ({b}) : (({a}) > ({c}) ? ({c}) : ({a})))"
    if op == "threshold":
        return f"(({a}) > ({b}) ? ({a}) : ({c}))"
    raise PlanError(f"no CUDA code for {op}")

