"""Wire format v1: the JSON form of a fusion definition and of input metadata.

Pydantic models live here and only here (the wire). ``fusion_to_json`` / ``fusion_from_json``
convert to and from the IR; decoding replays every op through the builder, so JSON gets exactly
the checks text does. The canonical form is compact JSON with sorted keys; its SHA-256 is the
fusion id. Scalar references inside attributes are ``{"scalar": "S3"}``; non-finite floats are
the strings ``"inf"``, ``"-inf"`` and ``"nan"``.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WithJsonSchema,
)

from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.builder import FusionBuilder, TensorHandle
from fusecut.optimizer.ir.descriptor import allocation_contiguity
from fusecut.optimizer.ir.dtypes import INT_RANGES, DType
from fusecut.optimizer.ir.fusion import Fusion, Ref
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, contiguous_strides


class ComplexNumber(BaseModel):
    """A complex constant: real and imaginary parts (non-finite ones as "inf", "-inf", "nan")."""

    model_config = ConfigDict(extra="forbid")
    re: float | Literal["inf", "-inf", "nan"]
    im: float | Literal["inf", "-inf", "nan"]


def _number_form(value: Any) -> str | None:
    return "boolean" if isinstance(value, bool) else "integer" if isinstance(value, int) else \
        "real number" if isinstance(value, float) else \
        "non-finite number" if isinstance(value, str) else \
        "complex number" if isinstance(value, dict | ComplexNumber) else None


_NON_FINITE = {"enum": ["inf", "-inf", "nan"], "type": "string"}

# Told apart by JSON type, so that an error names what the value was read as ("value
# (non-finite number): Input should be 'inf', '-inf' or 'nan'"), not one error per branch of
# a plain union ("value.bool", "value.literal['inf','-inf','nan']"). The schema stays anyOf:
# an integer is a JSON Schema number too.
Number = Annotated[
    Annotated[bool, Tag("boolean")] | Annotated[int, Tag("integer")]
    | Annotated[float, Tag("real number")]
    | Annotated[Literal["inf", "-inf", "nan"], Tag("non-finite number")]
    | Annotated[ComplexNumber, Tag("complex number")],
    Discriminator(_number_form, custom_error_type="number",
                  custom_error_message='a number, "inf", "-inf" or "nan", or a complex number '
                                       '{"re": ..., "im": ...}'),
    WithJsonSchema({"anyOf": [
        {"type": "boolean"}, {"type": "integer"}, {"type": "number"}, _NON_FINITE,
        {"type": "object", "additionalProperties": False, "required": ["re", "im"],
         "properties": {part: {"anyOf": [{"type": "number"}, _NON_FINITE]}
                        for part in ("re", "im")}}]})]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# other names people give dtypes (torch's, nvFuser's, the usual abbreviations): a suggestion,
# never accepted in their place
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "f16": "float16", "float": "float32",
                 "fp32": "float32", "f32": "float32", "single": "float32", "double": "float64",
                 "fp64": "float64", "f64": "float64", "bf16": "bfloat16", "long": "int64",
                 "i64": "int64", "i32": "int32", "int": "int64 (nvFuser's Int) or int32",
                 "boolean": "bool", "bool_": "bool", "cfloat": "complex64",
                 "complexfloat": "complex64", "cdouble": "complex128",
                 "complexdouble": "complex128", "fp8": "float8_e4m3fn or float8_e5m2"}


def _known_dtype(value: Any) -> Any:
    """A dtype name that is not one: what it is called here, if it is another name for one
    ("half": float16), in the error."""
    if isinstance(value, str) and value not in DType._value2member_map_:
        bare = value.strip().lower().removeprefix("torch.").removeprefix("datatype.")
        meant = bare if bare in DType._value2member_map_ else DTYPE_ALIASES.get(bare)
        hint = f"; did you mean {meant}?" if meant else ""
        raise ValueError(f"unknown dtype {value!r}{hint} (dtypes: "
                         f"{', '.join(d.value for d in DType)})")
    return value


WireDType = Annotated[DType, BeforeValidator(_known_dtype)]


class TensorDecl(_Strict):
    """A fusion input tensor as ``define_tensor`` declares it."""

    id: str
    dtype: WireDType
    shape: list[int] = Field(description="-1 for a symbolic extent, 1 for a broadcast axis")
    contiguity: list[bool | None] | None = Field(
        None, description="per axis in allocation order (the stride order's, when given), as "
                          "nvFuser reads it")
    stride_order: list[int] | None = None


class ScalarDecl(_Strict):
    """A scalar: a constant (value given) or a fusion input (value null)."""

    id: str
    dtype: WireDType
    value: Number | None = None


class OpDecl(_Strict):
    name: str
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str]
    attrs: dict[str, Any] = Field(default_factory=dict)


class StreamAxis(_Strict):
    tensor: str
    axis: int


class FusionJSON(_Strict):
    """A fusion definition, wire format v1."""

    version: Literal[1] = 1
    inputs: list[str] = Field(description="fusion inputs in order: tensor and scalar ids")
    tensors: list[TensorDecl] = Field(description="declarations of the input tensors")
    scalars: list[ScalarDecl] = Field(default_factory=list)
    ops: list[OpDecl]
    outputs: list[str]
    stream_parallel: list[StreamAxis] = Field(default_factory=list)
    aliases: dict[str, str] = Field(default_factory=dict,
                                    description="output id -> input id it updates in place")


class InputMetaJSON(_Strict):
    """Concrete metadata of one fusion input: a tensor (shape, dtype, strides) or a scalar."""

    dtype: WireDType
    shape: list[int] | None = None
    strides: list[int] | None = None
    value: Number | None = None


# ---- IR -> JSON --------------------------------------------------------------------------------


def _num_out(v: Any) -> Any:
    if isinstance(v, complex):
        return {"re": _real_out(v.real), "im": _real_out(v.imag)}
    return _real_out(v)


def _real_out(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _num_in(v: Any) -> Any:
    if isinstance(v, ComplexNumber):
        return complex(_real_in(v.re), _real_in(v.im))
    if isinstance(v, dict) and set(v) == {"re", "im"}:
        return complex(_real_in(v["re"]), _real_in(v["im"]))
    return _real_in(v)


def _real_in(v: Any) -> Any:
    return float(v) if isinstance(v, str) else v


def _attr_out(v: Any) -> Any:
    if isinstance(v, Ref):
        return {"scalar": v.name}
    if isinstance(v, DType):
        return v.value
    if isinstance(v, (list, tuple)):
        return [_attr_out(x) for x in v]
    return _num_out(v)


def _attr_in(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) != {"scalar"} or not isinstance(v["scalar"], str):
            raise DefinitionError(f"attribute value {v!r}: objects must be {{\"scalar\": id}}")
        return Ref(v["scalar"])
    if isinstance(v, list):
        return [_attr_in(x) for x in v]
    return v


def fusion_to_model(fusion: Fusion) -> FusionJSON:
    used = {r for op in fusion.ops for r in op.refs()} | set(fusion.inputs)
    return FusionJSON(
        inputs=list(fusion.inputs),
        tensors=[TensorDecl(id=n, dtype=t.dtype,
                            shape=list(t.declared_shape) if t.declared_shape is not None
                            else [1 if b else -1 for b in t.broadcast],
                            contiguity=allocation_contiguity(t.contiguity, t.stride_order)
                            if t.contiguity is not None else None,
                            stride_order=list(t.stride_order) if t.stride_order else None)
                 for n, t in fusion.tensors.items() if n in fusion.inputs],
        scalars=[ScalarDecl(id=n, dtype=s.dtype, value=_num_out(s.value))
                 for n, s in fusion.scalars.items()
                 if n in used and (s.value is not None or n in fusion.inputs)],
        ops=[OpDecl(name=op.name, inputs=list(op.inputs), outputs=list(op.outputs),
                    attrs={k: _attr_out(v) for k, v in op.attrs.items()}) for op in fusion.ops],
        outputs=list(fusion.outputs),
        stream_parallel=[StreamAxis(tensor=t, axis=a) for t, a in fusion.stream_axes],
        aliases=dict(fusion.aliases),
    )


def fusion_to_json(fusion: Fusion) -> dict[str, Any]:
    return fusion_to_model(fusion).model_dump(mode="json")


def canonical_json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def fusion_id(fusion: Fusion) -> str:
    """SHA-256 of the canonical JSON form (input metadata not included)."""
    return hashlib.sha256(canonical_json(fusion_to_json(fusion)).encode()).hexdigest()


# ---- JSON -> IR --------------------------------------------------------------------------------


def fusion_from_json(data: dict[str, Any] | FusionJSON, max_ops: int = 100_000) -> Fusion:
    model = data if isinstance(data, FusionJSON) else FusionJSON.model_validate(data)
    b = FusionBuilder(max_ops)
    tensors = {t.id: t for t in model.tensors}
    scalars = {s.id: s for s in model.scalars}
    if len(tensors) != len(model.tensors) or len(scalars) != len(model.scalars):
        raise DefinitionError("duplicate ids among tensors or scalars")
    for name in model.inputs:
        if name in tensors:
            t = tensors.pop(name)
            b.define_tensor(t.shape, t.contiguity, t.dtype, stride_order=t.stride_order, name=name)
        elif name in scalars and scalars[name].value is None:
            b.define_scalar(None, scalars.pop(name).dtype, name=name)
        else:
            raise DefinitionError(f"input {name!r} has no tensor declaration or value-less scalar")
        if name not in b.fusion.tensors and name not in b.fusion.scalars:
            raise DefinitionError(f"input id {name!r} is not a valid fresh identifier")
    if tensors:
        raise DefinitionError(f"tensors {sorted(tensors)} are declared but not inputs")
    for s in scalars.values():
        if s.value is None:
            raise DefinitionError(f"scalar {s.id} has no value and is not an input")
        handle = b.define_scalar(_num_in(s.value), s.dtype, name=s.id)
        if handle.name != s.id:
            raise DefinitionError(f"scalar id {s.id!r} is not a valid fresh identifier")
    for op in model.ops:
        b.add_op(op.name, op.inputs, {k: _attr_in(v) for k, v in op.attrs.items()}, op.outputs)
    for k, out in enumerate(model.outputs):
        if out not in b.fusion.tensors:
            raise DefinitionError(f"output {out!r} is not a tensor of the definition")
        first = model.outputs.index(out) == k  # an output listed twice updates its input once
        b.add_output(_handle(b, out), _handle(b, model.aliases[out])
                     if out in model.aliases and first else None)
    if set(model.aliases) - set(model.outputs):
        raise DefinitionError("aliases name tensors that are not outputs")
    for axis in model.stream_parallel:
        if axis.tensor not in b.fusion.tensors:
            raise DefinitionError(f"stream_parallel names unknown tensor {axis.tensor!r}")
        b.parallelize(_handle(b, axis.tensor), axis.axis, "stream")
    if not b.fusion.outputs:
        raise DefinitionError("the definition has no outputs")
    return b.fusion


def _handle(b: FusionBuilder, name: str):
    if name not in b.fusion.tensors:
        raise DefinitionError(f"{name!r} is not a tensor of the definition")
    return TensorHandle(b, name)


# ---- input metadata ----------------------------------------------------------------------------


def meta_to_json(meta: InputMeta) -> dict[str, Any]:
    if isinstance(meta, TensorMeta):
        return {"dtype": meta.dtype.value, "shape": list(meta.shape),
                "strides": list(meta.strides)}
    return {"dtype": meta.dtype.value, "value": _num_out(meta.value)}


def checked_scalar(dtype: DType, value: Any) -> Any:
    """A scalar input's value, checked against its dtype: an integer type holds integers in
    its range (a plan for 2**64 as an int64 would be made, stored, and fail to run)."""
    if value is None:
        return None
    if dtype.is_bool and not isinstance(value, bool):
        raise InputError(f"a bool scalar's value must be true or false, got {value!r}")
    if dtype in INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"a {dtype.value} scalar's value must be an integer, got {value!r}")
        low, high = INT_RANGES[dtype]
        if not low <= value <= high:
            raise InputError(f"scalar value {value} is out of the range of {dtype.value} "
                             f"[{low}, {high}]")
    return value


def meta_from_json(data: dict[str, Any] | InputMetaJSON) -> InputMeta:
    try:
        m = data if isinstance(data, InputMetaJSON) else InputMetaJSON.model_validate(data)
    except ValidationError as e:  # one line naming the field, not pydantic's report
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise InputError(f"input metadata {data!r:.80}: {where + ': ' if where else ''}"
                         f"{first.get('msg', 'invalid').removeprefix('Value error, ')}") from None
    if m.shape is None:
        if m.strides is not None:
            raise InputError("a scalar input has no strides")
        return ScalarMeta(m.dtype, checked_scalar(m.dtype, _num_in(m.value)))
    if m.value is not None:
        raise InputError("a tensor input has no value")
    if any(e < 0 for e in m.shape):
        raise InputError(f"shape {m.shape} has a negative extent")
    if len(m.shape) > 16:
        raise InputError(f"shape {m.shape} has more than 16 axes")
    strides = contiguous_strides(m.shape) if m.strides is None else tuple(m.strides)
    if len(strides) != len(m.shape):
        raise InputError(f"strides {list(strides)} do not match shape {m.shape}")
    if any(s < 0 for s in strides):
        raise InputError(f"strides {list(strides)} must be non-negative")
    return TensorMeta(tuple(m.shape), strides, m.dtype)
