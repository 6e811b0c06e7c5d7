"""Errors of running a plan (no torch here: the service's planner processes import these to map
an execution's failures to answers, without loading torch)."""

from __future__ import annotations

from fusecut.optimizer.errors import FusecutError


class OpFailed(FusecutError):
    """An op of a plan failed as it ran: torch refused it (no kernel for its dtype, an index
    out of range, a value its dtype cannot hold, a division by zero). Names the op."""


class OutOfMemory(OpFailed):
    """An op could not allocate its result."""
