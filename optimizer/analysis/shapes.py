"""Bind input metadata to a fusion: concrete sizes, broadcast axes and scalar values everywhere.

``bind`` checks each input against its declaration (kind, dtype, rank, fixed extents, declared
broadcasts), then walks the ops in order: scalar ops are evaluated on the host, tensor ops get
their sizes from their shape rule and their broadcast axes from their structural rule applied to
the operands' concrete broadcast axes. An axis of extent 1 counts as broadcast: its values cannot
vary along it (an axis of extent 0 never is).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from fusecut.optimizer.analysis.scalars import coerce, eval_scalar_op
from fusecut.optimizer.errors import DefinitionError, FusecutError, InputError, counted
from fusecut.optimizer.ir.fusion import Fusion, Op, Ref, ScalarValue, TensorValue
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, scale_metas
from fusecut.optimizer.ir.opspec import get_spec


@dataclass
class Bound:
    """A fusion with concrete sizes: what the planner and the code generator work from."""

    fusion: Fusion
    shapes: dict[str, tuple[int, ...]]
    broadcast: dict[str, tuple[bool, ...]]
    scalars: dict[str, Any]  # None where a value depends on an input without one
    inputs: dict[str, InputMeta]
    # the stream stages of the fusion at these sizes, once computed (``analysis.streams``)
    stream_stages: list[Any] | None = field(default=None, init=False, repr=False, compare=False)

    def numel(self, name: str) -> int:
        return math.prod(self.shapes[name])

    def compact_shape(self, name: str) -> tuple[int, ...]:
        """Extents of the axes that are stored: broadcast and stride-0 input axes are not."""
        meta = self.inputs.get(name)
        if isinstance(meta, TensorMeta):
            return tuple(e for e, s in zip(meta.shape, meta.strides) if s != 0 and e != 1)
        return tuple(e for e, b in zip(self.shapes[name], self.broadcast[name]) if not b)

    def compact_numel(self, name: str) -> int:
        if self.numel(name) == 0:
            return 0
        return math.prod(self.compact_shape(name))

    def nbytes(self, name: str) -> int:
        """Bytes of the compact form: what reading or writing this tensor once moves."""
        return self.fusion.tensors[name].dtype.nbytes(self.compact_numel(name))

    def dtype(self, name: str):
        return self.fusion.value_dtype(name)

    @functools.cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        """Value name -> indices of the ops that read it, in program order."""
        index: dict[str, list[int]] = {}
        for i, op in enumerate(self.fusion.ops):
            for n in dict.fromkeys(op.inputs):
                index.setdefault(n, []).append(i)
        return {n: tuple(v) for n, v in index.items()}

    @functools.cached_property
    def producers(self) -> dict[str, int]:
        """Value name -> index of the op that defines it (the fusion's ops do not change once
        bound)."""
        return self.fusion.producers()


class _Evaluator:
    def __init__(self, scalars: dict[str, Any], op: Op):
        self.scalars = scalars
        self.op = op

    def __call__(self, x: Any) -> Any:
        if isinstance(x, Ref):
            return self.value(x.name)
        return x

    def value(self, name: str) -> Any:
        v = self.scalars.get(name)
        if v is None:
            raise InputError(f"{self.op.name} needs the value of scalar {name}, which depends on a "
                             f"scalar input whose value was not given")
        return v

    def operand(self, i: int) -> Any:
        return self.value(self.op.inputs[i])


def check_inputs(fusion: Fusion, metas: list[InputMeta]) -> dict[str, InputMeta]:
    """Match input metadata to the definition's inputs; a mismatch names the input precisely."""
    if len(metas) != len(fusion.inputs):
        raise InputError(f"the definition has {counted(len(fusion.inputs), 'input')} "
                         f"({', '.join(fusion.inputs)}) but {len(metas)} "
                         f"{'was' if len(metas) == 1 else 'were'} given")
    out: dict[str, InputMeta] = {}
    for i, (name, meta) in enumerate(zip(fusion.inputs, metas)):
        where = f"input {i} ({name})"
        if name in fusion.scalars:
            if not isinstance(meta, ScalarMeta):
                raise InputError(f"Expected input {i}, {name}, to be a scalar but got "
                                 f"{_torch_name(meta.dtype)} tensor of rank {meta.rank}: "
                                 f"{where} is a scalar but a tensor was given")
            want = fusion.scalars[name].dtype
            if meta.value is not None:
                if meta.dtype.category > want.category:
                    raise InputError(f"Scalar value {_nv_scalar(meta.value)} is not compatible "
                                     f"with the expected data type: {_c_name(want)}. ({where}: "
                                     f"expected a {want.value} scalar, got "
                                     f"{meta.dtype.value})")
                meta = ScalarMeta(want, coerce(meta.value, want))
            out[name] = meta
            continue
        t = fusion.tensors[name]
        if not isinstance(meta, TensorMeta) and meta.value is None:
            # metadata without a shape (an --inputs entry, a dict) reads as a scalar's
            raise InputError(f"{where} is a tensor, but its metadata has no shape: give "
                             f"{{\"shape\": [...], \"dtype\": \"{t.dtype.value}\"}}")
        if not isinstance(meta, TensorMeta):
            raise InputError(f"Expected input {i}, {name}, to be an at::Tensor but got scalar "
                             f"{_nv_scalar(meta.value)}: {where} is a tensor but a scalar was "
                             f"given")
        if meta.dtype != t.dtype:
            # nvFuser's words (C++ names) first, as programs match them; then torch's
            raise InputError(f"Expected input {i}, {name}, to be bound to a tensor of dtype "
                             f"{_c_name(t.dtype)}, but got a tensor of dtype "
                             f"{_c_name(meta.dtype)} (in torch's names, {where}: expected "
                             f"dtype {t.dtype.value}, got {meta.dtype.value})")
        if meta.rank != t.rank:
            raise InputError(f"{where}: expected rank {t.rank}, got shape {list(meta.shape)}")
        if len(meta.strides) != meta.rank:
            raise InputError(f"{where}: strides {list(meta.strides)} do not match shape "
                             f"{list(meta.shape)}")
        for axis, (e, s) in enumerate(zip(meta.shape, meta.strides)):
            declared = t.declared_shape[axis] if t.declared_shape else -1
            if declared not in (-1, e):
                raise InputError(f"{where}: axis {axis} is fixed to {declared} by the definition, "
                                 f"got {e}")
            if t.broadcast[axis] and e != 1 and s != 0:
                raise InputError(f"{where}: axis {axis} is declared broadcast but has extent {e} "
                                 f"with stride {s} (an expanded broadcast needs stride 0)")
        out[name] = meta
    return out


# nvFuser's (C++) names of dtypes, which its binding errors use
_C_NAMES = {"float32": "float", "float64": "double", "float16": "__half",
            "bfloat16": "__bfloat", "int32": "int", "int64": "int64_t", "uint64": "uint64_t",
            "bool": "bool", "complex64": "std::complex<float>",
            "complex128": "std::complex<double>"}


def _c_name(dtype) -> str:
    return _C_NAMES.get(dtype.value, dtype.value)


def _torch_name(dtype) -> str:
    return {"float32": "float", "float64": "double", "float16": "half", "int64": "long",
            "int32": "int"}.get(dtype.value, dtype.value)


def _nv_scalar(value: Any) -> str:
    """A scalar as nvFuser prints it: 2.0 as 2, a complex as (re,im)."""
    if isinstance(value, complex):
        return f"({_nv_real(value.real)},{_nv_real(value.imag)})"
    return _nv_real(value)


def _nv_real(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _describe(index: int, op) -> str:
    """``op #3 broadcast_in_dim(T1) -> T4``: where a binding error happened, by tensor names."""
    return f"op #{index} {op.name}({', '.join(op.inputs)}) -> {', '.join(op.outputs)}"


def bind(fusion: Fusion, metas: list[InputMeta]) -> Bound:
    inputs = check_inputs(fusion, metas)
    shapes: dict[str, tuple[int, ...]] = {}
    bcast: dict[str, tuple[bool, ...]] = {}
    scalars: dict[str, Any] = {}
    for name, sv in fusion.scalars.items():
        if sv.value is not None:
            scalars[name] = sv.value
    for name, meta in inputs.items():
        if isinstance(meta, ScalarMeta):
            scalars[name] = meta.value
        else:
            t = fusion.tensors[name]
            shapes[name] = meta.shape
            bcast[name] = tuple((b or e == 1 or s == 0) and e != 0 for b, e, s in
                                zip(t.broadcast, meta.shape, meta.strides))
    for index, op in enumerate(fusion.ops):
        try:
            _bind_op(fusion, op, shapes, bcast, scalars)
        except (InputError, DefinitionError) as e:
            raise type(e)(f"{_describe(index, op)}: {e}") from None
        except FusecutError:
            raise
        except (ValueError, OverflowError, ZeroDivisionError, TypeError) as e:
            raise InputError(f"{_describe(index, op)}: {e}") from None
    return Bound(fusion, shapes, bcast, scalars, inputs)


@dataclass
class Shrunk:
    """Inputs made smaller for a quick run (``shrink_inputs``)."""

    metas: list[InputMeta]
    kept: dict[int, str]  # extents the definition fixes -> what shrinking one of them broke


def shrink_inputs(fusion: Fusion, metas: list[InputMeta], max_numel: int) -> Shrunk:
    """``metas`` shrunk (``scale_metas``) towards at most ``max_numel`` elements a tensor,
    shrinking only the extents the definition leaves free: one that the definition fixes (a
    constant shape, a reshape into constant extents) keeps its size. Which is which is found
    by binding: equal extents shrink together, each kept when shrinking it breaks the binding.
    Inputs the definition refuses as given are returned as given (planning says why)."""

    def broken(trial: list[InputMeta]) -> str | None:
        try:
            bind(fusion, trial)
        except FusecutError as e:
            return str(e)
        return None

    largest = max((m.numel for m in metas if isinstance(m, TensorMeta)), default=0)
    if largest <= max_numel or broken(metas) is not None:
        return Shrunk(list(metas), {})
    everything = scale_metas(metas, max_numel)
    if broken(everything) is None:
        return Shrunk(everything, {})
    extents = sorted({e for m in metas if isinstance(m, TensorMeta) for e in m.shape if e > 8},
                     reverse=True)
    free: set[int] = set()
    kept: dict[int, str] = {}
    for extent in extents:
        trial = free | {extent}
        why = broken(scale_metas(metas, max_numel, frozenset(extents) - trial))
        if why is None:
            free = trial
        else:
            kept[extent] = why
    shrunk = scale_metas(metas, max_numel, frozenset(kept))
    if all(a.shape == b.shape for a, b in zip(metas, shrunk) if isinstance(a, TensorMeta)):
        return Shrunk(list(metas), kept)  # nothing could shrink: as given, strides too
    why = broken(shrunk)
    if why is not None:  # each shrank alone, not together: run them as given
        return Shrunk(list(metas), {e: why for e in extents})
    return Shrunk(shrunk, kept)


def _bind_op(fusion: Fusion, op: Op, shapes, bcast, scalars) -> None:
    spec = get_spec(op.name)
    ev = _Evaluator(scalars, op)
    tensor_outs = [o for o in op.outputs if o in fusion.tensors]
    if not tensor_outs:  # host scalar work
        (out,) = op.outputs
        dtype = fusion.scalars[out].dtype
        if op.name == "size":
            scalars[out] = shapes[op.inputs[0]][op.attrs["dim"]]
        elif all(scalars.get(n) is not None for n in op.inputs):
            scalars[out] = eval_scalar_op(op.name, [scalars[n] for n in op.inputs], op.attrs, dtype)
        else:
            scalars[out] = None
        return
    in_shapes = [shapes.get(n) for n in op.inputs]
    out_shapes = spec.shape(in_shapes, op.attrs, ev)
    concrete = [_concrete(fusion, n, bcast) for n in op.inputs]
    sigs = spec.infer(concrete, op.attrs)
    for name, shape, sig in zip(op.outputs, out_shapes, sigs):
        if any(e < 0 for e in shape):
            raise InputError(f"{name} would have a negative extent: {list(shape)}")
        shapes[name] = tuple(shape)
        bcast[name] = tuple((b or e == 1) and e != 0 for b, e in zip(sig.broadcast, shape))


def _concrete(fusion: Fusion, name: str, bcast) -> TensorValue | ScalarValue:
    if name in fusion.tensors:
        t = fusion.tensors[name]
        return TensorValue(name, t.dtype, bcast[name])
    return fusion.scalars[name]
