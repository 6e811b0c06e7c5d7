"""Build a Plan, complete: its segments and boundaries, and its host program when axes are
stream-parallel."""

from __future__ import annotations

from typing import Any

from fusecut.optimizer.plan.lower import lower
from fusecut.optimizer.plan.plan import Baseline, Plan, assemble, plan_id_of
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.result import Group, SolverReport


def build_plan(graph: SegGraph, groups: list[Group], segmenter: str, solver: SolverReport,
               baseline: Baseline | None, options: dict[str, Any]) -> Plan:
    """The Plan of an ordered segmentation of ``graph``'s fusion; a PlanError when it is not a
    valid one. When axes are stream-parallel, the segments run in stage order (stable: a stage's
    segments run together, inside its loop) and the plan carries its host program."""
    host = None
    if graph.stage_of:
        groups = sorted(groups, key=lambda g: min(graph.stage_of[i] for i in g[0]))
        segments, boundaries = assemble(graph, groups)
        host = lower(graph, segments, options, plan_id_of(graph.bound, options, graph.profile))
    else:
        segments, boundaries = assemble(graph, groups)
    return Plan(graph.bound, graph.profile, segmenter, segments, boundaries, solver, baseline,
                options, host)
