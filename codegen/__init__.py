"""CUDA C++ for plan segments, one generator per segment kind."""

from __future__ import annotations

from fusecut.codegen.kernel import Kernel, KernelParam, SegmentKernels, Workspace
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.plan.plan import Plan, Segment

GENERATED_KINDS = (Kind.POINTWISE, Kind.REDUCTION, Kind.NORMALIZATION, Kind.INNER_OUTER)

__all__ = ["GENERATED_KINDS", "Kernel", "KernelParam", "SegmentKernels", "Workspace",
           "generate_segment"]


def generate_segment(plan: Plan, segment: Segment, vector: int | None = None) -> SegmentKernels:
    """Kernels for one segment of a plan (library and fallback segments have none)."""
    from fusecut.codegen.persistent import generate_persistent
    from fusecut.codegen.pointwise import generate_pointwise
    from fusecut.codegen.reduction import generate_reduction

    s = segment.schedule
    recomputed = frozenset(segment.recomputed_ops)
    if s.kind is Kind.POINTWISE:
        return generate_pointwise(plan.bound, s, plan.profile, segment.index, vector, recomputed)
    if s.kind is Kind.REDUCTION:
        return generate_reduction(plan.bound, s, plan.profile, segment.index, vector, recomputed)
    if s.kind in (Kind.NORMALIZATION, Kind.INNER_OUTER):
        return generate_persistent(plan.bound, s, plan.profile, segment.index, vector,
                                   recomputed)
    return SegmentKernels(segment.index, s.kind.value, "", [])
