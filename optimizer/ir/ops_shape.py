"""Ops that change a tensor's shape but not its values: broadcasts, squeeze, permute, reshape,
and the resize ops slice, pad and cat (nvFuser semantics; pad widths are innermost-first pairs)."""

from __future__ import annotations

import math

from fusecut.optimizer.errors import DefinitionError, InputError, counted
from fusecut.optimizer.ir.fusion import TensorValue
from fusecut.optimizer.ir.opspec import (
    OpClass,
    OpSpec,
    OutSig,
    Param,
    check_extent,
    eval_shape_list,
    norm_axes,
    norm_axis,
    register,
)


def _arg(ins) -> TensorValue:
    arg = ins[0]
    if not isinstance(arg, TensorValue):
        raise DefinitionError(f"expects a tensor, {arg.name} is a scalar")
    return arg


# ---- broadcast_in_dim ------------------------------------------------------------------------


def _bid_infer(ins, attrs):
    arg = _arg(ins)
    shape, dims = attrs["shape"], list(attrs["broadcast_dims"])
    if len(shape) < arg.rank:
        raise DefinitionError(f"The new shape is expected to be greater-then-or-equal to the "
                              f"input: {len(shape)} output axes for {arg.name} of rank "
                              f"{arg.rank}")
    if len(dims) != arg.rank:
        raise DefinitionError(f"The broadcast dimensions should match the input dimensions: "
                              f"broadcast_dims {dims} has "
                              f"{counted(len(dims), 'entry', 'entries')} but {arg.name} has "
                              f"rank {arg.rank}")
    if any(not 0 <= d < len(shape) for d in dims) or any(a >= b for a, b in zip(dims, dims[1:])):
        raise DefinitionError(f"Invalid broadcast_dims value: broadcast_dims {dims} must be "
                              f"increasing positions in the output shape of rank {len(shape)}")
    out = [True] * len(shape)
    for i, d in enumerate(dims):
        out[d] = arg.broadcast[i]
    return [OutSig(arg.dtype, tuple(out))]


def _bid_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    out = eval_shape_list(attrs["shape"], ev, "shape")
    for i, d in enumerate(attrs["broadcast_dims"]):
        if src[i] not in (1, out[d]):
            raise InputError(f"input axis {i} has extent {src[i]}, which cannot broadcast to "
                             f"output axis {d} of extent {out[d]}")
    return [tuple(out)]


register(OpSpec("broadcast_in_dim",
                (Param("arg", "T"), Param("shape", "SH", aliases=("output_shape",)),
                 Param("broadcast_dims", "IL")),
                OpClass.BROADCAST, _bid_infer, _bid_shape, cost=0))


# ---- broadcast ---------------------------------------------------------------------------------


def _bcast_infer(ins, attrs):
    arg = _arg(ins)
    flags = list(attrs["is_broadcast_dim"])
    if flags.count(False) != arg.rank:
        raise DefinitionError(f"Invalid broadcast, number of false entries in is_broadcast_dim "
                              f"expected to be {arg.rank} (the rank of {arg.name}), "
                              f"is_broadcast_dim is {flags}")
    it = iter(arg.broadcast)
    return [OutSig(arg.dtype, tuple(True if f else next(it) for f in flags))]


def _bcast_shape(in_shapes, attrs, ev):
    it = iter(in_shapes[0])
    return [tuple(1 if f else next(it) for f in attrs["is_broadcast_dim"])]


register(OpSpec("broadcast", (Param("arg", "T"), Param("is_broadcast_dim", "BL")),
                OpClass.BROADCAST, _bcast_infer, _bcast_shape, cost=0))


# ---- expand ------------------------------------------------------------------------------------


def _expand_infer(ins, attrs):
    arg = _arg(ins)
    if len(attrs["shape"]) != arg.rank:
        raise DefinitionError(f"expand shape has {counted(len(attrs['shape']), 'entry', 'entries')}"
                              f" but {arg.name} has rank {arg.rank}")
    return [OutSig(arg.dtype, arg.broadcast)]


def _expand_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    out = []
    for i, (e, x) in enumerate(zip(src, attrs["shape"])):
        t = check_extent(ev(x), f"shape[{i}]")
        if t == -1:
            t = e
        if e not in (1, t):
            raise InputError(f"cannot expand axis {i} of extent {e} to {t}")
        out.append(t)
    return [tuple(out)]


register(OpSpec("expand", (Param("arg", "T"), Param("shape", "SH")), OpClass.BROADCAST,
                _expand_infer, _expand_shape, cost=0))


# ---- squeeze -----------------------------------------------------------------------------------


def _squeeze_infer(ins, attrs):
    arg = _arg(ins)
    if len(attrs["dims"]) > arg.rank:
        raise DefinitionError(f"The dims to squeeze must be <= the number of dims of the input "
                              f"tensor: {len(attrs['dims'])} dims for {arg.name} of rank "
                              f"{arg.rank}")
    for d in attrs["dims"]:
        if not -arg.rank <= d < arg.rank:
            raise DefinitionError(f"Squeeze dim is outside of Tensor size! dim {d} for "
                                  f"{arg.name} of rank {arg.rank}")
    dims = norm_axes(list(attrs["dims"]), arg.rank)
    return [OutSig(arg.dtype, tuple(b for i, b in enumerate(arg.broadcast) if i not in dims))]


def _squeeze_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    dims = norm_axes(list(attrs["dims"]), len(src))
    for d in dims:
        if src[d] != 1 and not attrs.get("squeeze_expanded"):
            raise InputError(f"cannot squeeze axis {d} of extent {src[d]} (only extent-1 axes, or "
                             f"expanded broadcasts with squeeze_expanded=True)")
    return [tuple(e for i, e in enumerate(src) if i not in dims)]


register(OpSpec("squeeze",
                (Param("arg", "T"), Param("dims", "IL"), Param("squeeze_expanded", "B", False),
                 Param("original_shape", "SH", None)),
                OpClass.SQUEEZE, _squeeze_infer, _squeeze_shape, cost=0,
                legacy={3: ("arg", "original_shape", "dims")}))


# ---- permute -----------------------------------------------------------------------------------


def _permute_infer(ins, attrs):
    arg = _arg(ins)
    if len(attrs["dims"]) != arg.rank:
        raise DefinitionError(f"permute: expects dims argument to have the same length as input "
                              f"({arg.name} has rank {arg.rank}), got {list(attrs['dims'])}")
    for d in attrs["dims"]:
        if not -arg.rank <= d < arg.rank:
            raise DefinitionError(f"permute: dims argument is out of range, expects >= "
                                  f"{-arg.rank} and < {arg.rank}, but got {d}")
    dims = [norm_axis(d, arg.rank) for d in attrs["dims"]]
    if sorted(dims) != list(range(arg.rank)):
        raise DefinitionError(f"permute: duplicated dimension entries in dims "
                              f"{list(attrs['dims'])}: not a permutation of "
                              f"{counted(arg.rank, 'axis', 'axes')}")
    return [OutSig(arg.dtype, tuple(arg.broadcast[d] for d in dims))]


def _permute_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    return [tuple(src[d % len(src)] for d in attrs["dims"])]


register(OpSpec("permute", (Param("arg", "T"), Param("dims", "IL")), OpClass.PERMUTE,
                _permute_infer, _permute_shape, cost=0))


# ---- reshape -----------------------------------------------------------------------------------


def _reshape_infer(ins, attrs):
    arg = _arg(ins)
    shape = attrs["new_shape"]
    if sum(1 for x in shape if x == -1) > 1:
        raise DefinitionError("A maximum of one value of -1 can be provided to reshape "
                              "(new_shape may infer at most one extent)")
    return [OutSig(arg.dtype, tuple(False for _ in shape))]


def _reshape_shape(in_shapes, attrs, ev):
    numel = math.prod(in_shapes[0])
    out = [check_extent(ev(x), f"new_shape[{i}]") for i, x in enumerate(attrs["new_shape"])]
    for i, e in enumerate(out):
        if e < -1:
            raise InputError(f"new_shape[{i}] is {e}; extents must be >= 0 (or -1 to infer)")
    known = math.prod(e for e in out if e != -1)
    if -1 in out:
        if known == 0 or numel % known:
            raise InputError(f"cannot reshape {numel} elements into {out} (Total element counts "
                             f"across view operation must match)")
        out[out.index(-1)] = numel // known
    elif known != numel:
        raise InputError(f"cannot reshape a tensor of shape {list(in_shapes[0])} ({numel} "
                         f"elements) into {out} ({known} elements): Total element counts across "
                         f"view operation must match")
    return [tuple(out)]


register(OpSpec("reshape",
                (Param("arg", "T"), Param("new_shape", "SH", aliases=("shape",)),
                 Param("original_shape", "SH", None)),
                OpClass.RESHAPE, _reshape_infer, _reshape_shape, cost=0,
                legacy={3: ("arg", "original_shape", "new_shape")}))


# ---- slice -------------------------------------------------------------------------------------


def _slice_infer(ins, attrs):
    arg = _arg(ins)
    starts, ends = attrs["start_indices"], attrs["end_indices"]
    strides = attrs["strides"] or [1] * arg.rank
    counts = (f"(rank {arg.rank}; got {len(starts)} starts, {len(ends)} ends, "
              f"{len(strides)} strides)")
    if len(starts) != len(strides):
        raise DefinitionError(f"Slice start_indices and strides don't match! {counts}")
    if len(starts) != len(ends):
        raise DefinitionError(f"Slice indexing attribute dimensions don't match! {counts}")
    if len(starts) != arg.rank:
        raise DefinitionError(f"Number of tensor dimensions does not match slice dimensions! "
                              f"{counts}")
    # nvFuser's frontends refuse constant indices that are negative or run backwards whatever
    # manual_normalization says (it decides how symbolic ones and ends past the extent are
    # taken); only symbolic indices are normalised Python-style
    for x, y in zip(starts, ends):
        if isinstance(x, int) and x < 0:
            raise DefinitionError(f"Slice operation start_indices must be greater than or equal "
                                  f"to 0. Start Indices: {list(starts)}")
        if isinstance(x, int) and isinstance(y, int) and y < x:
            raise DefinitionError(f"Slice operation end_indices must be greater than or equal "
                                  f"to start_indices. Start Indices: {list(starts)} End "
                                  f"Indices: {list(ends)}")
    if any(s < 1 for s in strides):
        raise DefinitionError(f"slice strides must be >= 1, got {list(strides)}")
    return [OutSig(arg.dtype, arg.broadcast)]


def slice_bounds(extent: int, start: int, end: int, manual: bool) -> tuple[int, int]:
    """Normalised [start, end) of a slice, Python-style unless manual_normalization is set."""
    if not manual:
        start = start + extent if start < 0 else start
        end = end + extent if end < 0 else end
        start = min(max(start, 0), extent)
        end = min(max(end, start), extent)
    elif not 0 <= start <= end <= extent:
        raise InputError(f"slice [{start}, {end}) is outside an axis of extent {extent}")
    return start, end


def _slice_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    strides = attrs["strides"] or [1] * len(src)
    out = []
    for i, e in enumerate(src):
        s = check_extent(ev(attrs["start_indices"][i]), f"start_indices[{i}]")
        t = check_extent(ev(attrs["end_indices"][i]), f"end_indices[{i}]")
        s, t = slice_bounds(e, s, t, attrs["manual_normalization"])
        out.append(-(-(t - s) // strides[i]))
    return [tuple(out)]


register(OpSpec("slice",
                (Param("arg", "T"), Param("start_indices", "SH"), Param("end_indices", "SH"),
                 Param("strides", "IL?", None), Param("manual_normalization", "B", False)),
                OpClass.RESIZE, _slice_infer, _slice_shape, cost=0))


# ---- pad ---------------------------------------------------------------------------------------


def _pad_infer(ins, attrs):
    arg = _arg(ins)
    widths = attrs["pad_widths"]
    if len(widths) > 2 * arg.rank:
        raise DefinitionError(f"Number of pad widths must be at most twice the input dimension: "
                              f"{len(widths)} pad widths for {arg.name} of rank {arg.rank} "
                              f"(innermost-first pairs)")
    if len(widths) % 2:
        raise DefinitionError(f"Invalid number of padding widths: {len(widths)} (pad widths "
                              f"come in innermost-first (left, right) pairs)")
    if len(ins) > 1 and (ins[1].dtype.category > arg.dtype.category
                         or ins[1].dtype.is_complex != arg.dtype.is_complex):
        raise DefinitionError(f"Tensor arg and pad value must have the same dtype: pad value "
                              f"{ins[1].name} ({ins[1].dtype.value}) does not fit {arg.name} "
                              f"({arg.dtype.value})")
    flags = list(arg.broadcast)
    for k in range(len(widths) // 2):
        flags[arg.rank - 1 - k] = False
    return [OutSig(arg.dtype, tuple(flags))]


def pad_widths_by_axis(rank: int, widths: list[int]) -> list[tuple[int, int]]:
    """Innermost-first (left, right) pairs -> one (left, right) pair per axis, outermost first."""
    per_axis = [(0, 0)] * rank
    for k in range(len(widths) // 2):
        per_axis[rank - 1 - k] = (widths[2 * k], widths[2 * k + 1])
    return per_axis


def _pad_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    widths = [check_extent(ev(w), f"pad_widths[{i}]") for i, w in enumerate(attrs["pad_widths"])]
    out = []
    for i, (e, (lo, hi)) in enumerate(zip(src, pad_widths_by_axis(len(src), widths))):
        if e + lo + hi < 0:
            raise InputError(f"Invalid resized domain extent: padding axis {i} of extent {e} by "
                             f"({lo}, {hi}) leaves a negative extent")
        out.append(e + lo + hi)
    return [tuple(out)]


register(OpSpec("pad", (Param("arg", "T"), Param("pad_widths", "SH"), Param("value", "S?", None)),
                OpClass.RESIZE, _pad_infer, _pad_shape, cost=0))


# ---- cat ---------------------------------------------------------------------------------------


def _cat_infer(ins, attrs):
    if not ins:
        raise DefinitionError("Attempting to concatenate empty list of tensors (cat needs at "
                              "least one)")
    tensors = [_arg([t]) for t in ins]
    rank, dtype = tensors[0].rank, tensors[0].dtype
    for t in tensors:
        if t.rank != rank:
            raise DefinitionError(f"Unexpected number of dimensions: cat operands must have one "
                                  f"rank: {tensors[0].name} has {rank}, {t.name} has {t.rank}")
        if t.dtype != dtype:
            raise DefinitionError(f"cat operands must have one dtype: {tensors[0].name} is "
                                  f"{dtype.value}, {t.name} is {t.dtype.value}")
    if not -rank <= attrs["dim"] < rank:  # a 0-d operand has no axis to concatenate
        raise DefinitionError(f"Invalid dimension to cat: dim {attrs['dim']} for operands of "
                              f"rank {rank}")
    dim = norm_axis(attrs["dim"], rank)
    flags = [all(t.broadcast[i] for t in tensors) for i in range(rank)]
    flags[dim] = False
    return [OutSig(dtype, tuple(flags))]


def _cat_shape(in_shapes, attrs, ev):
    rank = len(in_shapes[0])
    dim = attrs["dim"] % rank
    out = list(in_shapes[0])
    for k, s in enumerate(in_shapes[1:], start=1):
        for i in range(rank):
            if i != dim and s[i] != out[i]:
                raise InputError(f"cat operand {k} has extent {s[i]} on axis {i}, operand 0 has "
                                 f"{out[i]}: a conflict was found with 2 different sizes")
    out[dim] = sum(s[dim] for s in in_shapes)
    return [tuple(out)]


register(OpSpec("cat", (Param("tensors", "TL"), Param("dim", "I"),
                        Param("manual_padding", "B", False)),
                OpClass.RESIZE, _cat_infer, _cat_shape, cost=0))
