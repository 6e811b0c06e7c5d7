"""Rebuild a Plan from its JSON and the fusion it was made for, without solving again.

A stored or received plan names each segment's ops and the tensors it writes; that is all
``build_plan`` needs. Rebuilding checks the plan again (every segment schedules, reads only what
was written before), so a plan that does not belong to the fusion is refused, not run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta
from fusecut.optimizer.ir.rng import as_written, seed_implicit_rng
from fusecut.optimizer.ir.wire import fusion_id
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.options import KINDS
from fusecut.optimizer.plan.build import build_plan
from fusecut.optimizer.plan.plan import Baseline, Plan
from fusecut.optimizer.profiles import get_profile
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.result import SolverReport


def restore_plan(fusion: Fusion, metas: list[InputMeta], data: dict[str, Any]) -> Plan:
    """The Plan that ``data`` (a plan's JSON) describes for ``fusion`` and these inputs."""
    if data.get("fusion_id") != fusion_id(as_written(fusion)):  # the plan's identity: ir.rng
        raise PlanError(f"plan {data.get('plan_id')!r} was made for fusion "
                        f"{str(data.get('fusion_id'))[:16]}..., not this one")
    fusion, metas = seed_implicit_rng(fusion, metas)  # as make_plan planned it
    options = data["options"]
    profile = get_profile(options.get("device"), options.get("device_overrides"))
    graph = SegGraph(bind(fusion, metas), profile,
                     frozenset(Kind(k) for k in options.get("kinds", KINDS.default)))
    if any(op >= len(fusion.ops) or op < 0 for s in data["segments"] for op in s["ops"]):
        raise PlanError("the plan names ops the fusion does not have")
    groups = [(frozenset(s["ops"]), frozenset(t["tensor"] for t in s["outputs"]))
              for s in data["segments"]]
    solver = SolverReport(**data["solver"])
    base = data.get("baseline")
    baseline = None if base is None else Baseline(base["segmenter"], base["io_bytes"],
                                                  base["segments"], base["est_time_s"])
    plan = build_plan(graph, groups, data["segmenter"], solver, baseline, options)
    if data.get("rebound_from"):  # another plan's segmentation (optimizer.plan.rebind)
        plan = replace(plan, rebound_from=data["rebound_from"])
    if data.get("symbolic"):  # asked for with -1 extents (optimizer.plan.rebind.bind_symbolic)
        plan = replace(plan, symbolic=tuple((int(i), int(a)) for i, a in data["symbolic"]))
    if plan.plan_id != data["plan_id"]:
        raise PlanError(f"plan {data['plan_id']!r} does not match these inputs or options")
    return plan
