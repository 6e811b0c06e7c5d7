"""Request bodies of the HTTP API (pydantic: the wire only). Their JSON Schema is published in
the service's OpenAPI document."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from optimizer.ir.wire import FusionJSON, InputMetaJSON


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanOptionsModel(_Strict):
    segmenter: Literal["cpsat", "greedy", "mincut"] = "cpsat"
    time_limit_s: float | None = Field(None, gt=0, description="solver seconds")
    device: str = Field("H100", description="device profile: H100, H200 or A100")
    device_overrides: dict[str, float | int | str] = Field(default_factory=dict)
    launch_weight: float = Field(1.0, ge=0)
    compute_weight: float = Field(1.0, ge=0)
    seed: int = 0
    kinds: list[str] | None = Field(None, description="segment kinds the plan may use")


class PlanRequest(_Strict):
    definition: str | FusionJSON = Field(description="nvFuser Python text or wire JSON v1")
    inputs: list[InputMetaJSON] | None = Field(
        None, description="metadata of each fusion input; taken from the text's `inputs = "
                          "[...]` list when absent")
    options: PlanOptionsModel = Field(default_factory=PlanOptionsModel)


class JSONTensor(_Strict):
    """A tensor in the KServe-v2 style: row-major data."""

    name: str
    shape: list[int]
    datatype: str = Field(description="BOOL, INT32, INT64, FP16, BF16, FP32 or FP64")
    data: list[Any]


class ExecuteRequest(_Strict):
    definition: str | FusionJSON | None = None
    plan_id: str | None = Field(None, description="a plan made before (instead of a definition)")
    inputs: list[JSONTensor] = Field(description="one per fusion input, named as the input")
    options: PlanOptionsModel = Field(default_factory=PlanOptionsModel)
