"""Plan a fusion: bind its inputs, segment it, and report the plan against the greedy baseline.

    plan = make_plan(fusion, input_metadata, PlanOptions(segmenter="cpsat", time_limit_s=5))

The greedy (nvFuser-style) segmentation is always computed: it is the baseline every plan
reports, the warm start of the CP-SAT model and the answer when a solver finds nothing better.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.gcpause import gc_paused
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta
from fusecut.optimizer.ir.rng import seed_implicit_rng
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.options import (
    COMPUTE_WEIGHT,
    DEVICE,
    DEVICE_OVERRIDES,
    KINDS,
    LAUNCH_WEIGHT,
    NUM_STREAMS,
    PLAN_OPTIONS,
    SEED,
    SEGMENTER,
    TIME_LIMIT_S,
    checked,
)
from fusecut.optimizer.plan.build import build_plan
from fusecut.optimizer.plan.plan import Baseline, Plan
from fusecut.optimizer.profiles import get_profile
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.greedy import greedy_groups
from fusecut.optimizer.segmenters.levels import level_groups
from fusecut.optimizer.segmenters.result import (
    Group,
    SolverOptions,
    SolverReport,
    plan_bytes,
    plan_cost,
)

SEGMENTERS = SEGMENTER.choices


@dataclass(frozen=True)
class PlanOptions:
    """A plan's options. Each is declared once in ``optimizer.options`` (type, default, what it
    takes, description) and checked against that declaration here: a bad value is a PlanError
    naming the option, what it takes and what was given. Values are held in their declared types
    (5 becomes 5.0, a list of kinds a tuple), so equal options make equal JSON: ``to_json`` feeds
    the plan's key."""

    segmenter: str = SEGMENTER.default
    time_limit_s: float = TIME_LIMIT_S.default
    device: str = DEVICE.default
    device_overrides: dict[str, Any] = field(
        default_factory=lambda: dict(DEVICE_OVERRIDES.default))
    launch_weight: float = LAUNCH_WEIGHT.default
    compute_weight: float = COMPUTE_WEIGHT.default
    seed: int = SEED.default
    kinds: tuple[str, ...] = KINDS.default
    num_streams: int = NUM_STREAMS.default

    def __post_init__(self):
        for option in PLAN_OPTIONS:  # frozen: the checked value replaces the given one
            object.__setattr__(self, option.name, checked(option, getattr(self, option.name)))

    @property
    def solver(self) -> SolverOptions:
        """What the solvers take from these options."""
        return SolverOptions(**{f.name: getattr(self, f.name) for f in fields(SolverOptions)})

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kinds"] = sorted(self.kinds)
        return data


def make_plan(fusion: Fusion, metas: list[InputMeta], options: PlanOptions | None = None) -> Plan:
    """One deadline, ``time_limit_s`` from the call, covers every stage: the greedy segmenter stops
    merging at ``GREEDY_SHARE`` of it, and the solvers stop searching early enough to leave the
    stages after them (building the plan, serializing it), whose cost grows with the number of
    segments, their estimated share. A greedy segmenter cut short leaves most of a large fusion
    one group per op; the one-pass level grouping (``levels``) replaces that when it is coarser.
    Binding and forwarding are linear in the fusion's size. The cyclic garbage collector is
    paused throughout: what planning builds survives it (see ``optimizer.gcpause``)."""
    options = options or PlanOptions()
    _load_segmenter(options.segmenter)
    with gc_paused():
        return _make_plan(fusion, metas, options)


def _load_segmenter(name: str):
    """A solver's module, imported before the clock starts: OR-Tools' CP-SAT module takes ~0.7 s
    to import (pandas), once per process; that is start-up, not planning."""
    if name == "cpsat":
        from fusecut.optimizer.segmenters import cpsat

        return cpsat
    if name == "mincut":
        from fusecut.optimizer.segmenters import mincut

        return mincut
    return None


def _make_plan(fusion: Fusion, metas: list[InputMeta], options: PlanOptions) -> Plan:
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    profile = get_profile(options.device, options.device_overrides)
    bound = bind(*seed_implicit_rng(fusion, metas))  # unseeded random ops: per-call inputs
    graph = SegGraph(bound, profile, frozenset(Kind(k) for k in options.kinds))
    greedy_start = time.perf_counter()
    # the greedy segmenter leaves a share of the time for the stages after it: if it is cut
    # short, the level grouping, building the plan and serializing it, linear in the ops
    greedy_deadline = start + min(GREEDY_SHARE * options.time_limit_s,
                                  options.time_limit_s - FINISH_S_PER_OP * len(graph.placed))
    greedy = greedy_groups(graph, deadline=greedy_deadline)
    late = time.perf_counter() > greedy_deadline
    message = LATE_MESSAGE if late else ""
    if late:
        coarse = level_groups(graph)
        if len(coarse) < len(greedy):
            greedy, message = coarse, LEVELS_MESSAGE.format(len(greedy), len(coarse))
    greedy_writes = graph.derive_writes(greedy)
    greedy_plan = list(zip(greedy, greedy_writes))
    if graph.kinds != frozenset(Kind):
        _check_kinds(graph, greedy_plan, options.kinds)
    baseline = _baseline(graph, greedy_plan)
    report = SolverReport("GREEDY", wall_s=time.perf_counter() - greedy_start, message=message)
    groups = greedy_plan
    # the solvers improve on the greedy plan and leave about as many segments; what follows them
    # (their own last pass, building and serializing the plan) grows with the ops as well
    solver_deadline = deadline - FINISH_S_PER_SEGMENT * len(greedy) - \
        FINISH_S_PER_OP * len(graph.placed)
    if late or time.perf_counter() >= solver_deadline:
        if options.segmenter != "greedy":
            report = SolverReport("FALLBACK_TO_GREEDY", wall_s=report.wall_s,
                                  message=message or NO_TIME_MESSAGE)
    elif options.segmenter == "cpsat":
        groups, report = _load_segmenter("cpsat").solve(graph, greedy_plan, options.solver,
                                                         solver_deadline)
    elif options.segmenter == "mincut":
        groups, report = _load_segmenter("mincut").refine(graph, greedy_plan, options.solver,
                                                           solver_deadline)
    return build_plan(graph, groups, options.segmenter, report, baseline, options.to_json())


GREEDY_SHARE = 0.6  # of the time limit, at most, for binding and the greedy segmenter
# CPU seconds, measured on a 20,000-op generated fusion (12,500 placed ops, 789 segments), of
# the stages after the greedy segmenter when it is cut short (the level grouping, building and
# serializing the plan: 1.2-1.9 s), per placed op; and of building and serializing a plan, per
# segment: kept free of the greedy segmenter's and the solvers' shares of the limit. After a
# solver (410 segments there): its last pass (min-cut classifies the segments it grew), building
# and serializing the plan take 1.1-1.6 s, within both reserves.
FINISH_S_PER_OP = 0.00015
FINISH_S_PER_SEGMENT = 0.0005
LATE_MESSAGE = "time limit reached in the greedy segmenter: its merges so far stand"
LEVELS_MESSAGE = ("time limit reached in the greedy segmenter: its {} groups so far were "
                  "replaced by a one-pass grouping by dependency level ({} segments)")
NO_TIME_MESSAGE = "time limit reached before the solver could start: the greedy plan stands"


def _check_kinds(graph: SegGraph, groups: list[Group], kinds: tuple[str, ...]) -> None:
    """With ``options.kinds`` narrowed, an op that no allowed kind runs (even alone) is the
    caller's choice: a PlanError naming the op and why, not a plan with a hole in it."""
    for ops, written in groups:
        verdict = graph.classify(ops, written)
        if not verdict:
            names = ", ".join(sorted({graph.fusion.ops[i].name for i in ops}))
            raise PlanError(f"options.kinds={list(kinds)} leaves no segment kind that can run "
                            f"{names}: {verdict.reason}")


def _baseline(graph: SegGraph, groups: list[Group]) -> Baseline:
    return Baseline("greedy", plan_bytes(graph, groups), len(groups), plan_cost(graph, groups))
