"""Print a Fusion as nvFuser Python text (the repro format), which ``parse_text`` reads back.

Constants are defined just before their first use; ``size`` scalars print as ``T.size(i)``.
With input metadata the text ends with an ``inputs = [...]`` list and ``fd.execute(inputs)``,
as nvFuser's own repros do.
"""

from __future__ import annotations

import math
from typing import Any

from fusecut.optimizer.ir.descriptor import allocation_contiguity
from fusecut.optimizer.ir.dtypes import NVFUSER_NAME, DType
from fusecut.optimizer.ir.fusion import Fusion, Op, Ref
from fusecut.optimizer.ir.inputs import InputMeta, TensorMeta, contiguous_strides
from fusecut.optimizer.ir.opspec import OPERAND_KINDS, get_spec

# torch spells every dtype as fusecut does, except unpacked fp4, which torch does not have
_TORCH_NAME = {d: d.value for d in DType if d is not DType.float4_e2m1fn}
# float8 values torch cannot draw at random: drawn in float32 and converted
_DRAWN_AS_FLOAT32 = frozenset({DType.float8_e4m3fn, DType.float8_e5m2, DType.float8_e8m0fnu})


def format_number(v: Any) -> str:
    if isinstance(v, complex):
        return f"complex({_format_real(v.real)}, {_format_real(v.imag)})"
    return _format_real(v)


def _format_real(v: Any) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


def _dtype(d: DType | None) -> str:
    return "DataType.Null" if d is None else f"DataType.{NVFUSER_NAME[d]}"


def _attr(v: Any) -> str:
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, DType):
        return _dtype(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_attr(x) for x in v) + "]"
    return format_number(v)


def print_fusion(fusion: Fusion, name: str = "nvfuser_fusion_id0",
                 inputs: list[InputMeta] | None = None, device: str = "cuda:0") -> str:
    lines = ["import torch", "from nvfuser import FusionDefinition, DataType"
             + (", ParallelType" if fusion.stream_axes else ""), "",
             print_definition(fusion, name).rstrip("\n")]
    lines += ["", "with FusionDefinition() as fd:", f"    {name}(fd)", ""]
    missing = sorted({m.dtype.value for m in inputs or () if isinstance(m, TensorMeta)
                      and m.dtype not in _TORCH_NAME})
    if missing:
        lines.append(f"# no inputs list: torch has no {', '.join(missing)} tensors")
    elif inputs is not None:
        lines.append("inputs = [")
        lines += [f"    {format_input(m, device)}," for m in inputs]
        lines += ["]", "fd.execute(inputs)", ""]
    return "\n".join(lines)


def print_definition(fusion: Fusion, name: str = "nvfuser_fusion_id0") -> str:
    """The definition function alone (``def name(fd : FusionDefinition) -> None :`` and its
    body), as nvFuser prints a FusionDefinition; it needs ``FusionDefinition`` and ``DataType``
    (and ``ParallelType`` for stream axes) in scope."""
    lines = [f"def {name}(fd : FusionDefinition) -> None :"]
    defined: set[str] = set()

    def ensure(ref: str) -> None:
        if ref in defined:
            return
        sv = fusion.scalars.get(ref)
        if sv is not None and sv.value is not None:
            lines.append(f"    {ref} = fd.define_scalar({format_number(sv.value)}, "
                         f"dtype={_dtype(sv.dtype)})")
            defined.add(ref)

    for inp in fusion.inputs:
        if inp in fusion.tensors:
            t = fusion.tensors[inp]
            shape = list(t.declared_shape) if t.declared_shape is not None else [
                1 if b else -1 for b in t.broadcast]
            contiguity = allocation_contiguity(t.contiguity, t.stride_order) \
                if t.contiguity is not None else [None if b else True for b in t.broadcast]
            order = list(t.stride_order) if t.stride_order else list(range(t.rank - 1, -1, -1))
            lines.append(f"    {inp} = fd.define_tensor(shape={shape}, contiguity={contiguity}, "
                         f"dtype={_dtype(t.dtype)}, is_cpu=False, stride_order={order})")
        else:
            lines.append(f"    {inp} = fd.define_scalar(None, dtype="
                         f"{_dtype(fusion.scalars[inp].dtype)})")
        defined.add(inp)
    for op in fusion.ops:
        for ref in op.refs():
            ensure(ref)
        lines.append("    " + format_op(op))
        defined.update(op.outputs)
    aliased: set[str] = set()
    for out in fusion.outputs:
        alias = fusion.aliases.get(out) if out not in aliased else None
        aliased.add(out)  # a tensor output twice updates its input once (the first time)
        lines.append(f"    fd.add_output({out}" + (f", {alias})" if alias else ")"))
    for tensor, axis in fusion.stream_axes:
        lines.append(f"    fd.sched.parallelize({tensor}, {axis}, ParallelType.stream)")
    return "\n".join(lines) + "\n"


def print_math(fusion: Fusion) -> str:
    """The fusion as math, in the shape of nvFuser's ``print_math``: inputs and outputs with
    their dtypes and declared extents, then one line per op."""

    def tensor(name: str) -> str:
        t = fusion.tensors[name]
        dims = list(t.declared_shape) if t.declared_shape is not None else \
            ["1" if b else "?" for b in t.broadcast]
        return f"{name}_{t.dtype.value}[{', '.join(str(d) for d in dims)}]"

    def value(name: str) -> str:
        if name in fusion.tensors:
            return tensor(name)
        sv = fusion.scalars[name]
        return format_number(sv.value) if sv.value is not None else f"{name}_{sv.dtype.value}"

    lines = ["Inputs:"] + [f"  {value(n)}" for n in fusion.inputs]
    lines += ["Outputs:"] + [f"  {tensor(n)}" for n in fusion.outputs]
    lines += ["", "%kernel_math {"]
    for op in fusion.ops:
        attrs = ", ".join(f"{k}={_attr(v)}" for k, v in op.attrs.items()
                          if not k.startswith("has_"))
        args = ", ".join([value(n) for n in op.inputs] + ([attrs] if attrs else []))
        lines.append(f"{', '.join(value(o) for o in op.outputs)}")
        lines.append(f"   = {op.name}({args});")
    lines.append("} // %kernel_math")
    return "\n".join(lines) + "\n"


def format_op(op: Op) -> str:
    targets = ", ".join(op.outputs)
    if op.name == "size":
        return f"{targets} = {op.inputs[0]}.size({op.attrs['dim']})"
    spec = get_spec(op.name)
    operands = iter(op.inputs)
    args: list[str] = []
    kwargs: list[str] = []
    positional = True  # operands print positionally until the first attribute
    for p in spec.params:
        if p.kind in OPERAND_KINDS:
            if p.kind == "TL":
                text = "[" + ", ".join(operands) + "]"
            elif p.kind in ("T?", "S?"):
                positional = False
                if not op.attrs.get(f"has_{p.name}"):
                    continue
                text = next(operands)
            else:
                text = next(operands)
            if positional:
                args.append(text)
            else:
                kwargs.append(f"{p.name}={text}")
        else:
            positional = False
            if p.name in op.attrs and not (op.attrs[p.name] is None and p.default is None):
                kwargs.append(f"{p.name}={_attr(op.attrs[p.name])}")
    return f"{targets} = fd.ops.{op.name}({', '.join(args + kwargs)})"


def format_input(meta: InputMeta, device: str = "cuda:0") -> str:
    if not isinstance(meta, TensorMeta):
        return format_number(meta.value if meta.value is not None else 0)
    fill = meta.fill or {}
    fn = fill.get("fn", "randn")
    dtype = f"torch.{_TORCH_NAME[meta.dtype]}"
    converted = ""  # drawn in another dtype, then converted
    if meta.dtype.is_bool:
        base_dtype = "torch.float32"
    elif meta.dtype in _DRAWN_AS_FLOAT32:
        base_dtype, converted = "torch.float32", f".to({dtype})"
    elif meta.dtype is DType.float4_e2m1fn_x2:  # packed fp4: torch makes none at random
        fn, base_dtype = "zeros", dtype
    elif fn in ("randn", "rand") and meta.dtype.is_int:
        fn = "randint"
        base_dtype = dtype
    else:
        base_dtype = dtype
    storage = _storage_extent(meta)
    size = f"({storage},)" if meta.strides != contiguous_strides(meta.shape) else \
        f"{tuple(meta.shape)}"
    if fn == "randint":
        low, high = fill.get("low", 0), fill.get("high", 10)
        text = f"torch.randint({low}, {high}, {size}, dtype={base_dtype}, device='{device}')"
    elif fn == "full":
        text = (f"torch.full({size}, {format_number(fill.get('value', 0))}, dtype={base_dtype}, "
                f"device='{device}')")
    elif fn in ("zeros", "ones", "rand", "randn", "empty"):
        text = f"torch.{fn}({size}, dtype={base_dtype}, device='{device}')"
    else:
        text = f"torch.randn({size}, dtype={base_dtype}, device='{device}')"
    text += converted
    if meta.strides != contiguous_strides(meta.shape):
        text += f".as_strided({tuple(meta.shape)}, {tuple(meta.strides)})"
    if meta.dtype.is_bool:
        text += f" > {format_number(fill.get('threshold', 0.5))}"
    return text


def _storage_extent(meta: TensorMeta) -> int:
    if not all(meta.shape):
        return 0
    return 1 + sum((e - 1) * s for e, s in zip(meta.shape, meta.strides))
