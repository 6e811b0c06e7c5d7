"""ATen ops as fusecut ops: one table, one emitter per op (Thunder's executors keep a table per
primitive too), and the check of which FX nodes a region may take.

AOTAutograd hands fusecut functional ATen graphs, decomposed by ``DECOMPOSITIONS`` into the
core ops below (layer norms into means and variances, GELU into ``erf`` or ``tanh``, softmax
into ``amax``, ``exp`` and ``sum``). Each emitter gets the definition's ops and the node's
arguments, already turned into handles (FX nodes), scalars (Python numbers) or left as they are
(lists of ints), and returns the node's result handles. Results are cast to the dtype ATen
gives the node, so that fusecut's promotion rules (nvFuser's) never change a value's type.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from fusecut.runtime.tensors import from_torch_dtype

aten = torch.ops.aten
prims = torch.ops.prims

# dtypes a region's tensors may have (fusecut's kernels and its torch reference both have them)
DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
          torch.bool}

Emitter = Callable[..., list[Any]]  # (ops, value, node) -> result handles


def _unary(name: str) -> Emitter:
    return lambda o, v, n: [getattr(o, name)(v(n.args[0]))]


def _binary(name: str) -> Emitter:
    return lambda o, v, n: [getattr(o, name)(v(n.args[0]), v(n.args[1]))]


def _with_alpha(name: str) -> Emitter:
    """add/sub with ``alpha``: a + alpha * b."""
    def emit(o, v, n):
        b = v(n.args[1])
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1:
            b = o.mul(b, v(alpha))
        return [getattr(o, name)(v(n.args[0]), b)]
    return emit


def _reduction(name: str) -> Emitter:
    """sum/amax/amin(x, dims, keepdim)."""
    def emit(o, v, n):
        x = n.args[0]
        dims = _dims(n.args[1] if len(n.args) > 1 else None, x)
        keepdim = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        return [getattr(o, name)(v(x), dims, keepdim)]
    return emit


def _mean(o, v, n):
    x = n.args[0]
    dims = _dims(n.args[1] if len(n.args) > 1 else None, x)
    keepdim = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
    count = 1
    for d in dims:
        count *= _shape(x)[d]
    total = o.sum(v(x), dims, keepdim)
    return [o.div(total, v(float(count)))]


def _variance(name: str) -> Emitter:
    """var/var_mean(x, dims, correction=, keepdim=)."""
    def emit(o, v, n):
        x = n.args[0]
        dims = _dims(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"), x)
        correction = n.kwargs.get("correction", 1)
        result = getattr(o, name)(v(x), dims, 1 if correction is None else correction,
                                  n.kwargs.get("keepdim", False))
        return list(result) if isinstance(result, tuple) else [result]
    return emit


def _cast(o, v, n):
    dtype = n.args[1] if n.target is prims.convert_element_type.default else n.kwargs["dtype"]
    return [o.cast(v(n.args[0]), from_torch_dtype(dtype))]


def _reshape(o, v, n):
    """A reshape that only drops or adds extent-1 axes is a squeeze and a broadcast: those a
    reduction's kernel takes, where a reshape (which moves values between index spaces) must
    be written out before it (a [1, rows, classes] to [rows, classes] view of a softmax's input
    cost a float32 copy of it)."""
    shape, out, x = list(_shape(n.args[0])), list(_shape(n)), v(n.args[0])
    if shape == out:
        return [o.set(x)]
    if [e for e in shape if e != 1] != [e for e in out if e != 1]:
        return [o.reshape(x, out)]
    ones = [i for i, e in enumerate(shape) if e == 1]
    if ones:
        x = o.squeeze(x, ones)
    if 1 in out:
        x = o.broadcast_in_dim(x, out, [i for i, e in enumerate(out) if e != 1])
    return [x]


def _expand(o, v, n):
    x = n.args[0]
    out, rank = list(_shape(n)), len(_shape(x))
    lead = len(out) - rank  # expand adds leading axes
    return [o.broadcast_in_dim(v(x), out, list(range(lead, len(out))))]


def _unsqueeze(o, v, n):
    x, dim = n.args[0], n.args[1]
    out = list(_shape(n))
    dim = dim % len(out)
    return [o.broadcast_in_dim(v(x), out, [i for i in range(len(out)) if i != dim])]


def _squeeze(o, v, n):
    x = n.args[0]
    shape = _shape(x)
    dims = n.args[1] if len(n.args) > 1 else [i for i, e in enumerate(shape) if e == 1]
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [d % len(shape) for d in dims if shape[d % len(shape)] == 1]  # ATen skips others
    return [o.squeeze(v(x), dims)] if dims else [o.set(v(x))]


def _transpose(o, v, n):
    x = n.args[0]
    rank = len(_shape(x))
    order = list(range(rank))
    if n.target is not aten.t.default:
        a, b = n.args[1] % rank, n.args[2] % rank
        order[a], order[b] = order[b], order[a]
    else:
        order.reverse()
    return [o.permute(v(x), order)]


def _slice(o, v, n):
    x = n.args[0]
    shape = _shape(x)
    dim = (n.args[1] if len(n.args) > 1 else 0) % len(shape)
    start = n.args[2] if len(n.args) > 2 and n.args[2] is not None else 0
    end = n.args[3] if len(n.args) > 3 and n.args[3] is not None else shape[dim]
    step = n.args[4] if len(n.args) > 4 else 1
    start, end, _ = slice(start, end).indices(shape[dim])
    starts = [start if i == dim else 0 for i in range(len(shape))]
    ends = [max(end, start) if i == dim else e for i, e in enumerate(shape)]
    strides = [step if i == dim else 1 for i in range(len(shape))]
    return [o.slice(v(x), starts, ends, strides)]


def _where(o, v, n):
    return [o.where(v(n.args[0]), v(n.args[1]), v(n.args[2]))]


def _clamp(o, v, n):
    x = v(n.args[0])
    low = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    high = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    if low is not None:
        x = o.maximum(x, v(low))
    if high is not None:
        x = o.minimum(x, v(high))
    return [x]


def _copy(o, v, n):
    return [o.set(v(n.args[0]))]


def _cat(o, v, n):
    tensors = [t for t in n.args[0] if _shape(t) != (0,)]  # ATen's legacy empty operands
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    return [o.cat([v(t) for t in tensors], dim % len(_shape(n)))]


def _gather(o, v, n):
    """``gather(x, dim, index)``: where ``index`` spans ``x`` but along ``dim``, a
    take-along-axis (a cross-entropy's pick of each row's target: it runs inside the row's
    reduction kernel, so the log-probabilities are never written)."""
    x, dim, index = n.args[0], n.args[1] % len(_shape(n.args[0])), n.args[2]
    same = all(a == b for i, (a, b) in enumerate(zip(_shape(x), _shape(index))) if i != dim)
    return [(o.take_along_axis if same else o.gather)(v(x), v(index), dim)]


def _one_position_per_row(n: Node) -> bool:
    """A ``scatter`` of one value to one position per row (``index`` of extent 1 along ``dim``,
    spanning ``x`` elsewhere): a cross-entropy's one-hot target in its backward."""
    x, dim, index = n.args[0], n.args[1], n.args[2]
    shape, rank = _shape(x), len(_shape(x))
    if len(_shape(index)) != rank or not isinstance(n.args[3], (int, float)) or n.kwargs:
        return False
    dim %= rank
    return all((e == 1) if i == dim else (e == shape[i]) for i, e in enumerate(_shape(index)))


def _scatter_value(o, v, n):
    """``scatter(x, dim, index, value)`` as ``where(position == index, value, x)``: an iota
    along ``dim`` against the row's index, pointwise (fusecut's scatter has no kernel)."""
    x, dim, index, value = n.args[0], n.args[1] % len(_shape(n.args[0])), n.args[2], n.args[3]
    shape, rank = list(_shape(x)), len(_shape(x))
    dtype = from_torch_dtype(index.meta["val"].dtype)
    positions = o.broadcast_in_dim(o.iota(v(shape[dim]), v(0), v(1), dtype), shape, [dim])
    others = [i for i in range(rank) if i != dim]
    targets = o.broadcast_in_dim(o.squeeze(v(index), [dim]), shape, others)
    return [o.where(o.eq(positions, targets), v(value), v(x))]


def _full(o, v, n):
    value = n.args[1] if len(n.args) > 1 else n.args[0]  # full(size, v) / scalar_tensor(v)
    return [o.full(list(_shape(n)), v(value), from_torch_dtype(n.meta["val"].dtype))]


def _constant_pad(o, v, n):
    widths = list(n.args[1])  # innermost axis first, (before, after) pairs: as fusecut's pad
    value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
    if not n.meta["val"].dtype.is_floating_point:  # ATen's Scalar -100.0 for int64 labels
        value = int(value)
    return [o.pad(v(n.args[0]), widths, v(value))]


def _slice_bounds(n: Node) -> tuple[int, int, int]:
    """``slice_scatter``'s (dim, start, end) in range, as ATen clamps them."""
    shape = _shape(n.args[0])
    args = list(n.args[2:]) + [None] * 3
    dim = (args[0] if args[0] is not None else n.kwargs.get("dim", 0)) % len(shape)
    start = args[1] if args[1] is not None else n.kwargs.get("start")
    end = args[2] if args[2] is not None else n.kwargs.get("end")
    size = shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    return dim, min(max(start, 0), size), min(max(end, 0), size)


def _slice_scatter(o, v, n):
    """``slice_scatter(x, src, dim, start, end)`` (a slice's gradient: RoPE's halves in a
    backward) as ``where(start <= position < end, pad(src), x)``: pointwise, where ATen clones
    ``x`` and copies ``src`` into it (two kernels and a full write each)."""
    x, src = n.args[0], n.args[1]
    dim, start, end = _slice_bounds(n)
    shape, rank = list(_shape(x)), len(_shape(x))
    widths = [w for axis in reversed(range(dim, rank))
              for w in ((start, shape[dim] - end) if axis == dim else (0, 0))]
    padded = o.pad(v(src), widths, v(0.0 if n.meta["val"].dtype.is_floating_point else 0))
    positions = o.broadcast_in_dim(o.iota(v(shape[dim]), v(0), v(1), from_torch_dtype(
        torch.int64)), shape, [dim])
    inside = o.logical_and(o.ge(positions, v(start)), o.lt(positions, v(end)))
    return [o.where(inside, padded, v(x))]


def _getitem(o, v, n):
    return [v(n.args[0])[n.args[1]]]


EMITTERS: dict[Any, Emitter] = {
    **{getattr(aten, name).default: _unary(name) for name in (
        "abs", "neg", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
        "reciprocal", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan",
        "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sigmoid", "relu", "floor", "ceil",
        "trunc", "sign", "isnan", "isinf", "logical_not", "bitwise_not", "lgamma", "digamma",
        "exp2", "frac", "silu")},
    aten.isfinite.default: _unary("isfinite"),
    aten.round.default: _unary("round"),
    aten.add.Tensor: _with_alpha("add"), aten.sub.Tensor: _with_alpha("sub"),
    aten.mul.Tensor: _binary("mul"), aten.div.Tensor: _binary("div"),
    aten.mul.Scalar: _binary("mul"), aten.div.Scalar: _binary("div"),
    aten.add.Scalar: _with_alpha("add"), aten.sub.Scalar: _with_alpha("sub"),
    aten.pow.Tensor_Scalar: _binary("pow"), aten.pow.Tensor_Tensor: _binary("pow"),
    aten.maximum.default: _binary("maximum"), aten.minimum.default: _binary("minimum"),
    aten.atan2.default: _binary("atan2"), aten.fmod.Tensor: _binary("fmod"),
    aten.remainder.Tensor: _binary("remainder"),
    **{getattr(aten, name).Tensor: _binary(name) for name in ("eq", "ne", "lt", "le", "gt",
                                                              "ge")},
    **{getattr(aten, name).Scalar: _binary(name) for name in ("eq", "ne", "lt", "le", "gt",
                                                              "ge")},
    **{getattr(aten, name).default: _binary(name) for name in (
        "logical_and", "logical_or", "logical_xor")},
    **{getattr(aten, name).Tensor: _binary(name) for name in (
        "bitwise_and", "bitwise_or", "bitwise_xor")},
    aten.where.self: _where,
    aten.clamp.default: _clamp,
    aten.sum.dim_IntList: _reduction("sum"), aten.amax.default: _reduction("max"),
    aten.amin.default: _reduction("min"), aten.mean.dim: _mean,
    aten.var.correction: _variance("var"), aten.var_mean.correction: _variance("var_mean"),
    prims.convert_element_type.default: _cast, aten._to_copy.default: _cast,
    aten.view.default: _reshape, aten._unsafe_view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.permute.default: lambda o, v, n: [o.permute(v(n.args[0]), list(n.args[1]))],
    aten.transpose.int: _transpose, aten.t.default: _transpose,
    aten.expand.default: _expand, aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze, aten.squeeze.default: _squeeze,
    aten.slice.Tensor: _slice, aten.cat.default: _cat,
    aten.clone.default: _copy, aten.alias.default: _copy,
    aten.gather.default: _gather, aten.scatter.value: _scatter_value,
    aten.slice_scatter.default: _slice_scatter,
    aten.full.default: _full, aten.full_like.default: _full,
    aten.scalar_tensor.default: _full, aten.constant_pad_nd.default: _constant_pad,
    operator.getitem: _getitem,
}

# ops whose 16-bit float result stays 16-bit where a region computes in float32
# (regions.translate): the graph's own casts, whose rounding is their point, and factories,
# whose constant ATen gives at that precision
ROUNDING = {prims.convert_element_type.default, aten._to_copy.default, aten.full.default,
            aten.full_like.default, aten.scalar_tensor.default}

# ops that see a value's last bit (an equality does, through later roundings too): a 16-bit
# result they read, directly or through other ops, keeps its rounding in a region computing in
# float32 (regions.translate), as in the Thunder executor (thunder.layout._COMPARING)
COMPARING = {*(getattr(aten, name).Tensor for name in ("eq", "ne", "lt", "le", "gt", "ge")),
             *(getattr(aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge")),
             aten.amax.default, aten.amin.default, aten.maximum.default, aten.minimum.default,
             aten.clamp.default}

# ops that only view their input: a region of views alone is not worth a kernel
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
         aten.permute.default, aten.transpose.int, aten.t.default, aten.expand.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
         aten.alias.default, operator.getitem}


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.meta["val"].shape)


def _dims(dims: Any, x: Node) -> list[int]:
    rank = len(_shape(x))
    if dims is None or dims == []:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted(d % rank for d in dims)


def _tensor_ok(value: Any) -> bool:
    """A strided tensor of a dtype regions take; its extents may be symbolic (``dynamic=True``:
    a region is then translated per concrete shape, when it runs)."""
    return (isinstance(value, torch.Tensor) and value.dtype in DTYPES
            and value.layout == torch.strided)


def _argument_ok(a: Any) -> bool:
    """Nodes of tensors or of (symbolic) integers, numbers, and lists of those."""
    if isinstance(a, Node):
        val = a.meta.get("val")
        return (_tensor_ok(val) or (isinstance(val, tuple) and all(map(_tensor_ok, val)))
                or isinstance(val, (int, torch.SymInt)))
    if isinstance(a, (list, tuple)):
        return all(_argument_ok(x) for x in a)
    return a is None or isinstance(a, (bool, int, float, torch.dtype, torch.memory_format,
                                       torch.layout, torch.device))


CAST_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def is_plain_cast(node: Node) -> bool:
    """A dtype conversion alone: ``convert_element_type``, or a ``_to_copy`` to a dtype that
    keeps the device and the strided layout. A memory format only sets the result's strides,
    which a region hands back as the trace gave them (LayerNorm's backward casts with
    contiguous_format)."""
    if node.op != "call_function":
        return False
    if node.target is prims.convert_element_type.default:
        return True
    if node.target is not aten._to_copy.default or len(node.args) != 1:
        return False
    kwargs, val = node.kwargs, node.args[0].meta.get("val")
    return set(kwargs) <= {"dtype", "layout", "device", "memory_format"} \
        and "dtype" in kwargs and kwargs.get("memory_format") in CAST_FORMATS \
        and kwargs.get("layout") in (None, torch.strided) and isinstance(val, torch.Tensor) \
        and torch.device(kwargs.get("device") or val.device) == val.device


def _special_ok(node: Node) -> bool:
    """What an emitter cannot take, by op."""
    target = node.target
    if target is aten.div.Tensor:
        return node.kwargs.get("rounding_mode") is None
    if target is aten._to_copy.default:
        return is_plain_cast(node)
    if target in (aten.round.default,):
        return not node.kwargs
    if target is aten.clamp.default:
        return any(x is not None for x in (list(node.args[1:]) + list(node.kwargs.values())))
    if target is aten.cat.default:
        return len(node.args[0]) > 0
    if target is aten.gather.default:
        return not node.kwargs.get("sparse_grad", False)
    if target is aten.scatter.value:
        return _one_position_per_row(node)
    if target in (aten.full.default, aten.full_like.default, aten.scalar_tensor.default):
        return node.kwargs.get("layout") in (None, torch.strided)
    if target is aten.slice_scatter.default:  # a step of 1, into a non-empty slice
        step = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
        dim, start, end = _slice_bounds(node)
        return step == 1 and start < end and _shape(node.args[1]) == tuple(
            (end - start) if i == dim else e for i, e in enumerate(_shape(node.args[0])))
    if target is aten.constant_pad_nd.default:  # growing pads (a negative one is a slice)
        return all(isinstance(w, int) and w >= 0 for w in node.args[1])
    return True


def translatable(node: Node) -> bool:
    """Whether ``node`` can be emitted into a fusecut region."""
    if node.op != "call_function" or node.target not in EMITTERS:
        return False
    val = node.meta.get("val")
    if node.target is operator.getitem:
        return _tensor_ok(val) and _argument_ok(node.args[0])
    if not (_tensor_ok(val) or (isinstance(val, tuple) and all(map(_tensor_ok, val)))):
        return False
    if not all(_argument_ok(a) for a in list(node.args) + list(node.kwargs.values())):
        return False
    if node.target in (aten.pow.Tensor_Scalar,) and isinstance(node.args[1], bool):
        return False
    return _special_ok(node)
