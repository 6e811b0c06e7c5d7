"""Reductions, factories, gathers, library ops (matmul, linear) and host scalar ops (size)."""

from __future__ import annotations

import math

from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import TensorValue
from fusecut.optimizer.ir.opspec import (
    OpClass,
    OpSpec,
    OutSig,
    Param,
    broadcast_shapes,
    check_extent,
    eval_shape_list,
    norm_axes,
    norm_axis,
    register,
)


def _tensor(v, what: str = "operand") -> TensorValue:
    if not isinstance(v, TensorValue):
        raise DefinitionError(f"{what} must be a tensor, {v.name} is a scalar")
    return v


# ---- reductions --------------------------------------------------------------------------------


def reduction_axes(attrs, rank: int) -> tuple[int, ...]:
    """The axes a reduction reduces (all of them when ``dims`` is not given)."""
    dims = attrs["dims"]
    return tuple(range(rank)) if dims is None else norm_axes(list(dims), rank,
                                                             nvfuser="reduction", zero_d=False)


def _reduced_flags(arg: TensorValue, attrs) -> tuple[bool, ...]:
    axes = reduction_axes(attrs, arg.rank)
    if attrs["keepdim"]:
        return tuple(True if i in axes else b for i, b in enumerate(arg.broadcast))
    return tuple(b for i, b in enumerate(arg.broadcast) if i not in axes)


def _reduction_infer(kind: str):
    def infer(ins, attrs):
        arg = _tensor(ins[0])
        dtype = attrs.get("dtype")
        if kind in ("max", "min") and arg.dtype.is_complex:  # complex values have no order
            raise DefinitionError(f"{kind} is not supported for {arg.dtype.value} operands")
        if dtype is None:
            dtype = arg.dtype
            if kind in ("sum", "prod") and not (arg.dtype.is_float or arg.dtype.is_complex):
                dtype = DType.int64
        return [OutSig(dtype, _reduced_flags(arg, attrs))]

    return infer


def _reduced_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    axes = reduction_axes(attrs, len(src))
    if attrs["keepdim"]:
        return [tuple(1 if i in axes else e for i, e in enumerate(src))]
    return [tuple(e for i, e in enumerate(src) if i not in axes)]


_REDUCE_PARAMS = (Param("arg", "T"), Param("dims", "IL?", None, aliases=("axes", "axis", "dim")),
                  Param("keepdim", "B", False), Param("dtype", "DT", None))
for _kind in ("sum", "max", "min", "prod"):
    register(OpSpec(_kind, _REDUCE_PARAMS, OpClass.REDUCTION, _reduction_infer(_kind),
                    _reduced_shape, cost=1))


def _var_infer(n_out: int):
    def infer(ins, attrs):
        arg = _tensor(ins[0])
        flags = _reduced_flags(arg, attrs)
        if arg.dtype.is_complex:  # the variance of complex values is real, their mean complex
            real = DType.float64 if arg.dtype is DType.complex128 else DType.float32
            return [OutSig(real, flags), OutSig(arg.dtype, flags)][:n_out]
        dtype = arg.dtype if arg.dtype.is_float else DType.float32
        return [OutSig(dtype, flags)] * n_out

    return infer


_VAR_PARAMS = (Param("arg", "T"), Param("dims", "IL?", None, aliases=("axes", "axis", "dim")),
               Param("correction", "N", 1), Param("keepdim", "B", False))
register(OpSpec("var", _VAR_PARAMS, OpClass.REDUCTION, _var_infer(1), _reduced_shape, cost=3))
register(OpSpec("var_mean", _VAR_PARAMS, OpClass.REDUCTION, _var_infer(2),
                lambda s, a, ev: _reduced_shape(s, a, ev) * 2, n_outputs=2, cost=3))


# ---- factories ---------------------------------------------------------------------------------


def _full_infer(ins, attrs):
    if attrs["dtype"] is None:
        raise DefinitionError("full needs a dtype")
    return [OutSig(attrs["dtype"], tuple(False for _ in attrs["shape"]))]


register(OpSpec("full", (Param("shape", "SH", aliases=("size",)),
                         Param("fill_value", "S", aliases=("arg",)), Param("dtype", "DT")),
                OpClass.FACTORY, _full_infer,
                lambda s, a, ev: [tuple(eval_shape_list(a["shape"], ev, "shape"))], cost=0))


def _iota_infer(ins, attrs):
    dtype = attrs["dtype"] or DType.int64
    if dtype.is_bool or dtype.is_complex:
        raise DefinitionError(f"iota cannot produce {dtype.value}")
    if not ins[0].dtype.is_int:
        raise DefinitionError(f"iota: length must be integer, but {ins[0].name} is "
                              f"{ins[0].dtype.value}")
    present = [p for p in ("start", "step") if attrs.get(f"has_{p}")]
    for what, v in zip(present, ins[1:]):
        if v.dtype.is_complex or v.dtype.is_int != dtype.is_int or \
                v.dtype.is_float != dtype.is_float:
            raise DefinitionError(f"iota: {what} dtype does not match specified dtype "
                                  f"argument, should be {dtype.value} but {v.name} is "
                                  f"{v.dtype.value}")
    return [OutSig(dtype, (False,))]


def _iota_shape(in_shapes, attrs, ev):
    present = [p for p in ("start", "step") if attrs.get(f"has_{p}")]
    values = {p: ev.operand(1 + k) for k, p in enumerate(present)}
    for v in values.values():
        if isinstance(v, float) and not math.isfinite(v):
            raise InputError("iota: length, start, step must be finite numbers.")
    if values.get("step", 1) == 0:
        raise InputError("iota: step value must not equal zero.")
    return [(check_extent(ev.operand(0), "iota length"),)]


register(OpSpec("iota", (Param("length", "S"), Param("start", "S?", None),
                         Param("step", "S?", None), Param("dtype", "DT", DType.int64)),
                OpClass.FACTORY, _iota_infer, _iota_shape, cost=1))


# ---- gathers -----------------------------------------------------------------------------------


def _index_tensor(v) -> TensorValue:
    t = _tensor(v, "index")
    if not t.dtype.is_int:
        raise DefinitionError(f"index {t.name} must be an integer tensor, got {t.dtype.value}")
    return t


def _take_infer(ins, attrs):
    arg, index = _tensor(ins[0]), _index_tensor(ins[1])
    if arg.rank != index.rank:
        raise DefinitionError(f"{arg.name} has rank {arg.rank} but index {index.name} has rank "
                              f"{index.rank}")
    norm_axis(attrs["dim"], arg.rank, nvfuser="gather", zero_d=False)
    return [OutSig(arg.dtype, tuple(False for _ in range(arg.rank)))]


def _take_shape(exact: bool):
    """take_along_axis (``exact``) broadcasts its input and index against each other on the
    axes other than ``dim``, as torch.take_along_dim and nvFuser's takeAlongAxis do (an index
    of extent 1 takes the input's extent, an input of extent 1 the index's); gather takes the
    index's extents, at most the input's."""
    def shape(in_shapes, attrs, ev):
        src, idx = in_shapes[0], in_shapes[1]
        dim = attrs["dim"] % len(src)
        out = list(idx)
        for i, (e, j) in enumerate(zip(src, idx)):
            if i == dim:
                continue
            if exact and e != j:
                if j != 1 and e != 1:
                    raise InputError(f"index axis {i} has extent {j}; it must equal the input's "
                                     f"extent {e} or either must be 1 (broadcast)")
                out[i] = e if j == 1 else j
            elif j > e:
                raise InputError(f"index axis {i} has extent {j}; it must be at most the "
                                 f"input's extent {e}")
        return [tuple(out)]

    return shape


_TAKE_PARAMS = (Param("arg", "T", aliases=("arg1",)), Param("index", "T"), Param("dim", "I"))
register(OpSpec("take_along_axis", _TAKE_PARAMS, OpClass.GATHER, _take_infer, _take_shape(True)))
register(OpSpec("gather", _TAKE_PARAMS, OpClass.GATHER, _take_infer, _take_shape(False)))


def _index_select_infer(ins, attrs):
    arg, index = _tensor(ins[0]), _index_tensor(ins[1])
    if index.rank > 1:
        raise DefinitionError(f"index_select index {index.name} must have rank 0 or 1, "
                              f"got {index.rank}")
    dim = norm_axis(attrs["dim"], arg.rank, zero_d=False)
    flags = tuple(False if i == dim else b for i, b in enumerate(arg.broadcast))
    return [OutSig(arg.dtype, flags)]


def _index_select_shape(in_shapes, attrs, ev):
    src, idx = in_shapes[0], in_shapes[1]
    dim = attrs["dim"] % len(src)
    n = idx[0] if idx else 1
    return [tuple(n if i == dim else e for i, e in enumerate(src))]


register(OpSpec("index_select", (Param("arg", "T"), Param("index", "T"), Param("dim", "I")),
                OpClass.GATHER, _index_select_infer, _index_select_shape))


# ---- library ops (cuBLAS through torch) -------------------------------------------------------


def _same_float(a: TensorValue, b: TensorValue, op: str) -> DType:
    if a.dtype != b.dtype:
        raise DefinitionError(f"{op} operands must share a dtype: {a.name} is {a.dtype.value}, "
                              f"{b.name} is {b.dtype.value}")
    if not a.dtype.is_float:
        raise DefinitionError(f"{op} needs floating-point operands, got {a.dtype.value}")
    return a.dtype


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """torch.matmul's result shape, with a clear error on mismatched inner extents."""
    if not a or not b:
        raise InputError("matmul operands must have rank >= 1")
    k_a = a[-1]
    k_b = b[0] if len(b) == 1 else b[-2]
    if k_a != k_b:
        raise InputError(f"matmul inner extents differ: {k_a} vs {k_b}")
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(b) == 1:
        return a[:-1]
    if len(a) == 1:
        return b[:-2] + b[-1:]
    batch = broadcast_shapes([a[:-2], b[:-2]], ["operand 0 batch", "operand 1 batch"])
    return batch + (a[-2], b[-1])


def _matmul_infer(ins, attrs):
    a, b = _tensor(ins[0]), _tensor(ins[1])
    dtype = _same_float(a, b, "matmul")
    rank = len(matmul_shape(tuple([2] * a.rank), tuple([2] * b.rank)))
    return [OutSig(dtype, tuple(False for _ in range(rank)))]


register(OpSpec("matmul", (Param("arg1", "T"), Param("arg2", "T")), OpClass.LIBRARY,
                _matmul_infer, lambda s, a, ev: [matmul_shape(s[0], s[1])], cost=0))


def _linear_infer(ins, attrs):
    a, w = _tensor(ins[0]), _tensor(ins[1])
    dtype = _same_float(a, w, "linear")
    if w.rank not in (1, 2):
        raise DefinitionError(f"linear weight {w.name} must have rank 1 or 2, got {w.rank}")
    if a.rank < 1:
        raise DefinitionError(f"Input A must be at least 1D: linear input {a.name} is 0-d (it "
                              f"needs a feature axis)")
    if len(ins) > 2:
        _same_float(a, _tensor(ins[2], "bias"), "linear")
    rank = a.rank - 1 + (1 if w.rank == 2 else 0)
    return [OutSig(dtype, tuple(False for _ in range(rank)))]


def _linear_shape(in_shapes, attrs, ev):
    a, w = in_shapes[0], in_shapes[1]
    if a[-1] != w[-1]:
        raise InputError(f"linear: input has {a[-1]} features but the weight expects {w[-1]}")
    out = a[:-1] + (w[:1] if len(w) == 2 else ())
    if len(in_shapes) > 2:
        broadcast_shapes([out, in_shapes[2]], ["linear output", "bias"])
    return [out]


register(OpSpec("linear", (Param("arg1", "T", aliases=("input",)),
                           Param("arg2", "T", aliases=("weight",)),
                           Param("bias", "T?", None)),
                OpClass.LIBRARY, _linear_infer, _linear_shape, cost=0))


# ---- host scalar ops ---------------------------------------------------------------------------


def _size_infer(ins, attrs):
    arg = _tensor(ins[0])
    norm_axis(attrs["dim"], arg.rank, zero_d=False)
    return [OutSig(DType.int64, None)]


register(OpSpec("size", (Param("arg", "T"), Param("dim", "I")), OpClass.SCALAR, _size_infer,
                lambda s, a, ev: [()], cost=0))


# ---- random numbers ----------------------------------------------------------------------------
# uniform(minval, maxval, shape) and normal(mean, std, shape), with nvFuser's optional rng_seed and
# rng_offset scalar operands: pointwise factories, computed in generated kernels from Philox
# counters (codegen.rng), so a value depends only on (seed, offset, element index).


def _rng_infer(ins, attrs):
    dtype = attrs["dtype"] or DType.float32
    if dtype not in (DType.float16, DType.bfloat16, DType.float32, DType.float64):
        raise DefinitionError(f"Random distributions only create floating point types: random "
                              f"numbers must be float16, bfloat16, float32 or float64, "
                              f"got {dtype.value}")
    for v in ins:
        if isinstance(v, TensorValue):
            raise DefinitionError(f"{v.name}: the parameters of a random op are scalars")
    for v, what in zip(ins[2:], [p for p in ("rng_seed", "rng_offset") if attrs[f"has_{p}"]]):
        if not v.dtype.is_int:
            raise DefinitionError(f"{what} {v.name} must be an integer scalar, got {v.dtype.value}")
    return [OutSig(dtype, tuple(False for _ in attrs["shape"]))]


for _name, _a, _b in (("uniform", "minval", "maxval"), ("normal", "mean", "std")):
    register(OpSpec(_name, (Param(_a, "S"), Param(_b, "S"), Param("shape", "SH", aliases=("size",)),
                            Param("dtype", "DT", DType.float32), Param("rng_seed", "S?", None),
                            Param("rng_offset", "S?", None)),
                    OpClass.FACTORY, _rng_infer,
                    lambda s, a, ev: [tuple(eval_shape_list(a["shape"], ev, "shape"))], cost=8))


# ---- layout and scans (fallback segments) -------------------------------------------------------


def _stride_order_infer(ins, attrs):
    arg = _tensor(ins[0])
    if sorted(attrs["stride_order"]) != list(range(arg.rank)):
        raise DefinitionError(f"stride_order {attrs['stride_order']} is not a permutation of "
                              f"range({arg.rank})")
    return [OutSig(arg.dtype, arg.broadcast)]


register(OpSpec("stride_order", (Param("arg", "T"), Param("stride_order", "IL")),
                OpClass.POINTWISE, _stride_order_infer, lambda s, a, ev: [s[0]], cost=0))


def _scan_infer(name: str):
    """cumsum and cumprod (integers accumulate in int64, as torch's), cummax and cummin (the
    values only, in the operand's dtype, as nvFuser returns them)."""

    def infer(ins, attrs):
        arg = _tensor(ins[0])
        if arg.rank == 0:  # nvFuser scans an axis: a 0-d tensor has none
            raise DefinitionError(f"Tried to access out of boundary index {attrs['dim']}. total "
                                  f"index: 0 ({name} of the 0-d tensor {arg.name})")
        norm_axis(attrs["dim"], arg.rank)
        if name in ("cummax", "cummin"):
            if arg.dtype.is_complex:
                raise DefinitionError(f"{name} is not supported for {arg.dtype.value} operands")
            return [OutSig(arg.dtype, arg.broadcast)]
        keep = arg.dtype.is_float or arg.dtype.is_complex
        return [OutSig(arg.dtype if keep else DType.int64, arg.broadcast)]

    return infer


for _scan in ("cumsum", "cumprod", "cummax", "cummin"):
    register(OpSpec(_scan, (Param("arg", "T"), Param("dim", "I")), OpClass.POINTWISE,
                    _scan_infer(_scan), lambda s, a, ev: [s[0]], cost=1))


# ---- nvFuser ops without a generated kernel (fallback segments through the torch reference) ----


def _triu_infer(ins, attrs):
    arg = _tensor(ins[0])
    if arg.rank < 2:
        raise DefinitionError(f"input tensor for triu must have 2 or more dims, but got "
                              f"{arg.rank} dims ({arg.name})")
    return [OutSig(arg.dtype, arg.broadcast[:-2] + (False, False))]


register(OpSpec("triu", (Param("input", "T", aliases=("arg",)), Param("diagonal", "I", 0)),
                OpClass.FALLBACK, _triu_infer, lambda s, a, ev: [s[0]], cost=1))


def _select_infer(ins, attrs):
    arg = _tensor(ins[0])
    if not ins[1].dtype.is_int:
        raise DefinitionError(f"select index {ins[1].name} must be an integer scalar, got "
                              f"{ins[1].dtype.value}")
    dim = norm_axis(attrs["dim"], arg.rank, zero_d=False)
    return [OutSig(arg.dtype, tuple(b for i, b in enumerate(arg.broadcast) if i != dim))]


def _select_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    dim = attrs["dim"] % len(src)
    index = ev.operand(1)
    if not -src[dim] <= index < src[dim]:
        raise InputError(f"select index {index} is out of range for axis {dim} of extent "
                         f"{src[dim]}")
    return [tuple(e for i, e in enumerate(src) if i != dim)]


register(OpSpec("select", (Param("arg", "T"), Param("index", "S"), Param("dim", "I")),
                OpClass.FALLBACK, _select_infer, _select_shape, cost=0))


def _welford_infer(ins, attrs):
    arg = _tensor(ins[0])
    flags = _reduced_flags(arg, {**attrs, "keepdim": False})
    dtype = arg.dtype if arg.dtype.is_float else DType.float32
    return [OutSig(dtype, flags), OutSig(dtype, flags), OutSig(DType.int64, flags)]


register(OpSpec("welford", (Param("arg", "T"), Param("dims", "IL")), OpClass.FALLBACK,
                _welford_infer,
                lambda s, a, ev: _reduced_shape(s, {**a, "keepdim": False}, ev) * 3,
                n_outputs=3, cost=3))
