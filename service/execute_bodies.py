"""POST /v1/execute's JSON (KServe-v2) bodies: decoded, and their responses encoded, away from
the event loop.

Validating a body and rendering a response are each one C call (pydantic, ``json.dumps``) that
holds the GIL for as long as the body is big: in a thread they would stall the loop all the same.
Large ones run in the planner processes (``service.processes.planners``), small ones in a thread,
where the call is shorter than a poll. Nothing here imports torch: tensors travel as numpy arrays,
which pickle as one buffer each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from fusecut.service.models import ExecuteRequest
from fusecut.service.problems import Problem, validation_problem
from fusecut.service.settings import Settings
from fusecut.wire.json_tensors import ITEMSIZES, check_header, decode, encode

# Bodies (and responses, in values) up to this size are handled in a thread: well under 10 ms
# of GIL-holding C calls, and no wait behind plans for a planner process.
INLINE_BODY_BYTES = 1 << 20
INLINE_VALUES = 50_000


@dataclass(frozen=True)
class ExecuteInputs:
    """A valid execute body: what to run (a definition text, a wire-JSON definition as
    validated JSON text, or a plan id), the options as JSON text, and each input's values and
    datatype."""

    definition_text: str | None
    definition_json: str | None
    plan_id: str | None
    options_json: str
    arrays: dict[str, tuple[np.ndarray, str]]


def decode_execute(raw: bytes, settings: Settings) -> ExecuteInputs:
    """The body ``raw`` validated, its sizes checked against the limits before any tensor's data
    is read, and its tensors decoded; a Problem (or InputError) names what is wrong."""
    try:
        body = ExecuteRequest.model_validate_json(raw)
    except ValidationError as e:
        raise validation_problem(list(e.errors())) from None
    names = [t.name for t in body.inputs]
    if len(names) > settings.max_ops:  # a definition has no more inputs than ops it may have
        raise Problem(422, "inputs do not match", f"{len(names)} input tensors; a definition "
                                                  f"takes at most {settings.max_ops}")
    if len(set(names)) != len(names):
        raise Problem(422, "inputs do not match", f"input names repeat: {names}")
    items = [{"name": t.name, "shape": t.shape, "datatype": t.datatype, "data": t.data}
             for t in body.inputs]
    max_elements = settings.max_tensor_bytes // 8
    total = sum(check_header(item, max_elements) * ITEMSIZES[item["datatype"]]
                for item in items)
    if total > settings.max_tensor_bytes:
        raise Problem(413, "tensors too large", f"the inputs hold {total} bytes; the limit is "
                                                f"{settings.max_tensor_bytes}")
    arrays = {item["name"]: (decode(item, max_elements), item["datatype"]) for item in items}
    definition = body.definition
    return ExecuteInputs(definition if isinstance(definition, str) else None,
                         None if definition is None or isinstance(definition, str)
                         else definition.model_dump_json(),
                         body.plan_id, body.options.model_dump_json(), arrays)


def encode_execute(plan_id: str, backend: str, outputs: list[tuple[str, np.ndarray, str]],
                   timings: list[dict[str, Any]]) -> bytes:
    """The response body: the outputs as JSON tensors, with the plan id, backend and timings."""
    body = {"plan_id": plan_id, "backend": backend,
            "outputs": [encode(name, values, datatype) for name, values, datatype in outputs],
            "segments": timings}
    return json.dumps(body, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()
