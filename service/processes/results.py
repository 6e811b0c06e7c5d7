"""What a worker answers: an execution's result, a failure of a known kind, or a request for the
plan it does not hold.

These travel pickled from the worker process to the service (and from a Ray executor replica to
a planner replica), so they live in a module of their own: the worker process runs worker.py as
``__main__``, and a class defined there would be pickled under that name, which the service
cannot load. The HTTP status of each kind is the service's business (service.problems).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from fusecut.optimizer.errors import DefinitionError, FusecutError, InputError, PlanError
from fusecut.runtime.errors import OpFailed, OutOfMemory
from fusecut.service.processes.limits import ResultTooLarge


class FailureKind(enum.Enum):
    """Why an execution failed."""

    INVALID_DEFINITION = "invalid definition"  # the plan's definition cannot run
    INPUTS_MISMATCH = "inputs mismatch"  # the tensors do not fit the plan's definition
    CANNOT_EXECUTE = "cannot execute"  # the plan cannot run on these inputs, or this wire
    RESULT_TOO_LARGE = "result too large"  # the outputs, or a tensor computed, pass a limit
    UNKNOWN_PLAN = "unknown plan"  # no plan has the id
    WORKER_CRASHED = "worker crashed"  # the worker process died running it (it restarts)
    WORKER_TIMED_OUT = "worker timed out"  # it ran past the execution timeout (restarted)
    WORKER_UNAVAILABLE = "worker unavailable"  # no worker runs (starting, or failed to start)
    EXECUTOR_BUSY = "executor busy"  # a Ray executor replica's queue is full
    INTERNAL = "internal"  # an error fusecut did not expect: a bug


@dataclass(frozen=True)
class ExecutionResult:
    """A run plan's outputs by name (CPU tensors), the backend that ran it, per-segment timings
    (``runtime.executor.SegmentTiming`` as dicts: they go out as JSON), what it compiled, and
    the worker slot that ran it (set by the pool)."""

    plan_id: str
    outputs: list[tuple[str, Any]]
    backend: str
    timings: list[dict[str, Any]]
    compiles: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0
    device: str | None = None


@dataclass(frozen=True)
class ExecutionFailure:
    """An execution that failed: why, and a message for the client (or the log, for a bug)."""

    kind: FailureKind
    message: str


@dataclass(frozen=True)
class PlanNeeded:
    """The worker does not hold the plan (it was never sent, or was evicted): send its texts."""

    plan_id: str


@dataclass(frozen=True)
class WorkerStarted:
    """A worker process's first message: it runs, on this device ("cpu", or a GPU's name)."""

    device: str


@dataclass(frozen=True)
class WorkerFailedToStart:
    error: str


Outcome = ExecutionResult | ExecutionFailure  # what an execution comes to

# fusecut's refusals of an execution, most specific first (ResultTooLarge is a FusecutError)
REFUSALS: list[tuple[type[FusecutError], FailureKind]] = [
    (ResultTooLarge, FailureKind.RESULT_TOO_LARGE),
    (OutOfMemory, FailureKind.RESULT_TOO_LARGE),
    (OpFailed, FailureKind.CANNOT_EXECUTE),  # torch refused an op: the message names it
    (InputError, FailureKind.INPUTS_MISMATCH),
    (DefinitionError, FailureKind.INVALID_DEFINITION),
    (PlanError, FailureKind.CANNOT_EXECUTE),
]


def refusal(error: FusecutError) -> ExecutionFailure:
    """The failure a FusecutError raised by an execution stands for. One of another kind is
    not expected from an execution: a bug."""
    kind = next((k for cls, k in REFUSALS if isinstance(error, cls)), FailureKind.INTERNAL)
    return ExecutionFailure(kind, str(error) if kind is not FailureKind.INTERNAL
                            else repr(error))


def unknown_plan(plan_id: str) -> ExecutionFailure:
    return ExecutionFailure(FailureKind.UNKNOWN_PLAN, f"no plan has id {plan_id!r}")
