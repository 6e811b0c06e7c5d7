"""The op registry: what every op takes, what class it belongs to, and how its results look.

Each ``OpSpec`` holds
- ``params``: nvFuser's frontend signature (names, aliases, kinds, defaults), so text and builder
  calls bind arguments exactly as nvFuser's ``fd.ops.<name>`` would;
- ``infer``: the structural rule (result dtype and broadcast axes, from operands and attributes);
- ``shape``: the concrete rule (result sizes from operand sizes and scalar values);
- ``op_class``: what the segmenter and code generator may do with it (see ``OpClass``);
- ``cost``: arithmetic per output element in "simple op" units, for the cost model.

The op families register themselves from ``ops_pointwise``, ``ops_shape``, ``ops_misc`` and
``ops_library``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import ScalarValue, TensorValue


class OpClass(str, Enum):
    POINTWISE = "pointwise"  # elementwise math, casts, comparisons, where, set
    BROADCAST = "broadcast"  # broadcast_in_dim, broadcast, expand: add or expand broadcast axes
    SQUEEZE = "squeeze"  # drop broadcast axes
    PERMUTE = "permute"
    RESHAPE = "reshape"
    RESIZE = "resize"  # slice, pad, cat
    GATHER = "gather"  # take_along_axis, index_select, gather
    REDUCTION = "reduction"  # sum, max, min, prod, var, var_mean
    FACTORY = "factory"  # full, iota
    LIBRARY = "library"  # linear, matmul: cuBLAS through torch
    SEGMENT_SET = "segment_set"  # forced segment boundary
    SCALAR = "scalar"  # host-side scalar work (size, arithmetic on scalars)
    FALLBACK = "fallback"  # no generated kernel: alone, through the torch reference (scatter...)


REQUIRED = object()

# Parameter kinds:
#   T tensor, T? optional tensor, TL list of tensors, V tensor-or-scalar operand, S scalar operand,
#   S? optional scalar operand, DT dtype (None = DataType.Null), I int, IL ints (an int is a list of
#   one), IL? optional ints, B bool, BL bools, SH shape (ints and scalars), N number (int or float)
OPERAND_KINDS = {"T", "T?", "TL", "V", "S", "S?"}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    default: Any = REQUIRED
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutSig:
    """A result's structure: dtype, and broadcast flags (None for a scalar result)."""

    dtype: DType
    broadcast: tuple[bool, ...] | None


Operand = TensorValue | ScalarValue
InferFn = Callable[[list[Operand], dict[str, Any]], list[OutSig]]
# shape(operand shapes (None for scalars), attrs, scalar evaluator) -> result shapes. The evaluator
# turns an int or a Ref into its value; ``ev.operand(i)`` gives the value of scalar operand i.
ShapeFn = Callable[[list[tuple[int, ...] | None], dict[str, Any], Any], list[tuple[int, ...]]]


@dataclass(frozen=True)
class OpSpec:
    name: str
    params: tuple[Param, ...]
    op_class: OpClass
    infer: InferFn
    shape: ShapeFn
    n_outputs: int = 1
    cost: float = 1.0
    # Legacy positional forms: number of positionals -> parameter names (e.g. reshape's
    # (arg, original_shape, new_shape)); unknown extra parameters are dropped after binding.
    legacy: dict[int, tuple[str, ...]] | None = None


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    REGISTRY[spec.name] = spec
    return spec


def get_spec(name: str) -> OpSpec:
    spec = REGISTRY.get(name)
    if spec is None:
        raise DefinitionError(unknown_op_message(name))
    return spec


def unknown_op_message(name: str, lead: str = "unknown op") -> str:
    """``unknown op 'sqrtt'; did you mean 'sqrt'?``: the nearest op names, not all of them
    (docs/ops.md lists every op)."""
    near = difflib.get_close_matches(name, sorted(REGISTRY), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else \
        " (docs/ops.md lists the ops fusecut supports)"
    return f"{lead} {name[:80]!r}{hint}"


def all_specs() -> dict[str, OpSpec]:
    return REGISTRY


def bind_arguments(spec: OpSpec, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind call arguments to parameter names the way Python (and pybind11) would."""
    names = [p.name for p in spec.params]
    if len(args) == 2 and isinstance(args[1], DType) and "dtype" in names[2:] \
            and "dtype" not in kwargs:  # nvFuser's reduction overload op(arg, dtype)
        args, kwargs = args[:1], {**kwargs, "dtype": args[1]}
    if spec.legacy and len(args) in spec.legacy:
        names = list(spec.legacy[len(args)])
    if len(args) > len(names):
        raise DefinitionError(f"{spec.name}() takes at most {len(names)} positional arguments "
                              f"but {len(args)} were given")
    bound: dict[str, Any] = dict(zip(names, args))
    by_alias = {a: p.name for p in spec.params for a in (p.name, *p.aliases)}
    for key, value in kwargs.items():
        name = by_alias.get(key)
        if name is None:
            raise DefinitionError(f"{spec.name}() got an unexpected keyword argument '{key}'")
        if name in bound:
            raise DefinitionError(f"{spec.name}() got multiple values for argument '{name}'")
        bound[name] = value
    for p in spec.params:
        if p.name not in bound:
            if p.default is REQUIRED:
                raise DefinitionError(f"{spec.name}() missing required argument '{p.name}'")
            bound[p.name] = p.default
    return {p.name: bound[p.name] for p in spec.params}


# ---- helpers shared by the op families -------------------------------------------------------


def tensor_operands(ins: list[Operand]) -> list[TensorValue]:
    return [v for v in ins if isinstance(v, TensorValue)]


# nvFuser's words for an axis out of range, by what the axis indexes (programs written against
# nvFuser match on them); fusecut's own explanation follows
AXIS_ERRORS = {
    "index": "Tried to access out of boundary index {wrapped}. total index: {rank}",
    "gather": "Tensor arguments have dimension {rank}; dim {axis} is outside it",
    "reduction": "Reduction on invalid axis, received: {axis} however tensor view only has "
                 "{rank} non-reduction dims",
}


def norm_axis(axis: int, rank: int, what: str = "dim", nvfuser: str = "index",
              zero_d: bool = True) -> int:
    """``axis`` in [0, rank) (negative counts from the end); out of range is a DefinitionError in
    nvFuser's words for that kind of axis (``AXIS_ERRORS``) and then fusecut's. A 0-d tensor
    takes axis 0 or -1 where nvFuser (and torch) do, as argsort and topk do (``zero_d``); a
    reduction or a size has no axis of a 0-d tensor to name (``zero_d=False``)."""
    if not -max(rank, 1 if zero_d else 0) <= axis < max(rank, 1 if zero_d else 0):
        wrapped = axis + rank if axis < 0 else axis
        head = AXIS_ERRORS[nvfuser].format(axis=axis, rank=rank, wrapped=wrapped)
        raise DefinitionError(f"{head} ({what} {axis} is out of range for a tensor of rank "
                              f"{rank})")
    return axis % rank if rank else 0


def norm_axes(axes: list[int], rank: int, what: str = "dims",
              nvfuser: str = "index", zero_d: bool = True) -> tuple[int, ...]:
    out = tuple(sorted({norm_axis(a, rank, what, nvfuser, zero_d) for a in axes}))
    if len(out) != len(axes):
        raise DefinitionError(f"{what} {list(axes)} repeats an axis")
    return out


def check_extent(value: Any, what: str) -> int:
    # nvFuser computes extents like 192 * reciprocal(n) in floating point: a float within rounding
    # of an integer is that integer.
    if isinstance(value, float) and math.isfinite(value) and abs(value - round(value)) < 1e-6:
        return int(round(value))
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{what} must be an integer, got {value!r}")
    return value


def broadcast_shapes(shapes: list[tuple[int, ...]], names: list[str]) -> tuple[int, ...]:
    """numpy-style broadcast of concrete shapes (right-aligned); a mismatch names both operands."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    owner = [""] * rank
    for shape, name in zip(shapes, names):
        off = rank - len(shape)
        for i, e in enumerate(shape):
            j = off + i
            if e == 1:
                continue
            if out[j] == 1:
                out[j], owner[j] = e, f"{name} axis {i}"
            elif out[j] != e:
                raise InputError(f"extents do not match: {owner[j]} has extent {out[j]} but "
                                 f"{name} axis {i} has extent {e}")
    return tuple(out)


def eval_shape_list(shape: list[Any], ev: Callable[[Any], Any], what: str) -> list[int]:
    return [check_extent(ev(x), f"{what}[{i}]") for i, x in enumerate(shape)]

