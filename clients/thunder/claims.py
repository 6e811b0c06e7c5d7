"""What ``fusecut_ex`` claims of a Thunder trace: a table per kind of primitive (pointwise,
reductions, shapes, factories, library calls) and a checker per primitive that looks at its
arguments (dtypes fusecut supports, ranks, constant dims).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Number
from typing import Any

from thunder.core import dtypes, prims
from thunder.core.proxies import IntegerProxy, Proxy, TensorProxy

from fusecut.optimizer.ir.builder import MAX_RANK

# ---- what fusecut claims ------------------------------------------------------------------------

_FLOAT = {dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
_SUPPORTED = _FLOAT | {dtypes.int32, dtypes.int64, dtypes.bool8}

# Thunder prim name -> fusecut op name, where they compute the same thing. ``round`` is left out
# (Thunder rounds half to even), so are integer ``div`` (checked below) and complex numbers.
_UNARY = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bitwise_not", "ceil", "cos",
          "cosh", "digamma", "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "floor",
          "isfinite", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "rsqrt",
          "sign", "signbit", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]
_BINARY = ["add", "atan2", "bitwise_and", "bitwise_or", "bitwise_xor", "div", "eq", "fmod", "ge",
           "gt", "le", "lt", "maximum", "minimum", "mul", "ne", "nextafter", "pow", "remainder",
           "sub"]
POINTWISE = {getattr(prims, n).id: n for n in _UNARY + _BINARY if hasattr(prims, n)}
POINTWISE[prims.where.id] = "where"
POINTWISE[prims.convert_element_type.id] = "cast"
POINTWISE[prims.shallow_copy.id] = "set"
POINTWISE[prims.clone.id] = "set"  # ``x.to(dtype, copy=True)`` is clone + cast
REDUCTIONS = {prims.sum.id: "sum", prims.amax.id: "max", prims.amin.id: "min",
              prims.prod.id: "prod", prims.var.id: "var", prims.var_mean.id: "var_mean"}
SHAPES = {prims.broadcast_in_dim.id: "broadcast_in_dim", prims.reshape.id: "reshape",
          prims.transpose.id: "permute", prims.squeeze.id: "squeeze",
          prims.slice_prim.id: "slice", prims.pad.id: "pad", prims.cat.id: "cat",
          prims.take.id: "index_select", prims.take_along_axis.id: "take_along_axis"}
FACTORIES = {prims.full.id: "full", prims.iota.id: "iota",
             prims.uniform_philox.id: "uniform",
             # Claimed only to keep it a prim until the fusion pass turns it into uniform_philox
             # (translating it as such is refused: a stateful draw never runs in a region).
             prims.uniform.id: "uniform_stateful"}
LIBRARY = {prims.matmul.id: "matmul", prims.linear.id: "linear"}


def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat(a))
        else:
            out.append(a)
    return out


def _tensor_ok(t: TensorProxy) -> bool:
    return (t.device.type in ("cpu", "cuda") and t.dtype in _SUPPORTED and t.ndim <= MAX_RANK
            and all(isinstance(s, int) for s in t.shape))


def _args_ok(*args: Any, **kwargs: Any) -> bool:
    """Every tensor is one fusecut can take, every number a constant, devices agree."""
    devices = set()
    for a in _flat(list(args) + list(kwargs.values())):
        if isinstance(a, TensorProxy):
            if not _tensor_ok(a):
                return False
            devices.add(a.device.type)
        elif isinstance(a, Proxy):  # a NumberProxy: a value known only at run time
            return False
        elif isinstance(a, complex):
            return False
    return len(devices) <= 1


def _div_ok(a: Any, b: Any) -> bool:
    # Thunder's integer division truncates; fusecut's div is true division on floats only.
    tensors = [x for x in (a, b) if isinstance(x, TensorProxy)]
    return _args_ok(a, b) and all(t.dtype in _FLOAT for t in tensors)


def _convert_ok(a: Any, dtype: Any) -> bool:
    return isinstance(a, TensorProxy) and _args_ok(a) and dtypes.to_dtype(dtype) in _SUPPORTED


def _reduction_ok(a: TensorProxy, dims: Sequence[int], **kwargs: Any) -> bool:
    return _args_ok(a, **kwargs) and all(isinstance(d, int) for d in dims)


def _pad_ok(a: TensorProxy, value: Any, config: Sequence[tuple[int, int, int]]) -> bool:
    # Interior (dilation) and negative padding have no fusecut op.
    return _args_ok(a, value) and all(lo >= 0 and hi >= 0 and d == 0 for lo, hi, d in config)


def _take_ok(a: TensorProxy, index: TensorProxy, dim: int) -> bool:
    return _args_ok(a, index) and index.ndim == 1 and index.dtype in (dtypes.int32, dtypes.int64)


def _factory_ok(*args: Any, device: Any, dtype: Any, **kwargs: Any) -> bool:
    return (device.type in ("cpu", "cuda") and dtypes.to_dtype(dtype) in _SUPPORTED
            and _args_ok(*args, **kwargs))


def _uniform_philox_ok(shape: Sequence[int], minval: Any, maxval: Any, *, device: Any,
                       dtype: Any, seed: Any, offset: Any) -> bool:
    """Thunder's dropout draw (``replace_uniform`` makes it from ``uniform``): fusecut's Philox
    kernels compute it from the seed and offset Thunder takes from torch's CUDA generator."""
    return (device.type == "cuda" and dtypes.to_dtype(dtype) in _FLOAT
            and all(isinstance(s, int) for s in shape)
            and all(isinstance(v, Number) for v in (minval, maxval))
            and all(isinstance(v, (int, IntegerProxy)) for v in (seed, offset)))


def checker(prim_id: Any) -> Callable[..., bool]:
    if prim_id == prims.uniform_philox.id:
        return _uniform_philox_ok
    if prim_id == prims.uniform.id:
        return lambda *args, device, dtype: device.type == "cuda"
    if prim_id == prims.div.id:
        return _div_ok
    if prim_id == prims.convert_element_type.id:
        return _convert_ok
    if prim_id in REDUCTIONS:
        return _reduction_ok
    if prim_id == prims.pad.id:
        return _pad_ok
    if prim_id == prims.take.id:
        return _take_ok
    if prim_id in FACTORIES:
        return _factory_ok
    return _args_ok
