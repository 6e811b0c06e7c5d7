"""What became of each region of a jitted function: ``region_reports`` reads the traces' fusion
calls and reports per region its ops, definition text, bytes planned, calls, fallback and setup
seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import thunder

from fusecut.optimizer.errors import counted
from fusecut.thunder.regions import Fallback, FusecutRegion, fusecut_regions

# ---- reports ------------------------------------------------------------------------------------


@dataclass
class RegionReport:
    name: str
    direction: str  # "forward" or "backward"
    ops: list[str]
    definition: str
    calls: int
    planned_bytes: int | None = None
    greedy_bytes: int | None = None
    lower_bound_bytes: int | None = None
    segments: list[str] = field(default_factory=list)  # segment kinds
    fallback: str | None = None  # why the region ran on torch instead, if it did
    fallback_stage: str | None = None  # where fusecut's work failed then (one of STAGES)
    # wall seconds fusecut spent setting the region up, by stage (translate, plan, codegen:
    # generation and NVRTC): its part of the first step
    setup_seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        if self.fallback is not None:
            return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')} on torch "
                    f"({self.fallback})")
        if self.planned_bytes is None:
            return f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, not run yet"
        return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, "
                f"{counted(len(self.segments), 'segment')}, {self.planned_bytes} B planned "
                f"(greedy {self.greedy_bytes}, lower bound {self.lower_bound_bytes}), "
                f"{counted(self.calls, 'call')}, "
                f"set up in {sum(self.setup_seconds.values()):.2f} s")


def region_reports(jitted: Callable) -> list[RegionReport]:
    """Every fusecut region of the last forward and backward traces Thunder ran for ``jitted``."""
    traces = [("forward", thunder.last_traces(jitted))]
    try:
        traces.append(("backward", thunder.last_backward_traces(jitted)))
    except Exception:  # no backward was traced (inference only)
        pass
    reports = []
    for direction, history in traces:
        if not history:
            continue
        for bsym, fn in fusecut_regions(history[-1]):
            ops = [b.sym.name for b in bsym.subsymbols]
            if isinstance(fn, Fallback) or getattr(fn, "fallback_reason", None):
                text = repr(fn.first_definition) if isinstance(fn, FusecutRegion) else ""
                reports.append(RegionReport(fn.name, direction, ops, text, fn.calls,
                                            fallback=fn.fallback_reason,
                                            fallback_stage=fn.fallback_stage,
                                            setup_seconds=dict(getattr(fn, "setup_seconds", {}))))
                continue
            report = RegionReport(fn.name, direction, ops, repr(fn.first_definition), fn.calls,
                                  setup_seconds=dict(fn.setup_seconds))
            plan = fn.plan()
            if plan is not None:
                report.planned_bytes = plan.io_bytes
                report.greedy_bytes = plan.baseline["io_bytes"]
                report.lower_bound_bytes = plan.totals["lower_bound_bytes"]
                report.segments = [s.kind for s in plan.segments]
            reports.append(report)
    return reports
