"""What became of each region of a jitted function: ``region_reports`` reads the traces' fusion
calls and reports per region its ops, definition text, bytes planned, calls, fallback and setup
seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import thunder

from fusecut.fronts import RegionReport
from fusecut.thunder.regions import Fallback, FusecutRegion, fusecut_regions


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
                report.add_plan(plan)
            reports.append(report)
    return reports
