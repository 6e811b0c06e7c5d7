"""Request bodies of the HTTP API (pydantic: the wire only). Their JSON Schema is published in
the service's OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fusecut.optimizer.ir.wire import FusionJSON, InputMetaJSON


class _FiniteStrict(BaseModel):
    # Finite numbers only: NaN and Infinity would make plans that are not JSON, and pydantic
    # writes both as null, which made them share a cache key.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DeviceOverrides(_FiniteStrict):
    """Fields of the device profile to replace, each within what a real GPU could have."""

    bandwidth: float | None = Field(None, ge=1e9, le=1e15, description="bytes/s")
    sm_count: int | None = Field(None, ge=1, le=10_000)
    smem_per_block: int | None = Field(None, ge=1024, le=2**24, description="bytes")
    launch_overhead_s: float | None = Field(None, ge=1e-8, le=1e-1)
    persistent_budget: int | None = Field(None, ge=1024, le=2**24, description="bytes")
    compute_rate: float | None = Field(None, ge=1e9, le=1e17, description="fp32 ops/s")
    arch: str | None = Field(None, pattern=r"^sm_[0-9]{2,3}a?$")


class PlanOptionsModel(_FiniteStrict):
    segmenter: Literal["cpsat", "greedy", "mincut"] = "cpsat"
    time_limit_s: float | None = Field(None, gt=0, le=3600, description="solver seconds")
    device: str = Field("H100", max_length=32,
                        description="device profile: H100, H200 or A100")
    device_overrides: DeviceOverrides = Field(default_factory=DeviceOverrides)
    launch_weight: float = Field(1.0, ge=0, le=1e6)
    compute_weight: float = Field(1.0, ge=0, le=1e6)
    seed: int = Field(0, ge=0, le=2**31 - 1, description="solver random seed (int32)")
    kinds: list[str] | None = Field(None, description="segment kinds the plan may use")
    num_streams: int = Field(4, ge=1, le=64, description="CUDA streams a stream-parallel loop "
                                                         "cycles through (stream lowering)")


Definition = Annotated[str, Field(min_length=1)] | FusionJSON


def _no_default(schema: dict[str, Any]) -> None:
    """An optional field that may not be null: absent is the default, not ``null``."""
    schema.pop("default", None)


class PlanRequest(_FiniteStrict):
    definition: Definition = Field(description="nvFuser Python text or wire JSON v1")
    inputs: list[InputMetaJSON] | None = Field(
        None, description="metadata of each fusion input; taken from the text's `inputs = "
                          "[...]` list when absent")
    options: PlanOptionsModel = Field(default_factory=PlanOptionsModel)


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
