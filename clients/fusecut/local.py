"""In-process planning and execution: what ``fd.plan``, ``fd.execute`` and the CLI run."""

from __future__ import annotations

import json
from typing import Any

import torch

from fusecut.plan import Plan
from optimizer.ir.fusion import Fusion
from optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta
from optimizer.ir.wire import meta_from_json
from optimizer.planner import PlanOptions, make_plan
from runtime.executor import Execution, execute_plan
from runtime.tensors import meta_of


def as_metadata(inputs: list[Any]) -> list[InputMeta]:
    """Input metadata from tensors, numbers, InputMeta objects or wire dicts."""
    out: list[InputMeta] = []
    for x in inputs:
        if isinstance(x, (TensorMeta, ScalarMeta)):
            out.append(x)
        elif isinstance(x, dict):
            out.append(meta_from_json(x))
        else:
            out.append(meta_of(x))
    return out


def plan(fusion: Fusion, inputs: list[Any], cache: dict | None = None, **options: Any) -> Plan:
    metas = as_metadata(inputs)
    opts = PlanOptions(**options)
    key = (tuple(metas), json.dumps(opts.to_json(), sort_keys=True))
    if cache is not None and key in cache:
        return cache[key]
    internal = make_plan(fusion, metas, opts)
    result = Plan(internal.to_json(), internal)
    if cache is not None:
        cache[key] = result
    return result


def execute(fusion: Fusion, inputs: list[Any], *, cache: dict | None = None,
            return_execution: bool = False, **options: Any) -> list[torch.Tensor] | Execution:
    """Plan (cached per input metadata) and run ``fusion`` on real inputs."""
    from runtime.backend import runner_for

    planned = plan(fusion, inputs, cache, **options)
    runner, backend = runner_for(inputs)
    result = execute_plan(planned._internal, list(inputs), runner, backend)
    return result if return_execution else result.outputs
