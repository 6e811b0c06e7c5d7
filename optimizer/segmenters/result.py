"""What every segmenter returns: an ordered segmentation (``Group`` per segment) and a
``SolverReport``, and what a segmentation costs under the planner's objective."""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.optimizer.analysis.cost import read_bytes, write_bytes
from fusecut.optimizer.options import COMPUTE_WEIGHT, LAUNCH_WEIGHT, SEED, TIME_LIMIT_S
from fusecut.optimizer.segmenters.graph import SegGraph

# One segment: the ops it places (forwarded ops are added by ``SegGraph.closure``) and the
# tensors it writes to global memory.
Group = tuple[frozenset[int], frozenset[str]]


@dataclass
class SolverReport:
    """How a segmentation was found: ``status`` is OPTIMAL or FEASIBLE (a solver's answer),
    GREEDY (no solver ran), FALLBACK_TO_GREEDY (the solver failed; the greedy plan stands) or
    FIXED (a segment planned alone); ``objective`` and ``bound`` are the solver's, in its own
    units; ``message`` says what the search did."""

    status: str
    objective: float | None = None
    bound: float | None = None
    wall_s: float = 0.0
    message: str = ""


@dataclass(frozen=True)
class SolverOptions:
    """What the solvers (CP-SAT, min-cut) take from a request's options: the time limit, the
    objective's weights (per-kernel launch cost, recomputed arithmetic) and CP-SAT's seed. Their
    defaults and bounds are the plan options' (``optimizer.options``); ``PlanOptions.solver``
    fills each field from the plan option of its name, checked."""

    time_limit_s: float = TIME_LIMIT_S.default
    launch_weight: float = LAUNCH_WEIGHT.default
    compute_weight: float = COMPUTE_WEIGHT.default
    seed: int = SEED.default


def plan_cost(graph: SegGraph, groups: list[Group]) -> float:
    """Estimated seconds of a segmentation (the planner's objective, in time units)."""
    return sum(graph.segment_time(ops, w) for ops, w in groups)


def plan_bytes(graph: SegGraph, groups: list[Group]) -> int:
    """Bytes a segmentation moves through global memory (every segment must classify)."""
    out = 0
    for ops, written in groups:
        s = graph.classify(ops, written)
        out += read_bytes(graph.bound, s) + write_bytes(graph.bound, s)
    return out
