"""Request bodies of the HTTP API (pydantic: the wire only). Their JSON Schema is published in
the service's OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    create_model,
    model_serializer,
)

from fusecut.optimizer.ir.wire import FusionJSON, InputMetaJSON
from fusecut.optimizer.options import DEVICE_OVERRIDES, PLAN_OPTIONS, Option


class _FiniteStrict(BaseModel):
    # Finite numbers only: NaN and Infinity would make plans that are not JSON, and pydantic
    # writes both as null, which made them share a cache key.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# On the wire these two may be absent (null): time_limit_s then takes this service's default
# (settings.default_time_limit_s: the declared default unless a deployment sets its own), kinds
# every kind. Their wire default stays null, not the value: a body's request key hashes its
# options as parsed, and a value there would change the key of every stored request.
ABSENT_MEANS_DEFAULT = frozenset({"time_limit_s", "kinds"})


def declared_field(option: Option) -> tuple[Any, Any]:
    """The pydantic (annotation, FieldInfo) of a declared plan option: its type, default,
    JSON Schema constraints and description, all from the declaration."""
    constraints: dict[str, Any] = {}
    if option.range is not None:
        constraints["gt" if option.range.low_open else "ge"] = option.range.low
        constraints["le"] = option.range.high
    if option.max_length is not None:
        constraints["max_length"] = option.max_length
    if option.pattern is not None:
        constraints["pattern"] = option.pattern
    if option.type is dict:  # a nested model, described by its own docstring
        model = NESTED_MODELS[option.name]
        return model, Field(default_factory=model)
    if option.type is tuple:
        # plain names: an unknown kind is refused by the planner, which says which are known
        annotation: Any = list[str]
    elif option.choices and not option.ignore_case:  # any case: no JSON Schema enum says so
        annotation = Literal[option.choices]
    else:
        annotation = option.type
    if option.default is None or option.name in ABSENT_MEANS_DEFAULT:
        return annotation | None, Field(None, description=option.description, **constraints)
    return annotation, Field(option.default, description=option.description, **constraints)


def declared_model(name: str, option: Option) -> type[BaseModel]:
    """The request model of a dict option, named ``name``: each of its fields optional (absent:
    the device profile's own value)."""
    return create_model(name, __base__=_FiniteStrict, __module__=__name__,
                        __doc__=option.description,
                        **{f.name: declared_field(f) for f in option.fields})


DeviceOverrides = declared_model("DeviceOverrides", DEVICE_OVERRIDES)
NESTED_MODELS = {DEVICE_OVERRIDES.name: DeviceOverrides}
# The options of a request, field for field the declaration (optimizer.options).
PlanOptionsModel = create_model("PlanOptionsModel", __base__=_FiniteStrict, __module__=__name__,
                                **{o.name: declared_field(o) for o in PLAN_OPTIONS})


def _definition_form(value: Any) -> str | None:
    # a dict when a body is read, a FusionJSON when a request is written back (its key)
    return "nvFuser text" if isinstance(value, str) else \
        "wire JSON" if isinstance(value, dict | FusionJSON) else None


# A definition is text or wire JSON, told apart by its JSON type, so that an error names the
# form it was read as ("definition (wire JSON).inputs"), not pydantic's validators of a plain
# union ("definition.constrained-str", "definition.FusionJSON.inputs": issue 32).
Definition = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("nvFuser text")]
    | Annotated[FusionJSON, Tag("wire JSON")],
    Discriminator(_definition_form, custom_error_type="definition_form",
                  custom_error_message="a definition is nvFuser text (a string) or wire JSON "
                                       "(an object)")]


def _no_default(schema: dict[str, Any]) -> None:
    """An optional field that may not be null: absent is the default, not ``null``."""
    schema.pop("default", None)


class PlanRequest(_FiniteStrict):
    definition: Definition = Field(description="nvFuser Python text or wire JSON v1")
    inputs: list[InputMetaJSON] | None = Field(
        None, description="metadata of each fusion input; taken from the text's `inputs = "
                          "[...]` list when absent; -1 for an extent of any size (a batch, a "
                          "sequence length): the plan then holds for every size of it and "
                          "lists where in `valid_for`")
    size_hint: int = Field(None, ge=2, le=2**31 - 1,  # type: ignore
                           json_schema_extra=_no_default,
                           description="the size the plan is searched at for every -1 extent "
                                       "(default 1024)")
    options: PlanOptionsModel = Field(default_factory=PlanOptionsModel)

    @model_serializer(mode="wrap")
    def _absent_hint(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a body's request key hashes this dump: one without -1 extents keeps the key it had
        # before size_hint existed
        data = handler(self)
        if data.get("size_hint") is None:
            data.pop("size_hint", None)
        return data


class JSONTensor(_FiniteStrict):
    """A tensor in the KServe-v2 style: row-major data."""

    name: str
    shape: list[int]
    datatype: str = Field(description="BOOL, INT32, INT64, FP16, BF16, FP32 or FP64")
    data: list[Any]


class ExecuteRequest(_FiniteStrict):
    # a definition or a plan id, not both
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["definition"]},
                                                           {"required": ["plan_id"]}]})

    definition: Definition = Field(None, json_schema_extra=_no_default)  # type: ignore
    plan_id: str = Field(None, pattern=r"^[0-9a-f]{32}$",  # type: ignore
                         json_schema_extra=_no_default,
                         description="a plan made before (instead of a definition)")
    inputs: list[JSONTensor] = Field(description="one per fusion input, named as the input")
    options: PlanOptionsModel = Field(default_factory=PlanOptionsModel)
