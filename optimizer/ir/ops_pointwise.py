"""Elementwise ops: unary and binary math, comparisons, ternaries, casts and copies.

Result types follow nvFuser (and PyTorch): tensors dominate scalars of their category; "float" ops
(exp, sqrt, ...) lift integer inputs to float32 (float64 for scalar-only math, as nvFuser's host
scalars are doubles). On scalars alone an elementwise op is host arithmetic (class SCALAR).
"""

from __future__ import annotations

from typing import Any

from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir.dtypes import DType, result_type
from fusecut.optimizer.ir.fusion import ScalarValue, TensorValue
from fusecut.optimizer.ir.opspec import (
    OpClass,
    OpSpec,
    OutSig,
    Param,
    broadcast_shapes,
    register,
    tensor_operands,
)

# name -> cost in simple-op units (exp and friends are several instructions each)
FLOAT_UNARY = {
    "acos": 8, "acosh": 10, "asin": 8, "asinh": 10, "atan": 8, "atanh": 10, "cos": 8, "cosh": 10,
    "exp": 4, "exp2": 4, "expm1": 8, "erf": 8, "erfc": 8, "erfinv": 12, "lgamma": 24,
    "digamma": 24, "erfcinv": 12, "log": 4, "log10": 4, "log1p": 8, "log2": 4,
    "reciprocal": 2, "rsqrt": 2,
    "sigmoid": 6, "silu": 6, "sin": 8, "sinh": 10, "sqrt": 2, "tan": 10, "tanh": 6, "frac": 2,
}
SAME_UNARY = {
    "abs": 1, "neg": 1, "relu": 1, "ceil": 1, "floor": 1, "round": 1, "trunc": 1, "sign": 1,
    "bitwise_not": 1,
}
BOOL_UNARY = {
    "isfinite": 1, "isinf": 1, "isnan": 1, "isneginf": 1, "isposinf": 1, "isreal": 1,
    "signbit": 1, "logical_not": 1,
}
ARITH_BINARY = {
    "add": 1, "sub": 1, "mul": 1, "div": 2, "maximum": 1, "minimum": 1, "fmod": 4,
    "remainder": 4, "mod": 4, "pow": 12, "nextafter": 2, "bitwise_and": 1, "bitwise_or": 1,
    "bitwise_xor": 1, "bitwise_left_shift": 1, "bitwise_right_shift": 1,
    "logical_right_shift": 1, "gcd": 16,
}
FLOAT_BINARY = {"truediv": 2, "atan2": 10}
COMPARE_BINARY = {"eq": 1, "ne": 1, "lt": 1, "le": 1, "gt": 1, "ge": 1,
                  "logical_and": 1, "logical_or": 1, "logical_xor": 1}
INT_ONLY = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
            "bitwise_right_shift", "logical_right_shift", "gcd"}
TERNARY = {"where": ("pred", "value1", "value2"), "lerp": ("start", "end", "weight"),
           "clamp": ("arg", "min", "max"), "threshold": ("arg", "threshold", "value")}


def _elementwise_broadcast(tensors: list[TensorValue]) -> tuple[bool, ...]:
    rank = max((t.rank for t in tensors), default=0)
    out = [True] * rank
    for t in tensors:
        off = rank - t.rank
        for i, b in enumerate(t.broadcast):
            out[off + i] = out[off + i] and b
    return tuple(out)


def _split(ins: list) -> tuple[list[DType], list[DType]]:
    tensors = [v.dtype for v in ins if isinstance(v, TensorValue)]
    scalars = [v.dtype for v in ins if isinstance(v, ScalarValue)]
    return tensors, scalars


def _sig(ins: list, dtype: DType) -> list[OutSig]:
    tensors = tensor_operands(ins)
    if not tensors:
        return [OutSig(dtype, None)]
    return [OutSig(dtype, _elementwise_broadcast(tensors))]


def _float_of(dtype: DType, scalar_only: bool) -> DType:
    if dtype.is_float or dtype.is_complex:  # exp of a complex tensor is complex
        return dtype
    return DType.float64 if scalar_only else DType.float32


# Op and operand-dtype pairs that neither fusecut nor torch (its reference and fallback path)
# runs: refused when the definition is made, naming the op and the dtype, instead of failing when
# it runs. The dtype is the operands' promoted one. (nvFuser's opinfo dtypes agree: no bool
# negation or shifts, no integer nextafter, no ordering or rounding of complex values; uint64 has
# barely any arithmetic in torch.)
_UINT64_OK = {"cast", "set", "eq", "ne", "bitwise_and", "bitwise_or", "bitwise_xor", "where",
              "isfinite", "isinf", "isnan", "isneginf", "isposinf", "isreal", "signbit"}
REFUSED_DTYPES: dict[str, frozenset[str]] = {}
for _names, _category in (
        (("abs", "neg", "relu", "sub", "fmod", "remainder", "mod", "pow", "nextafter",
          "bitwise_left_shift", "bitwise_right_shift", "logical_right_shift", "gcd"), "bool"),
        (("nextafter",), "int"),
        (("erf", "erfc", "erfinv", "erfcinv", "lgamma", "digamma", "frac", "relu", "sign",
          "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "isneginf", "isposinf",
          "signbit", "maximum", "minimum", "fmod", "remainder", "mod", "nextafter",
          "bitwise_left_shift", "bitwise_right_shift", "logical_right_shift", "gcd", "atan2",
          "lt", "le", "gt", "ge", "ceil", "floor", "round", "trunc", "clamp", "threshold"),
         "complex"),
):
    for _n in _names:
        REFUSED_DTYPES[_n] = REFUSED_DTYPES.get(_n, frozenset()) | {_category}


def dtype_category(dtype: DType) -> str:
    if dtype is DType.uint64:
        return "uint64"
    return "bool" if dtype.is_bool else "int" if dtype.is_int else \
        "complex" if dtype.is_complex else "float"


def check_operand_dtype(name: str, dtype: DType, what: str = "operands") -> None:
    """A DefinitionError naming the op and the dtype when fusecut cannot run ``name`` on it."""
    category = dtype_category(dtype)
    if category in REFUSED_DTYPES.get(name, ()) or (category == "uint64"
                                                    and name not in _UINT64_OK):
        raise DefinitionError(f"{name} is not supported for {dtype.value} {what} (fusecut "
                              f"and torch have no {name} of {dtype.value})")


def _make_infer(name: str, rule: str):
    def infer(ins: list, attrs: dict[str, Any]) -> list[OutSig]:
        tensors, scalars = _split(ins)
        scalar_only = not tensors
        operand_types = ins[1:] if rule == "ternary_where" else ins
        if operand_types:
            check_operand_dtype(name, result_type(*_split(operand_types)))
        if name in INT_ONLY:
            for v in ins:
                if v.dtype.is_float:
                    raise DefinitionError(f"{name} needs integer or bool operands, "
                                          f"{v.name} is {v.dtype.value}")
        if rule == "bool":
            return _sig(ins, DType.bool)
        if rule == "ternary_where":
            pred = ins[0]
            if pred.dtype is not DType.bool:
                raise DefinitionError(f"Condition should be of DataType Bool: where's "
                                      f"condition {pred.name} must be bool, got "
                                      f"{pred.dtype.value}")
            t2, s2 = _split(ins[1:])
            return _sig(ins, result_type(t2, s2) if (t2 or s2) else DType.bool)
        if rule == "first":  # clamp, threshold: the type of the first operand's category
            return _sig(ins, result_type(tensors, scalars))
        out = result_type(tensors, scalars)
        if name == "abs" and out.is_complex:  # |z| is real, as torch's and nvFuser's abs
            out = DType.float64 if out is DType.complex128 else DType.float32
        if rule == "float":
            out = _float_of(out, scalar_only)
        elif scalar_only and out is DType.float32:
            out = DType.float64  # host scalars compute in double
        return _sig(ins, out)

    return infer


def _shape(in_shapes, attrs, ev):
    shapes = [s for s in in_shapes if s is not None]
    names = [f"operand {i}" for i, s in enumerate(in_shapes) if s is not None]
    return [broadcast_shapes(shapes, names)] if shapes else [()]


def _register_family(table: dict[str, float], params: tuple[Param, ...], rule: str) -> None:
    for name, cost in table.items():
        register(OpSpec(name, params, OpClass.POINTWISE, _make_infer(name, rule), _shape,
                        cost=cost))


_UNARY = (Param("arg", "V"),)
_BINARY = (Param("arg1", "V", aliases=("lhs", "input")),
           Param("arg2", "V", aliases=("rhs", "other")))

_register_family(FLOAT_UNARY, _UNARY, "float")
_register_family(SAME_UNARY, _UNARY, "same")
_register_family(BOOL_UNARY, _UNARY, "bool")
_register_family(ARITH_BINARY, _BINARY, "same")
_register_family(FLOAT_BINARY, _BINARY, "float")
_register_family(COMPARE_BINARY, _BINARY, "bool")

for _name, _pnames in TERNARY.items():
    _rule = ("ternary_where" if _name == "where"
             else "first" if _name in ("clamp", "threshold") else "same")
    register(OpSpec(_name, tuple(Param(p, "V") for p in _pnames), OpClass.POINTWISE,
                    _make_infer(_name, _rule), _shape, cost=2))
register(OpSpec("addcmul", (Param("arg", "V"), Param("tensor1", "V"), Param("tensor2", "V"),
                            Param("value", "V")),
                OpClass.POINTWISE, _make_infer("addcmul", "same"), _shape, cost=2))


def _complex_part_infer(ins, attrs):
    (arg,) = ins
    if not arg.dtype.is_complex:
        raise DefinitionError(f"real/imag need a complex operand, {arg.name} is "
                              f"{arg.dtype.value}")
    real = DType.float64 if arg.dtype is DType.complex128 else DType.float32
    return _sig(ins, real)


for _name in ("real", "imag"):
    register(OpSpec(_name, _UNARY, OpClass.POINTWISE, _complex_part_infer, _shape, cost=1))


def _cast_infer(ins, attrs):
    dtype = attrs["dtype"]
    if dtype is None:
        raise DefinitionError("cast needs a dtype (DataType.Null is not a type)")
    return _sig(ins, dtype)


register(OpSpec("cast", (Param("arg", "V"), Param("dtype", "DT")), OpClass.POINTWISE,
                _cast_infer, _shape, cost=1))


def _copy_infer(ins, attrs):
    (arg,) = ins
    if not isinstance(arg, TensorValue):
        raise DefinitionError(f"expects a tensor, {arg.name} is a scalar")
    return [OutSig(arg.dtype, arg.broadcast)]


register(OpSpec("set", (Param("arg", "T"),), OpClass.POINTWISE, _copy_infer, _shape, cost=0))
register(OpSpec("segment_set", (Param("arg", "T"),), OpClass.SEGMENT_SET, _copy_infer, _shape,
                cost=0))
