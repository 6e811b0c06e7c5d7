"""Planning, done in a planner process (``service.processes.planners``): validate a POST /v1/plan
body (or take an execution's definition and tensor metadata), parse the definition, check sizes,
look the plan up in the store, plan, and serialize.

Every step here is CPU work on untrusted input, and several (JSON and pydantic parsing, pickling)
are single C calls that hold the GIL for seconds on a large body; run in the service's process,
they stalled every other request. Here they stall only this process, and what comes back is bytes
and a small summary, cheap to receive. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from fusecut.optimizer.errors import FusecutError, InputError, counted
from fusecut.optimizer.gcpause import gc_paused
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta
from fusecut.optimizer.ir.nvtext import parse_text
from fusecut.optimizer.ir.wire import (
    FusionJSON,
    canonical_json,
    checked_scalar,
    fusion_from_json,
    fusion_to_json,
    meta_from_json,
    meta_to_json,
)
from fusecut.optimizer.options import TIME_LIMIT_S
from fusecut.optimizer.plan.plan import Plan, inputs_json, plan_key
from fusecut.optimizer.plan.plan import request_key as plan_request_key
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.optimizer.profiles import get_profile
from fusecut.service.cache.store import lookup
from fusecut.service.models import PlanOptionsModel, PlanRequest
from fusecut.service.problems import TITLES, Problem, validation_problem
from fusecut.service.processes.planners import announce_time_limit
from fusecut.service.settings import Settings
from fusecut.service.symbolic import has_symbolic, symbolic_inputs

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Planned:
    """What the service process needs: the plan's bytes to store and send, and a summary."""

    plan_id: str
    fusion_id: str
    segmenter: str
    body: bytes  # the plan JSON (strict: no NaN or Infinity)
    request: str  # the definition (wire JSON) and input metadata that made it, as JSON
    request_key: str  # the hash of a POST /v1/plan body ("" for an execution's plan)
    cache: str  # "hit" (stored before: body is empty) or "miss"
    metrics: dict[str, Any]
    inputs: int = 0  # how many inputs the plan takes (0 on a "hit")


@dataclass(frozen=True)
class Refusal:
    status: int
    title: str
    detail: str
    extra: dict[str, Any]


def refusing(fn, *args):
    """``fn(*args)``, or the Refusal its Problem or fusecut error says: returned, not raised,
    since it pickles simply (a Problem would not come back from a planner process)."""
    try:
        return fn(*args)
    except Problem as e:
        return Refusal(e.status, e.title, e.detail, e.extra)
    except FusecutError as e:
        title = next((t for cls, t in TITLES.items() if isinstance(e, cls)), "invalid request")
        return Refusal(422, title, str(e), {})


def plan_body(raw: bytes, settings: Settings, use_cache: bool = True) -> Planned:
    """Plan the POST /v1/plan body ``raw`` (run through ``refusing``), unless ``use_cache`` and
    the cache has it. The collector is paused throughout: parsing and planning build large
    structures that all survive the request, and its full passes over them took about a fifth
    of a 20,000-op request's CPU time."""
    with gc_paused():
        return _plan_body(raw, settings, use_cache)


def _plan_body(raw: bytes, settings: Settings, use_cache: bool) -> Planned:
    try:
        body = PlanRequest.model_validate_json(raw)
    except ValidationError as e:
        raise validation_problem(list(e.errors())) from None
    request_key = plan_request_key(body.model_dump_json().encode())
    known = lookup(settings.cache_location, request_key=request_key) if use_cache else None
    if known is not None:
        return Planned(known[0], known[1], known[2], b"", "", request_key, "hit", {})
    options = plan_options(body.options, settings)
    announce_time_limit(options.time_limit_s)
    fusion, text_inputs, name = parse_definition(body.definition, settings.max_ops)
    symbolic: tuple[tuple[int, int], ...] = ()  # the -1 extents (service.symbolic)
    if body.inputs is not None:
        if len(body.inputs) != len(fusion.inputs):
            raise Problem(422, "inputs do not match",
                          f"the definition has {counted(len(fusion.inputs), 'input')} "
                          f"({', '.join(fusion.inputs[:8])}); `inputs` has {len(body.inputs)}")
        if has_symbolic(body.inputs):
            metas, symbolic = symbolic_inputs(fusion, body.inputs, body.size_hint)
        else:
            metas = [meta_from_json(m) for m in body.inputs]
    elif text_inputs is not None:
        metas = text_inputs
    else:
        raise Problem(422, "no input metadata",
                      "pass `inputs` (shape, dtype, strides per fusion input) or a "
                      "definition text with an `inputs = [...]` list")
    if body.size_hint is not None and not symbolic:
        raise Problem(422, "invalid request", "`size_hint` is the size planned for -1 extents, "
                      "and `inputs` has none")
    return _plan_parsed(fusion, metas, options, name, request_key, settings, use_cache,
                        symbolic)


def plan_for_tensors(definition: str, given: dict[str, dict[str, Any]], options_json: str,
                     settings: Settings, use_cache: bool = True) -> Planned:
    """Plan a definition (nvFuser text or wire JSON text) for the tensors of an execution,
    described by ``given`` (see ``describe_tensors``), in a planner process like ``plan_body``.
    """
    with gc_paused():
        try:
            options = plan_options(PlanOptionsModel.model_validate_json(options_json), settings)
        except ValidationError as e:
            raise validation_problem(list(e.errors())) from None
        announce_time_limit(options.time_limit_s)
        if definition.lstrip().startswith("{"):
            try:
                definition = FusionJSON.model_validate_json(definition)
            except ValidationError as e:
                raise validation_problem(list(e.errors())) from None
        fusion, _, name = parse_definition(definition, settings.max_ops)
        return _plan_parsed(fusion, metas_for(fusion, given), options, name, None, settings,
                            use_cache)


def metas_for(fusion: Fusion, given: dict[str, dict[str, Any]]) -> list[InputMeta]:
    """The input metadata of an execution's tensors: a scalar input's value from its
    one-element tensor, and stride 0 on the axes the definition declares broadcast (where the
    worker expands the dense tensors that travelled: wire.tensors.arguments)."""
    missing = [n for n in fusion.inputs if n not in given]
    extra = sorted(set(given) - set(fusion.inputs))
    if missing or extra:
        raise InputError(f"the definition's inputs are {list(fusion.inputs)}; missing {missing}, "
                         f"unexpected {extra}")
    metas: list[InputMeta] = []
    for name in fusion.inputs:
        shape, strides = tuple(given[name]["shape"]), list(given[name]["strides"])
        if name in fusion.scalars:
            if "value" not in given[name]:
                raise InputError(f"scalar input {name} must be a one-element tensor, got shape "
                                 f"{list(shape)}")
            dtype = fusion.scalars[name].dtype
            metas.append(ScalarMeta(dtype, checked_scalar(dtype, given[name]["value"])))
            continue
        declared = fusion.tensors[name].broadcast
        if len(declared) == len(shape):
            strides = [0 if b and e != 1 else s for b, e, s in zip(declared, shape, strides)]
        metas.append(TensorMeta(shape, tuple(strides), DType(given[name]["dtype"])))
    return metas


def _plan_parsed(fusion: Fusion, metas: list[InputMeta], options: PlanOptions, name: str | None,
                 request_key: str | None, settings: Settings, use_cache: bool = True,
                 symbolic: tuple[tuple[int, int], ...] = ()) -> Planned:
    """The stored plan for a parsed fusion (a "hit", naming it, unless not ``use_cache``) or a
    new one (a "miss"); ``symbolic``: the (input, axis) extents asked for as -1, ``metas``
    holding their stand-in size (service.symbolic)."""
    check_sizes(fusion, metas, settings.max_plan_tensor_bytes)
    metas_json = [meta_to_json(m) for m in metas]
    definition = fusion_to_json(fusion)  # converted once: the id, and the stored request
    fid = hashlib.sha256(canonical_json(definition).encode()).hexdigest()  # as wire.fusion_id
    profile = get_profile(options.device, options.device_overrides)
    pid = plan_key(fid, inputs_json(metas, symbolic), options.to_json(), profile.to_json())
    known = lookup(settings.cache_location, plan_id=pid) if use_cache else None
    if known is not None:
        return Planned(pid, fid, known[2], b"", "", request_key or "", "hit", {})
    plan = make_plan(fusion, metas, options)
    if symbolic:  # holds for any size of them: its id and JSON say so
        plan = replace(plan, symbolic=symbolic)
    plan.fusion_id = fid  # known: not converted again
    data, body_bytes, request = serialize(plan, metas_json, name, definition)
    return Planned(data["plan_id"], data["fusion_id"], data["segmenter"], body_bytes, request,
                   request_key or "", "miss", plan_summary(data), len(metas))


def serialize(plan: Plan, metas_json: list[dict[str, Any]], name: str | None = None,
              definition: dict[str, Any] | None = None) -> tuple[dict[str, Any], bytes, str]:
    """A plan's JSON, as a dict and as strict JSON bytes (see ``plan_bytes``), and the request
    that made it (the definition as wire JSON, converted here unless given, the input
    metadata, and the definition function's name if it had one: the dashboard shows it) as
    JSON text."""
    data = plan.to_json()
    if definition is None:
        definition = fusion_to_json(plan.fusion)
    request = {"definition": definition, "inputs": metas_json}
    if name is not None:
        request["name"] = name
    request = json.dumps(request, separators=(",", ":"), allow_nan=False)
    return data, plan_bytes(data), request


def plan_summary(data: dict[str, Any]) -> dict[str, Any]:
    """What the metrics record of a plan."""
    summary = {k: data[k] for k in ("segmenter", "totals", "baseline", "solver")}
    summary["segment_kinds"] = dict(Counter(seg["kind"] for seg in data["segments"]))
    return summary


def parse_definition(definition: Any, max_ops: int
                     ) -> tuple[Fusion, list[InputMeta] | None, str | None]:
    """The fusion of a text or wire-JSON definition, the text's ``inputs = [...]`` if any, and
    its definition function's name if it has one."""
    if isinstance(definition, str):
        parsed = parse_text(definition, max_ops=max_ops)
        return parsed.fusion, parsed.inputs, parsed.function_name
    if len(definition.ops) > max_ops:
        raise Problem(413, "definition too large",
                      f"the definition has {len(definition.ops)} ops; the limit is {max_ops}")
    return fusion_from_json(definition, max_ops), None, None


def plan_options(model: PlanOptionsModel, settings: Settings) -> PlanOptions:
    """The PlanOptions of a request's options (absent ones: the declared defaults), checked as
    the planner checks them. Without a time limit the plan takes this service's default; a
    time limit past this service's ``max_solver_seconds`` (a deployment's limit, at most the
    option's own bound) is refused."""
    given = model.model_dump(exclude_none=True)  # None: absent (time_limit_s, kinds)
    limit = given.setdefault("time_limit_s", settings.default_time_limit_s)
    if limit > settings.max_solver_seconds:
        raise Problem(422, "solver time limit too long",
                      f"options.time_limit_s is {limit:g}; this service allows at most "
                      f"{settings.max_solver_seconds:g} (FUSECUT_MAX_SOLVER_SECONDS; the "
                      f"option's own range is {TIME_LIMIT_S.range})")
    return PlanOptions(**given)


def plan_bytes(data: dict[str, Any]) -> bytes:
    """The plan as strict JSON, refused (naming the value) if it is not, or if its byte totals
    leave int64 (sizes made inside a definition, by broadcast_in_dim to fixed shapes): the
    metrics never see them."""
    too_big = [k for k, v in data["totals"].items() if isinstance(v, (int, float))
               and v > INT64_MAX]
    if too_big:
        raise Problem(422, "sizes too large", f"the plan's totals.{too_big[0]} is over "
                                              f"2**63 - 1; reduce the definition's shapes")
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # NaN or infinity somewhere: find it (a walk only on this rare path)
        where = non_finite(data)
        raise Problem(422, "cannot plan", f"the plan's {where} is not a finite number; "
                                          f"check the options and input metadata") from None


def check_sizes(fusion: Fusion, metas: list[InputMeta], limit: int) -> None:
    """Refuse tensor inputs whose logical size, in elements or bytes, leaves int64 or passes
    ``limit`` bytes, or whose strides reach past int64: naming the input and axis."""
    for name, meta in zip(fusion.inputs, metas):
        if not isinstance(meta, TensorMeta):
            continue
        numel, offset = 1, 0
        for axis, (extent, stride) in enumerate(zip(meta.shape, meta.strides)):
            numel *= extent
            offset += max(extent - 1, 0) * stride
            where = f"input {name} (shape {shape_text(meta.shape)}), axis {axis}"
            if numel > INT64_MAX or offset > INT64_MAX:
                raise Problem(422, "sizes too large", f"{where}: the extents or strides so "
                                                      f"far pass 2**63 - 1 elements")
            if numel * meta.dtype.itemsize > limit:
                raise Problem(422, "sizes too large",
                              f"{where}: {numel * meta.dtype.itemsize} bytes so far, over this "
                              f"service's limit of {limit} bytes per input")
        if (offset + 1) * meta.dtype.itemsize > INT64_MAX:
            raise Problem(422, "sizes too large", f"input {name}: its strides reach past "
                                                  f"2**63 - 1 bytes")


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape for a message, its long extents as powers of two where they are."""
    return "[" + ", ".join(f"2**{e.bit_length() - 1}" if e > 2**32 and e & (e - 1) == 0
                           else str(e) for e in shape) + "]"


def non_finite(value: Any, path: str = "plan") -> str | None:
    """The path of the first NaN or infinity in a JSON-like value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = non_finite(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if where is not None:
            return where
    return None
