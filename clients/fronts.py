"""What every compiler front (Lightning Thunder's executor, the torch.compile backend) shares
about the regions it hands fusecut: where a region's work can fail (``STAGES``,
``RegionFailure``, ``stage``) and what is reported of it (``RegionReport``).

A failure at any stage moves the region to the front's own kernels (Thunder's torch executor,
aten) for good: a CompileError escaping into a user's training step is never the answer.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from fusecut.optimizer.errors import counted
from fusecut.runtime.compile import CompileError

# Where a region's work can fail, in order.
STAGES = ("translate", "plan", "codegen", "compile", "launch")


class RegionFailure(Exception):
    """A region's fusecut work failed at ``stage`` (one of STAGES) with ``cause``."""

    def __init__(self, stage: str, cause: BaseException):
        first_line = (str(cause).strip().splitlines() or [""])[0][:300]
        super().__init__(f"{stage} failed: {type(cause).__name__}: {first_line}")
        self.stage = stage
        self.cause = cause


@contextmanager
def stage(name: str, seconds: dict[str, float] | None = None):
    """Failures inside become RegionFailure(name); NVRTC's refusal is the compile stage whatever
    the caller called it. Out of memory is not fusecut's failure: torch would fail the same way,
    so it reaches the user as it is. ``seconds[name]`` adds the wall time spent inside: what a
    region costs the first step."""
    start = time.perf_counter()
    try:
        yield
    except RegionFailure:
        raise
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        raise RegionFailure("compile" if isinstance(e, CompileError) else name, e) from e
    finally:
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


@dataclass
class RegionReport:
    """What became of one region: its ops, its definition (nvFuser's repro text), its calls,
    the bytes its plan moves, and whether (and where) it gave up and ran on the front's own
    kernels."""

    name: str
    direction: str  # "forward", "backward" (or "inference", under torch.compile)
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

    def add_plan(self, plan) -> None:
        """The bytes and segments of the region's plan (a PlanView)."""
        self.planned_bytes = plan.io_bytes
        # a plan rebound to these extents (optimizer.plan.rebind) ran no greedy baseline
        self.greedy_bytes = plan.baseline["io_bytes"] if plan.baseline else None
        self.lower_bound_bytes = plan.totals["lower_bound_bytes"]
        self.segments = [s.kind for s in plan.segments]

    def summary(self) -> str:
        if self.fallback is not None:
            return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')} on torch "
                    f"({self.fallback})")
        if self.planned_bytes is None:
            return f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, not run yet"
        return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, "
                f"{counted(len(self.segments), 'segment')}, {self.planned_bytes} B planned "
                f"(greedy {self.greedy_bytes if self.greedy_bytes is not None else '-'}, "
                f"lower bound {self.lower_bound_bytes}), "
                f"{counted(self.calls, 'call')}, "
                f"set up in {sum(self.setup_seconds.values()):.2f} s")
