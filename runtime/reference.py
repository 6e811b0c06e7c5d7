"""The torch reference interpreter: runs any fusion op by op, on CPU or CUDA tensors.

It is the oracle of every correctness test and the CPU path of execution. Arithmetic follows
nvFuser: operands are cast to the op's compute type (float32 for 16-bit floats), the op runs, the
result is cast to the op's result type. Scalars come from ``bind``, which evaluates them on the
host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fusecut.optimizer.analysis.shapes import Bound, bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.dtypes import DType, result_type
from fusecut.optimizer.ir.fusion import Fusion, Op, Ref
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.ops_shape import pad_widths_by_axis, slice_bounds
from fusecut.runtime.philox import random_values
from fusecut.runtime.reference_library import LIBRARY_REFERENCE
from fusecut.runtime.tensors import TORCH_DTYPE, meta_of, to_torch_dtype

_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "abs": torch.abs, "neg": torch.neg, "relu": torch.relu, "sign": torch.sign,
    "bitwise_not": torch.bitwise_not, "acos": torch.acos, "acosh": torch.acosh,
    "asin": torch.asin, "asinh": torch.asinh, "atan": torch.atan, "atanh": torch.atanh,
    "cos": torch.cos, "cosh": torch.cosh, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "lgamma": torch.lgamma, "digamma": torch.digamma, "log": torch.log, "log10": torch.log10,
    "log1p": torch.log1p, "log2": torch.log2, "reciprocal": torch.reciprocal,
    "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "silu": F.silu, "sin": torch.sin,
    "sinh": torch.sinh, "sqrt": torch.sqrt, "tan": torch.tan, "tanh": torch.tanh,
    "frac": torch.frac, "isfinite": torch.isfinite, "isinf": torch.isinf, "isnan": torch.isnan,
    "isneginf": torch.isneginf, "isposinf": torch.isposinf,
    "isreal": lambda x: torch.isreal(x) if x.is_complex() else torch.ones_like(
        x, dtype=torch.bool), "signbit": torch.signbit, "erfcinv": lambda x: torch.erfinv(1 - x),
    "real": torch.real, "imag": torch.imag,
    "logical_not": torch.logical_not,
}
_ROUNDING = {"ceil": torch.ceil, "floor": torch.floor, "round": torch.round, "trunc": torch.trunc}
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "minimum": torch.minimum, "fmod": torch.fmod, "mod": torch.fmod,
    "remainder": torch.remainder, "pow": torch.pow, "nextafter": torch.nextafter,
    "truediv": torch.true_divide, "atan2": torch.atan2, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift, "gcd": torch.gcd,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
}


class _Env:
    def __init__(self, fusion: Fusion, bound: Bound, device: torch.device):
        self.fusion = fusion
        self.bound = bound
        self.device = device
        self.values: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name in self.fusion.scalars:
            v = self.bound.scalars.get(name)
            if v is None:
                raise InputError(f"scalar {name} has no value")
            return v
        return self.values[name]

    def ev(self, x: Any) -> Any:
        return self.get(x.name) if isinstance(x, Ref) else x


def run_reference(fusion: Fusion, args: list[Any], bound: Bound | None = None,
                  trace: dict[str, torch.Tensor] | None = None,
                  device: torch.device | None = None) -> list[torch.Tensor]:
    """Run ``fusion`` on ``args`` (tensors and numbers, in input order); return its outputs.

    With ``trace``, every tensor the fusion computes is recorded there (and none is freed early).
    ``device``: where tensors are made when no argument is a tensor (default the CPU).
    """
    if bound is None:
        bound = bind(fusion, [meta_of(a) for a in args])
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = tensors[0].device if tensors else (device or torch.device("cpu"))
    env = _Env(fusion, bound, device)
    for name, value in zip(fusion.inputs, args):
        if name in fusion.tensors:
            if value.device != device:
                raise InputError(f"input {name} is on {value.device}, others on {device}")
            env.values[name] = value
    last_use = {n: i for i, op in enumerate(fusion.ops) for n in op.inputs}
    keep = set(fusion.outputs) | set(fusion.inputs)
    for i, op in enumerate(fusion.ops):
        if all(o in fusion.scalars for o in op.outputs):
            continue  # host scalars: bind() evaluated them
        results = run_op(op, env)
        for name, value in zip(op.outputs, results):
            env.values[name] = value
            if trace is not None:
                trace[name] = value
        for name in op.inputs:  # free intermediates after their last use
            if trace is None and last_use.get(name) == i and name not in keep:
                env.values.pop(name, None)
    outs = [env.values[o] for o in fusion.outputs]
    for out, inp in fusion.aliases.items():
        env.values[inp].copy_(env.values[out])
    return outs


def run_op(op: Op, env: _Env) -> list[torch.Tensor]:
    fusion = env.fusion
    args = [env.get(n) for n in op.inputs]
    name = op.name
    out_dtypes = _out_dtypes(op, fusion)
    if name in LIBRARY_REFERENCE:
        return LIBRARY_REFERENCE[name](op, args, env, out_dtypes)
    if name in _SPECIAL:
        return _SPECIAL[name](op, args, env, out_dtypes)
    return [_pointwise(op, args, env, out_dtypes[0])]


def _out_dtypes(op: Op, fusion: Fusion) -> list[torch.dtype]:
    try:
        return [to_torch_dtype(fusion.tensors[o].dtype) for o in op.outputs]
    except InputError as e:
        raise InputError(f"{op.name}: {e}") from None


def _compute_type(op: Op, env: _Env) -> DType:
    fusion = env.fusion
    tensor_types = [fusion.tensors[n].dtype for n in op.inputs if n in fusion.tensors]
    scalar_types = [fusion.scalars[n].dtype for n in op.inputs if n in fusion.scalars]
    if op.name == "where":
        tensor_types = [fusion.tensors[n].dtype for n in op.inputs[1:] if n in fusion.tensors]
        scalar_types = [fusion.scalars[n].dtype for n in op.inputs[1:] if n in fusion.scalars]
    return result_type(tensor_types, scalar_types).compute


def _pointwise(op: Op, args: list[Any], env: _Env, out: torch.dtype) -> torch.Tensor:
    name = op.name
    ct = _compute_type(op, env)
    if name in _UNARY and ct in (DType.int32, DType.int64, DType.bool) and \
            out in (torch.float32, torch.float64):
        ct = DType.float32 if out == torch.float32 else DType.float64  # exp(int) is float
    tct = TORCH_DTYPE[ct]

    def t(x: Any, dtype: torch.dtype = tct) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            if x.is_complex() and not dtype.is_complex:
                x = x.real  # complex to real keeps the real part, as nvFuser's cast: said so,
                # rather than left to torch's "discards the imaginary part" warning
            return x.to(dtype)
        return torch.tensor(x, dtype=dtype, device=env.device)

    if name == "cast":
        packed = getattr(torch, "float4_e2m1fn_x2", None)
        if packed is not None and packed in (out, getattr(args[0], "dtype", None)) \
                and out != getattr(args[0], "dtype", None):
            raise InputError("cast: torch cannot convert packed fp4 (float4_e2m1fn_x2) values; "
                             "only nvFuser's kernels unpack them")
        return t(args[0], out)
    if name == "set":
        return args[0]
    if name in _UNARY:
        return _UNARY[name](t(args[0])).to(out)
    if name in _ROUNDING:
        x = t(args[0])
        return (x if not x.is_floating_point() else _ROUNDING[name](x)).to(out)
    if name == "div":
        a, b = t(args[0]), t(args[1])
        if a.is_floating_point() or a.is_complex():
            return torch.true_divide(a, b).to(out)
        # torch's CPU kernel refuses a zero divisor; its CUDA kernel (C's ``a / b``) gives the
        # GPU's value, as fusecut's and nvFuser's kernels do
        if a.device.type == "cpu" and bool((b == 0).any()):
            raise InputError("integer division by zero")
        return torch.div(a, b, rounding_mode="trunc").to(out)
    if name == "logical_right_shift":
        a, b = t(args[0]), t(args[1])
        bits = a.element_size() * 8
        shifted = torch.bitwise_right_shift(a, b)
        mask = torch.bitwise_left_shift(torch.ones_like(a), (bits - b).clamp(max=bits - 1)) - 1
        return torch.where(b >= bits, torch.zeros_like(a),
                           torch.where(b == 0, a, shifted & mask)).to(out)
    if name in _BINARY:
        return _BINARY[name](t(args[0]), t(args[1])).to(out)
    if name == "where":
        return torch.where(t(args[0], torch.bool), t(args[1]), t(args[2])).to(out)
    if name == "lerp":
        return torch.lerp(t(args[0]), t(args[1]), t(args[2])).to(out)
    if name == "clamp":
        return torch.minimum(torch.maximum(t(args[0]), t(args[1])), t(args[2])).to(out)
    if name == "threshold":
        x = t(args[0])
        return torch.where(x > t(args[1]), x, t(args[2])).to(out)
    if name == "addcmul":
        return (t(args[0]) + t(args[3]) * t(args[1]) * t(args[2])).to(out)
    raise InputError(f"the reference has no implementation of {name}")


# ---- shape, reduction, factory, gather and library ops -----------------------------------------


def _bid(op, args, env, outs):
    x = args[0]
    shape = [env.ev(e) for e in op.attrs["shape"]]
    view = [1] * len(shape)
    for i, d in enumerate(op.attrs["broadcast_dims"]):
        view[d] = x.shape[i]
    return [x.reshape(view).expand(shape)]


def _broadcast(op, args, env, outs):
    x = args[0]
    for i, flag in enumerate(op.attrs["is_broadcast_dim"]):
        if flag:
            x = x.unsqueeze(i)
    return [x]


def _expand(op, args, env, outs):
    return [args[0].expand([env.ev(e) for e in op.attrs["shape"]])]


def _squeeze(op, args, env, outs):
    x = args[0]
    for d in sorted((d % x.dim() for d in op.attrs["dims"]), reverse=True):
        x = x.select(d, 0)
    return [x]


def _reshape(op, args, env, outs):
    return [args[0].reshape(env.bound.shapes[op.outputs[0]])]


def _slice(op, args, env, outs):
    x = args[0]
    strides = op.attrs["strides"] or [1] * x.dim()
    index = []
    for i, e in enumerate(x.shape):
        s, t = slice_bounds(e, env.ev(op.attrs["start_indices"][i]),
                            env.ev(op.attrs["end_indices"][i]), op.attrs["manual_normalization"])
        index.append(slice(s, t, strides[i]))
    return [x[tuple(index)]]


def _pad(op, args, env, outs):
    x = args[0]
    value = args[1] if op.attrs.get("has_value") else 0
    widths = [env.ev(w) for w in op.attrs["pad_widths"]]
    out = torch.full(env.bound.shapes[op.outputs[0]], value, dtype=x.dtype, device=x.device)
    src, dst = [], []
    for e, (lo, hi) in zip(x.shape, pad_widths_by_axis(x.dim(), widths)):
        s0, d0 = max(0, -lo), max(0, lo)
        n = e - s0 - max(0, -hi)
        src.append(slice(s0, s0 + max(n, 0)))
        dst.append(slice(d0, d0 + max(n, 0)))
    out[tuple(dst)] = x[tuple(src)]
    return [out]


def _cat(op, args, env, outs):
    return [torch.cat(args, dim=op.attrs["dim"])]


def _permute(op, args, env, outs):
    return [args[0].permute(op.attrs["dims"])]


_IDENTITY = {"sum": 0, "prod": 1}


def _reduce(op, args, env, outs):
    x = args[0]
    axes = list(reduction_axes(op.attrs, x.dim()))
    keep = op.attrs["keepdim"]
    out = outs[0]
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    if op.name in ("sum", "prod") and not (x.is_floating_point() or x.is_complex()):
        acc = torch.int64
    if op.name in ("sum", "prod") and out.is_floating_point and out != acc:
        acc = torch.float64 if out == torch.float64 else torch.float32
    xc = x.to(acc)
    if not axes:
        return [xc.to(out)]
    if x.numel() == 0 or any(x.shape[a] == 0 for a in axes):
        shape = env.bound.shapes[op.outputs[0]]
        if op.name in _IDENTITY:
            return [torch.full(shape, _IDENTITY[op.name], dtype=out, device=x.device)]
        big = float("inf") if xc.is_floating_point() else torch.iinfo(xc.dtype).max
        return [torch.full(shape, -big if op.name == "max" else big, dtype=out, device=x.device)]
    if op.name == "sum":
        r = xc.sum(dim=axes, keepdim=keep)
    elif op.name == "max":
        r = xc.amax(dim=axes, keepdim=keep)
    elif op.name == "min":
        r = xc.amin(dim=axes, keepdim=keep)
    else:
        r = xc
        for a in sorted(axes, reverse=True):
            r = r.prod(dim=a, keepdim=keep)
    return [r.to(out)]


def _var(op, args, env, outs):
    x = args[0]
    ct = x.dtype if x.is_complex() else torch.float64 if x.dtype == torch.float64 else \
        torch.float32
    axes = list(reduction_axes(op.attrs, x.dim()))
    var, mean = torch.var_mean(x.to(ct), dim=axes, correction=op.attrs["correction"],
                               keepdim=op.attrs["keepdim"])
    if op.name == "var":
        return [var.to(outs[0])]
    return [var.to(outs[0]), mean.to(outs[1])]


def _full(op, args, env, outs):
    shape = [env.ev(e) for e in op.attrs["shape"]]
    try:
        return [torch.full(shape, args[0], dtype=outs[0], device=env.device)]
    except RuntimeError:  # a value beyond the dtype: converted as a cast converts it (1e300 in
        # half is inf), as nvFuser's kernels do, instead of torch's overflow error
        out = outs[0]
        wide = torch.complex128 if out.is_complex else torch.float64 \
            if out.is_floating_point or isinstance(args[0], float) else torch.int64
        return [torch.full(shape, args[0], dtype=wide, device=env.device).to(out)]


def _iota(op, args, env, outs):
    length = args[0]
    rest = iter(args[1:])
    start = next(rest) if op.attrs.get("has_start") else 0
    step = next(rest) if op.attrs.get("has_step") else 1
    ct = torch.float64 if outs[0].is_floating_point else torch.int64
    r = torch.arange(length, dtype=ct, device=env.device) * step + start
    return [r.to(outs[0])]


def _random(op, args, env, outs):
    """uniform / normal: Philox4x32-10 values of (rng_seed, rng_offset, linear index), the same
    numbers the generated kernels make (scheme in codegen.rng; seed and offset default to 0)."""
    a, b = args[0], args[1]
    rest = iter(args[2:])
    seed = next(rest) if op.attrs.get("has_rng_seed") else 0
    offset = next(rest) if op.attrs.get("has_rng_offset") else 0
    shape = env.bound.shapes[op.outputs[0]]
    wide = outs[0] == torch.float64
    x = random_values(op.name, math.prod(shape), wide, seed, offset, a, b, env.device)
    if op.name == "uniform":  # [a, b) in the output type, as torch's uniform_ (the kernels'
        lo, hi = (torch.tensor(v, dtype=x.dtype, device=x.device) for v in (a, b))  # fc_below_hi)
        if outs[0] in (torch.float16, torch.bfloat16):
            at_hi = x.to(outs[0]) == hi.to(outs[0])
        else:
            at_hi = x == hi
        x = torch.where(at_hi, lo, x)
    return [x.reshape(shape).to(outs[0])]


def _stride_order(op, args, env, outs):
    x = args[0]
    order = op.attrs["stride_order"]  # order[i]: rank of axis i's stride, 0 = innermost
    axes = sorted(range(x.dim()), key=lambda i: -order[i])
    return [x.permute(axes).contiguous().permute([axes.index(i) for i in range(x.dim())])]


def _cumsum(op, args, env, outs):
    return [torch.cumsum(args[0], dim=op.attrs["dim"]).to(outs[0])]


def _cumprod(op, args, env, outs):
    return [torch.cumprod(args[0], dim=op.attrs["dim"]).to(outs[0])]


def _cumextreme(op, args, env, outs):
    fn = torch.cummax if op.name == "cummax" else torch.cummin
    return [fn(args[0], dim=op.attrs["dim"]).values.to(outs[0])]


def _gather_index(index: torch.Tensor, extent: int) -> torch.Tensor:
    index = index.to(torch.int64)
    if index.numel() and (bool((index < 0).any()) or bool((index >= extent).any())):
        raise InputError(f"index out of range for an axis of extent {extent}")
    return index


def _take_along_axis(op, args, env, outs):
    x, idx = args
    dim = op.attrs["dim"] % x.dim()
    idx = _gather_index(idx, x.shape[dim])
    if op.name == "take_along_axis":  # input and index broadcast against each other
        return [torch.take_along_dim(x, idx, dim)]
    return [torch.gather(x, dim, idx)]


def _index_select(op, args, env, outs):
    x, idx = args
    dim = op.attrs["dim"] % x.dim()
    return [torch.index_select(x, dim, _gather_index(idx.reshape(-1), x.shape[dim]))]


def _linear(op, args, env, outs):
    bias = args[2] if op.attrs.get("has_bias") else None
    return [F.linear(args[0], args[1], bias).to(outs[0])]


def _triu(op, args, env, outs):
    return [torch.triu(args[0], op.attrs["diagonal"])]


def _select(op, args, env, outs):
    return [torch.select(args[0], op.attrs["dim"] % args[0].dim(), args[1])]


def _welford(op, args, env, outs):
    x = args[0]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    axes = list(reduction_axes(op.attrs | {"keepdim": False}, x.dim()))
    var, mean = torch.var_mean(x.to(ct), dim=axes, correction=0)
    n = math.prod(x.shape[a] for a in axes)
    count = torch.full(mean.shape, n, dtype=torch.int64, device=x.device)
    return [mean.to(outs[0]), (var * n).to(outs[1]), count]


def _matmul(op, args, env, outs):
    return [torch.matmul(args[0], args[1]).to(outs[0])]


_SPECIAL = {
    "broadcast_in_dim": _bid, "broadcast": _broadcast, "expand": _expand, "squeeze": _squeeze,
    "reshape": _reshape, "permute": _permute, "slice": _slice, "pad": _pad, "cat": _cat,
    "sum": _reduce, "max": _reduce, "min": _reduce, "prod": _reduce, "var": _var,
    "var_mean": _var, "full": _full, "iota": _iota, "uniform": _random, "normal": _random,
    "stride_order": _stride_order, "cumsum": _cumsum, "cumprod": _cumprod,
    "cummax": _cumextreme, "cummin": _cumextreme, "take_along_axis": _take_along_axis,
    "gather": _take_along_axis, "index_select": _index_select, "linear": _linear,
    "matmul": _matmul, "segment_set": lambda op, args, env, outs: [args[0]],
    "triu": _triu, "select": _select, "welford": _welford,
}

__all__ = ["run_reference", "run_op"]
