"""Build a Fusion through nvFuser's frontend API (define_tensor, define_scalar, ops.<name> ...).

The text parser and the SDK's FusionDefinition both drive this builder, so an op is checked the
same way however it arrives: arguments bound to nvFuser's signature, operand kinds checked, result
types inferred. Errors name the op by index and name.
"""

from __future__ import annotations

import math
from typing import Any

from fusecut.optimizer.errors import (
    ArgumentTypeError,
    DefinitionError,
    ManualSchedulingError,
    counted,
)
from fusecut.optimizer.ir.descriptor import (
    check_stride_order,
    compute_tensor_descriptor,
    logical_contiguity,
)
from fusecut.optimizer.ir.dtypes import DType, fits_int64
from fusecut.optimizer.ir.fusion import Fusion, Op, Ref, ScalarValue, TensorValue
from fusecut.optimizer.ir.opspec import OPERAND_KINDS, REQUIRED, OpClass, get_spec
from fusecut.optimizer.ir.opspec import bind_arguments as _bind

MAX_RANK = 16
MAX_OPS_DEFAULT = 100_000

# nvFuser's TensorView scheduling API: fusecut schedules automatically and refuses these
SCHEDULING_METHODS = frozenset({
    "split", "merge", "reorder", "parallelize", "axis", "domain", "cache_after", "cache_before",
    "cache_fork", "set_memory_type", "set_allocation_domain", "set_loop_domain",
    "set_allocation_as_loop", "rfactor", "inline_at", "compute_at", "swizzle",
    "circular_buffer", "apply_mma_swizzle", "set_device_mesh", "outer_split", "inner_split",
    "broadcast", "get_logical_domain", "get_loop_domain", "get_root_domain",
    "get_allocation_domain", "get_maybe_root_domain", "vectorize", "unroll",
})


class _Arithmetic:
    """nvFuser's Python operators on tensors and scalars (``-t``, ``abs(t)``, ``t * s``, ``a / b``
    ...): each is the op of that name, as nvFuser binds them (``/`` is ``div``, which truncates
    integers; ``**`` is ``pow``)."""

    _builder: FusionBuilder

    def _op(self, name: str, *args: Any):
        (out,) = self._builder._sdk_op(name, list(args))
        return out

    def __neg__(self):
        return self._op("neg", self)

    def __abs__(self):
        return self._op("abs", self)

    def __invert__(self):
        return self._op("bitwise_not", self)

    def __add__(self, other):
        return self._op("add", self, other)

    def __radd__(self, other):
        return self._op("add", other, self)

    def __sub__(self, other):
        return self._op("sub", self, other)

    def __rsub__(self, other):
        return self._op("sub", other, self)

    def __mul__(self, other):
        return self._op("mul", self, other)

    def __rmul__(self, other):
        return self._op("mul", other, self)

    def __truediv__(self, other):
        return self._op("div", self, other)

    def __rtruediv__(self, other):
        return self._op("div", other, self)

    def __pow__(self, other):
        return self._op("pow", self, other)

    def __rpow__(self, other):
        return self._op("pow", other, self)

    def __mod__(self, other):
        return self._op("mod", self, other)

    def __and__(self, other):
        return self._op("bitwise_and", self, other)

    def __or__(self, other):
        return self._op("bitwise_or", self, other)

    def __xor__(self, other):
        return self._op("bitwise_xor", self, other)

    def __lshift__(self, other):
        return self._op("bitwise_left_shift", self, other)

    def __rshift__(self, other):
        return self._op("bitwise_right_shift", self, other)

    def __lt__(self, other):
        return self._op("lt", self, other)

    def __le__(self, other):
        return self._op("le", self, other)

    def __gt__(self, other):
        return self._op("gt", self, other)

    def __ge__(self, other):
        return self._op("ge", self, other)

    # == and != stay identity comparisons (nvFuser's Tensor == Tensor is too): handles are
    # dictionary keys
    __hash__ = object.__hash__


class TensorHandle(_Arithmetic):
    """A tensor of a definition under construction (nvFuser's ``Tensor``)."""

    def __init__(self, builder: FusionBuilder, name: str):
        self._builder = builder
        self.name = name

    @property
    def ndim(self) -> int:
        return self._builder.fusion.tensors[self.name].rank

    @property
    def dtype(self) -> DType:
        return self._builder.fusion.tensors[self.name].dtype

    def size(self, dim: int) -> ScalarHandle:
        return self._builder.size(self, dim)

    def shape(self) -> list[ScalarHandle]:
        return [self._builder.size(self, i) for i in range(self.ndim)]

    def __repr__(self) -> str:
        return f"Tensor({self.name})"

    def is_tensor(self) -> bool:
        return True

    def __getattr__(self, name: str):
        if name in SCHEDULING_METHODS:
            raise ManualSchedulingError(f"{self.name}.{name}() belongs to nvFuser's manual "
                                        f"scheduling; fusecut schedules automatically and takes "
                                        f"no manual scheduling")
        raise AttributeError(f"Tensor has no attribute {name!r}")


class ScalarHandle(_Arithmetic):
    """A scalar of a definition under construction (nvFuser's ``Scalar``)."""

    def __init__(self, builder: FusionBuilder, name: str):
        self._builder = builder
        self.name = name

    @property
    def dtype(self) -> DType:
        return self._builder.fusion.scalars[self.name].dtype

    def __repr__(self) -> str:
        return f"Scalar({self.name})"

    def is_tensor(self) -> bool:
        return False


class VectorHandle(list):
    """``fd.define_vector([...])``: a list of scalars usable wherever a shape is expected."""


class FusionBuilder:
    def __init__(self, max_ops: int = MAX_OPS_DEFAULT):
        self.fusion = Fusion()
        self.max_ops = max_ops
        self.completed = False  # set by the SDK once the definition is finished
        self._counter = 0
        self._sizes: dict[tuple[str, int], str] = {}
        self.reserved: set[str] = set()  # names the text assigns later: generated names skip them

    # ---- naming ---------------------------------------------------------------------------------

    def _taken(self, name: str) -> bool:
        return name in self.fusion.tensors or name in self.fusion.scalars

    def _fresh(self, prefix: str, hint: str | None = None) -> str:
        if hint is not None and hint.isidentifier() and not self._taken(hint):
            return hint
        while True:
            name = f"{prefix}{self._counter}"
            self._counter += 1
            if not self._taken(name) and name not in self.reserved:
                return name

    # ---- definitions ----------------------------------------------------------------------------

    def define_tensor(self, shape: list[int] | None = None, contiguity: Any = None,
                      dtype: DType | None = DType.float32, is_cpu: bool = False,
                      stride_order: list[int] | None = None, *, name: str | None = None,
                      sizes: list[int] | None = None, strides: list[int] | None = None,
                      static_sizes: bool = False, symbolic_sizes: list[int] | None = None,
                      contiguous: Any = None) -> TensorHandle:
        """nvFuser's ``define_tensor`` in both of its forms: ``shape``/``contiguity``/
        ``stride_order`` (contiguity read in allocation order when a stride order is given, as
        nvFuser reads it), or concrete ``sizes``/``strides`` (the descriptor computed as
        ``fd.from_pytorch`` does; extents symbolic unless ``static_sizes``)."""
        try:
            return self._define_tensor(shape, contiguity, dtype, is_cpu, stride_order, name,
                                       sizes, strides, static_sizes, symbolic_sizes, contiguous)
        except ArgumentTypeError as e:
            raise ArgumentTypeError(f"define_tensor(): incompatible function arguments. "
                                    f"{e.message}") from None

    def _define_tensor(self, shape, contiguity, dtype, is_cpu, stride_order, name, sizes,
                       strides, static_sizes, symbolic_sizes, contiguous) -> TensorHandle:
        if contiguity is None:
            contiguity = contiguous
        if strides is not None:  # the concrete form
            if sizes is None:
                sizes = shape
            if sizes is None:
                raise DefinitionError("define_tensor(sizes=, strides=) needs both")
            sizes = [_int(x, "define_tensor sizes entry") for x in sizes]
            strides = [_int(x, "define_tensor strides entry") for x in strides]
            if len(strides) != len(sizes):
                raise DefinitionError(f"The number of sizes does not match the number of "
                                      f"strides. {len(sizes)} {len(strides)}")
            for e in sizes:
                if e < 0:
                    raise DefinitionError(f"Size of {e} is not supported in nvFuser. Expected "
                                          f"size >= 0.")
            contiguity, stride_order = compute_tensor_descriptor(sizes, strides)
            shape = list(sizes) if static_sizes else [1 if e == 1 else -1 for e in sizes]
        elif shape is None:
            shape = symbolic_sizes if symbolic_sizes is not None else sizes
        if shape is None:
            raise DefinitionError("define_tensor needs shape=[...] (or sizes= and strides=)")
        shape = [_int(x, "define_tensor shape entry") for x in shape]
        rank = len(shape)
        if rank > MAX_RANK:
            raise DefinitionError(f"define_tensor rank {rank} exceeds the limit of {MAX_RANK}")
        for i, e in enumerate(shape):
            if e < -1:
                raise DefinitionError(f"The value {e} at index {i} was neither symbolic(-1), "
                                      f"zero_element(0), broadcast(1), or static(>1).")
        if dtype is None:
            raise DefinitionError("define_tensor needs a dtype")
        if not isinstance(dtype, DType):
            raise DefinitionError(f"define_tensor dtype must be a DataType, got {dtype!r}")
        if is_cpu and rank:
            raise DefinitionError("CPU non-scalar tensor is not supported! (is_cpu=True is only "
                                  "supported for 0-dim tensors)")
        if stride_order is not None and len(stride_order) == 0:
            stride_order = None
        if stride_order is not None:
            stride_order = [_int(x, "stride_order entry") for x in stride_order]
            if len(stride_order) != rank:
                raise DefinitionError(f"Length of stride_order argument ({len(stride_order)}) "
                                      f"must be zero or match that of shape argument ({rank})")
            stride_order = check_stride_order(stride_order, rank)
        if contiguity is None or isinstance(contiguity, bool):
            fill = True if contiguity is None else contiguity
            contiguity = [None if e == 1 else fill for e in shape]
        else:
            contiguity = list(contiguity)
            if len(contiguity) != rank:
                raise DefinitionError(f"Length of contiguity argument ({len(contiguity)}) must "
                                      f"match that of shape argument ({rank})")
            for c in contiguity:
                if c is not None and not isinstance(c, bool):
                    raise DefinitionError(f"contiguity entries must be True, False or None, got "
                                          f"{c!r}")
            # nvFuser reads contiguity in allocation order when a stride order is given
            contiguity = logical_contiguity(contiguity, stride_order)
        if stride_order == list(range(rank - 1, -1, -1)):
            stride_order = None  # row-major is the default; keep one canonical form
        broadcast = tuple(e == 1 or c is None for e, c in zip(shape, contiguity))
        tv = TensorValue(self._fresh("T", name), dtype, broadcast, tuple(shape),
                         tuple(contiguity), tuple(stride_order) if stride_order else None)
        self.fusion.tensors[tv.name] = tv
        self.fusion.inputs.append(tv.name)
        return TensorHandle(self, tv.name)

    def define_scalar(self, value: Any = None, dtype: DType | None = None, *,
                      name: str | None = None) -> ScalarHandle:
        """A constant (``value`` given) or a scalar fusion input (``value`` None, or nvFuser's
        ``define_scalar(dtype)`` form: a DataType as the only argument)."""
        if isinstance(value, DType) and dtype is None:
            value, dtype = None, value
        if dtype is not None and not isinstance(dtype, DType):
            raise DefinitionError(f"define_scalar dtype must be a DataType, got {dtype!r}")
        if value is not None:
            if isinstance(value, bool):
                dtype = dtype or DType.bool
            elif isinstance(value, int):
                if not fits_int64(value) and dtype is not DType.uint64:
                    raise DefinitionError(f"integer literal {value} does not fit in 64 bits")
                dtype = dtype or DType.int64
            elif isinstance(value, float):
                dtype = dtype or DType.float64
            elif isinstance(value, complex):
                dtype = dtype or DType.complex128
            else:
                raise DefinitionError(f"define_scalar value must be a number or bool, got "
                                      f"{type(value).__name__}")
            value = _coerce(value, dtype)
        elif dtype is None:
            dtype = DType.float64  # nvFuser's default: fd.define_scalar() is a Double input
        sv = ScalarValue(self._fresh("S", name), dtype, value)
        self.fusion.scalars[sv.name] = sv
        if value is None:
            self.fusion.inputs.append(sv.name)
        return ScalarHandle(self, sv.name)

    def define_vector(self, values: Any, dtype: DType | None = DType.int64) -> VectorHandle:
        """A shape vector: a list of scalars and integers, or (nvfuser_direct's form) a size:
        that many integer scalar inputs."""
        out = VectorHandle()
        if isinstance(values, int) and not isinstance(values, bool):
            if not 0 <= values <= MAX_RANK:
                raise DefinitionError(f"define_vector size {values} must be in [0, {MAX_RANK}]")
            for _ in range(values):
                out.append(self.define_scalar(None, DType.int64))
            return out
        if not isinstance(values, (list, tuple)):
            raise DefinitionError(f"define_vector expects a list of integers or scalars, got "
                                  f"{type(values).__name__}")
        for v in values:
            if isinstance(v, ScalarHandle):
                out.append(v)
            elif isinstance(v, float) or isinstance(v, complex):
                raise DefinitionError("Unsupported datatype: define_vector takes integers "
                                      f"(got {v!r})")
            else:
                v = _int(v, "vector entry")
                if v < -1:
                    raise DefinitionError(f"The value {v} at index {len(out)} was neither "
                                          f"symbolic(-1), zero_element(0), broadcast(1), or "
                                          f"static(>1).")
                out.append(self.define_scalar(v))
        return out

    def size(self, tensor: TensorHandle, dim: int, name: str | None = None) -> ScalarHandle:
        rank = self.fusion.tensors[self._tensor_name(tensor, "size")].rank
        dim = _int(dim, "size dim")
        if not -rank <= dim < rank:
            raise DefinitionError(f"Tried to access out of boundary index {dim}. total index: "
                                  f"{rank} (size({tensor.name}, {dim}): dim out of range for rank "
                                  f"{rank})")
        dim %= rank
        key = (tensor.name, dim)
        if key not in self._sizes:  # one scalar per (tensor, axis), however often it is asked
            (handle,) = self.op("size", [tensor, dim], {}, [name] if name else None)
            self._sizes[key] = handle.name
        return ScalarHandle(self, self._sizes[key])

    def add_output(self, tensor: Any, alias_input: Any = None) -> None:
        if isinstance(tensor, ScalarHandle):
            raise DefinitionError(f"add_output: {tensor.name} is a scalar; only tensors can be "
                                  f"fusion outputs")
        name = self._tensor_name(tensor, "add_output")
        if alias_input is not None and name in self.fusion.aliases:
            raise DefinitionError(f"add_output: {name} already updates "
                                  f"{self.fusion.aliases[name]} in place")
        self.fusion.outputs.append(name)
        if alias_input is not None:
            inp = self._tensor_name(alias_input, "add_output alias_input")
            if inp not in self.fusion.inputs:
                raise DefinitionError(f"add_output: alias {inp} is not a fusion input")
            src, dst = self.fusion.tensors[name], self.fusion.tensors[inp]
            if src.rank != dst.rank or src.dtype != dst.dtype:
                raise DefinitionError(f"add_output: {name} cannot update {inp} in place "
                                      f"(rank or dtype differ)")
            self.fusion.aliases[name] = inp

    def parallelize(self, tensor: Any, axis: Any, parallel_type: str) -> None:
        name = self._tensor_name(tensor, "sched.parallelize")
        if parallel_type != "stream":
            raise DefinitionError(f"sched.parallelize: only ParallelType.stream is supported, "
                                  f"got {parallel_type}")
        rank = self.fusion.tensors[name].rank
        axis = _int(axis, "parallelize axis")
        if not -rank <= axis < rank:
            raise DefinitionError(f"sched.parallelize: axis {axis} out of range for {name} "
                                  f"(rank {rank})")
        entry = (name, axis % rank)
        if entry not in self.fusion.stream_axes:
            self.fusion.stream_axes.append(entry)

    # ---- ops ------------------------------------------------------------------------------------

    def _sdk_op(self, name: str, args: list[Any]) -> list[TensorHandle | ScalarHandle]:
        """An op from a Python operator on handles: refused once the definition is complete."""
        if getattr(self, "completed", False):
            raise DefinitionError("Attempting to add to a completed definition!")
        return self.op(name, args, {})

    def op(self, name: str, args: list[Any], kwargs: dict[str, Any],
           out_names: list[str] | None = None) -> list[TensorHandle | ScalarHandle]:
        """An op called the frontend way: ``fd.ops.<name>(*args, **kwargs)``."""
        label = f"op #{len(self.fusion.ops)} {name}"
        try:
            spec = get_spec(name)
            if name == "sdpfa_fwd" and len(args) == 6 and any(
                    isinstance(a, ScalarHandle) for a in args[3:5]):
                # the legacy frontend's sdpfa_fwd(query, key, value, dropout_p, is_causal, scale)
                kwargs = {**kwargs, **dict(zip(("dropout_p", "is_causal", "scale"), args[3:]))}
                args = args[:3]
            inputs, attrs = self._convert(spec, _bind(spec, list(args), dict(kwargs)))
            if name == "broadcast_in_dim":  # nvFuser counts negative dims from the output's end
                rank = len(attrs["shape"])
                attrs["broadcast_dims"] = [d + rank if isinstance(d, int) and -rank <= d < 0
                                           else d for d in attrs["broadcast_dims"]]
        except ArgumentTypeError as e:  # worded as Python reports a bad call
            raise ArgumentTypeError(f"{name}(): incompatible function arguments. {e.message}",
                                    line=e.line, col=e.col, op=label) from None
        except DefinitionError as e:
            raise DefinitionError(e.message, line=e.line, col=e.col, op=label) from None
        return self._append(spec, inputs, attrs, out_names, label)

    def add_op(self, name: str, inputs: list[str], attrs: dict[str, Any],
               out_names: list[str]) -> list[TensorHandle | ScalarHandle]:
        """An op in normalised form (the wire format): operands by name, attributes by parameter.

        Attribute values are plain JSON values except scalar references, which are ``Ref``s.
        """
        label = f"op #{len(self.fusion.ops)} {name}"
        try:
            spec = get_spec(name)
            expected = {p.name: p for p in spec.params
                        if p.kind not in OPERAND_KINDS and p.name != "original_shape"}
            flags = {f"has_{p.name}" for p in spec.params if p.kind in ("T?", "S?")}
            unknown = set(attrs) - set(expected) - flags
            if unknown:
                raise DefinitionError(f"unknown attributes {sorted(unknown)}; {name} takes "
                                      f"{sorted(set(expected) | flags)}")
            norm: dict[str, Any] = {}
            for pname, p in expected.items():
                norm[pname] = self._attribute(p.kind, pname, attrs.get(pname, p.default)) \
                    if (pname in attrs or p.default is not REQUIRED) else _missing(pname)
            for flag in sorted(flags):
                value = attrs.get(flag, False)
                if not isinstance(value, bool):
                    raise DefinitionError(f"{flag} must be true or false")
                norm[flag] = value
            self._check_operands(spec, list(inputs), norm)
            if len(out_names) != spec.n_outputs:
                raise DefinitionError(f"{name} has {counted(spec.n_outputs, 'output')}, got "
                                      f"{len(out_names)}")
            for out in out_names:
                if not isinstance(out, str) or not out.isidentifier() or self._taken(out):
                    raise DefinitionError(f"output name {out!r} is not a fresh identifier")
        except DefinitionError as e:
            raise DefinitionError(e.message, line=e.line, col=e.col, op=label) from None
        return self._append(spec, list(inputs), norm, out_names, label)

    def _check_operands(self, spec, inputs: list[str], attrs: dict[str, Any]) -> None:
        kinds = []
        for p in spec.params:
            if p.kind in ("T", "V", "S") or (p.kind in ("T?", "S?") and attrs[f"has_{p.name}"]):
                kinds.append((p.name, p.kind.rstrip("?")))
            elif p.kind == "TL":
                kinds.extend((p.name, "T") for _ in inputs)
        if len(kinds) != len(inputs):
            raise DefinitionError(f"expected {counted(len(kinds), 'operand')}, got {len(inputs)}")
        for (pname, kind), value in zip(kinds, inputs):
            if not isinstance(value, str) or not self._taken(value):
                raise DefinitionError(f"operand {pname} refers to {value!r}, which is not defined")
            if kind == "T" and value not in self.fusion.tensors:
                raise DefinitionError(f"operand {pname} must be a tensor, {value} is a scalar")
            if kind == "S" and value not in self.fusion.scalars:
                raise DefinitionError(f"operand {pname} must be a scalar, {value} is a tensor")

    def _append(self, spec, inputs: list[str], attrs: dict[str, Any],
                out_names: list[str] | None, label: str) -> list[TensorHandle | ScalarHandle]:
        if len(self.fusion.ops) >= self.max_ops:
            raise DefinitionError(f"the definition has more than {self.max_ops} ops")
        try:
            operands = [self.fusion.tensors.get(n) or self.fusion.scalars[n] for n in inputs]
            sigs = spec.infer(operands, attrs)
            scalar_only = all(isinstance(v, ScalarValue) for v in operands)
            if scalar_only and spec.op_class not in (OpClass.POINTWISE, OpClass.FACTORY,
                                                     OpClass.SCALAR):
                raise DefinitionError("needs a tensor operand")
            for sig in sigs:
                if sig.broadcast is not None and len(sig.broadcast) > MAX_RANK:
                    raise DefinitionError(f"result rank {len(sig.broadcast)} exceeds {MAX_RANK}")
        except DefinitionError as e:
            raise DefinitionError(e.message, line=e.line, col=e.col, op=label) from None
        outs: list[TensorHandle | ScalarHandle] = []
        names = []
        for k, sig in enumerate(sigs):
            hint = out_names[k] if out_names and k < len(out_names) else None
            if sig.broadcast is None:
                sv = ScalarValue(self._fresh("S", hint), sig.dtype)
                self.fusion.scalars[sv.name] = sv
                outs.append(ScalarHandle(self, sv.name))
            else:
                tv = TensorValue(self._fresh("T", hint), sig.dtype, sig.broadcast)
                self.fusion.tensors[tv.name] = tv
                outs.append(TensorHandle(self, tv.name))
            names.append(outs[-1].name)
        self.fusion.ops.append(Op(spec.name, tuple(inputs), tuple(names), attrs))
        return outs

    def _convert(self, spec, bound: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        inputs: list[str] = []
        attrs: dict[str, Any] = {}
        for p in spec.params:
            value = bound[p.name]
            if p.kind in OPERAND_KINDS:
                inputs.extend(self._operands(p.kind, p.name, value))
            elif p.name != "original_shape":  # legacy argument, implied by the operand
                attrs[p.name] = self._attribute(p.kind, p.name, value)
            if p.kind in ("T?", "S?"):  # which optional operands are present
                attrs[f"has_{p.name}"] = value is not None
        return inputs, attrs

    def _operands(self, kind: str, pname: str, value: Any) -> list[str]:
        if kind in ("T?", "S?") and value is None:
            return []
        if kind in ("T", "T?"):
            return [self._tensor_name(value, pname)]
        if kind == "TL":
            if not isinstance(value, (list, tuple)):
                raise DefinitionError(f"{pname} must be a list of tensors")
            return [self._tensor_name(v, pname) for v in value]
        if kind == "V":
            if isinstance(value, TensorHandle):
                return [self._tensor_name(value, pname)]
            return [self._scalar_name(value, pname)]
        return [self._scalar_name(value, pname)]  # S, S?

    def _attribute(self, kind: str, pname: str, value: Any) -> Any:
        if kind == "DT":
            if value is None or isinstance(value, DType):
                return value
            if isinstance(value, str) and value in DType.__members__:
                return DType(value)
            raise DefinitionError(f"{pname} must be a DataType, got {value!r}")
        if kind == "I":
            return _int(value, pname)
        if kind in ("IL", "IL?"):
            if value is None:
                if kind == "IL?":
                    return None
                raise DefinitionError(f"{pname} must be a list of ints")
            if isinstance(value, int) and not isinstance(value, bool):
                return [value]
            if not isinstance(value, (list, tuple)):
                raise ArgumentTypeError(f"{pname} must be a list of ints, got {value!r}")
            if len(value) > MAX_RANK:
                raise DefinitionError(f"{pname} has {len(value)} entries; at most {MAX_RANK}")
            return [_int(v, pname) for v in value]
        if kind == "B":
            if isinstance(value, int) and value in (0, 1):  # nvFuser's printer writes 0 and 1
                return bool(value)
            if not isinstance(value, bool):
                raise DefinitionError(f"{pname} must be True or False, got {value!r}")
            return value
        if kind == "BL":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, bool) for v in value):
                raise DefinitionError(f"{pname} must be a list of bools")
            if len(value) > MAX_RANK:
                raise DefinitionError(f"{pname} has {len(value)} entries; at most {MAX_RANK}")
            return list(value)
        if kind == "N":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DefinitionError(f"{pname} must be a number, got {value!r}")
            return value
        if kind == "SH":
            if value is None:
                if pname == "original_shape":  # legacy and optional
                    return None
                raise DefinitionError(f"{pname} must be a list of extents, got None")
            if isinstance(value, ScalarHandle):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise DefinitionError(f"{pname} must be a list of extents, got {value!r}")
            if len(value) > 4 * MAX_RANK:
                raise DefinitionError(f"{pname} has {len(value)} entries")
            out: list[Any] = []
            for v in value:
                if isinstance(v, (ScalarHandle, Ref)):
                    scalar = self.fusion.scalars.get(v.name)
                    if scalar is None:
                        raise DefinitionError(f"{pname} entry {v.name} is not a defined scalar")
                    if not (scalar.dtype.is_int or scalar.dtype.is_float):
                        raise DefinitionError(f"{pname} entry {v.name} must be a number scalar")
                    out.append(Ref(v.name))
                else:
                    v = _int(v, f"{pname} entry")
                    if v < -1 and pname in ("shape", "new_shape"):  # extents, not offsets
                        raise DefinitionError(f"The value {v} at index {len(out)} was neither "
                                              f"symbolic(-1), zero_element(0), broadcast(1), or "
                                              f"static(>1). ({pname} entries are extents)")
                    out.append(v)
            return out
        raise AssertionError(kind)

    def _tensor_name(self, value: Any, pname: str) -> str:
        if isinstance(value, TensorHandle) and value._builder is self:
            return value.name
        what = "a scalar" if isinstance(value, ScalarHandle) else repr(value)
        raise DefinitionError(f"{pname} must be a tensor of this definition, got {what}")

    def _scalar_name(self, value: Any, pname: str) -> str:
        if isinstance(value, ScalarHandle) and value._builder is self:
            return value.name
        if isinstance(value, (bool, int, float, complex)):
            if isinstance(value, float) and math.isnan(value):
                return self.define_scalar(value, DType.float64).name
            return self.define_scalar(value).name
        if isinstance(value, TensorHandle):
            raise DefinitionError(f"{pname} must be a scalar, {value.name} is a tensor")
        raise DefinitionError(f"{pname} must be a scalar or a number, got {value!r}")


def _missing(pname: str) -> Any:
    raise DefinitionError(f"missing attribute '{pname}'")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{what} must be an integer, got {value!r}")
    if not fits_int64(value):
        raise ArgumentTypeError(f"{what} {value} does not fit in 64 bits")
    return value


def _coerce(value: Any, dtype: DType) -> Any:
    if dtype.is_complex:
        return complex(value)
    if isinstance(value, complex):
        raise DefinitionError(f"complex value {value} cannot be a {dtype.value} scalar")
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float):
            if not value.is_integer():
                raise DefinitionError(f"value {value} is not an integer but dtype is "
                                      f"{dtype.value}")
            return int(value)
        return int(value)
    return float(value)
