"""Run a plan on real arguments: the one place that picks how.

Generated kernels where the tensors are on a GPU, the torch reference interpreter otherwise (the
CPU path). Untimed GPU runs go through a compiled ``Program`` (cached per plan and argument
signature); timed runs (the service, the CLI, ``return_execution``) go segment by segment with
CUDA events around each.
"""

from __future__ import annotations

from typing import Any

import torch

from fusecut.optimizer.plan.plan import Plan
from fusecut.runtime.executor import (
    Execution,
    SegmentRunner,
    SegmentTiming,
    check_matches_plan,
    execute_plan,
    reference_runner,
    time_call,
)
from fusecut.runtime.program import Program, baked_positions, build_program, program_for, signature
from fusecut.runtime.rng import with_implicit_rng
from fusecut.runtime.streams import HostCall, run_host


def on_gpu(args: list[Any]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def runner_for(args: list[Any]) -> tuple[SegmentRunner, str]:
    """Generated kernels when the tensors are on a GPU; the torch reference otherwise."""
    if on_gpu(args):
        from fusecut.runtime.compile import require_cuda_python
        from fusecut.runtime.kernels import cuda_runner

        require_cuda_python()
        return cuda_runner, "cuda"
    return reference_runner, "reference"


def compile_plan(plan: Plan, args: list[Any], sig: tuple | None = None) -> Program | HostCall:
    """What a warm call of ``plan`` runs for arguments like ``args``: its compiled program, or
    its host program when axes are stream-parallel (whose segments compile as they first run)."""
    if plan.host is not None:
        baked = baked_positions(plan.fusion)
        return HostCall(plan, sig if sig is not None else signature(args, baked), baked)
    return build_program(plan, args, sig)


def run_plan(plan: Plan, args: list[Any], *, timed: bool = False) -> Execution:
    """Run ``plan`` on ``args``; with ``timed``, per-segment times (which synchronise).
    Unseeded random ops draw this call's seed and offsets here (``runtime.rng``)."""
    args = with_implicit_rng(plan.fusion.implicit_rng, len(plan.fusion.inputs), list(args))
    if plan.host is not None:
        return _run_host(plan, list(args), timed)
    runner, backend = runner_for(args)
    if timed or backend == "reference":
        return execute_plan(plan, list(args), runner, backend, timed=timed)
    check_matches_plan(plan, args)  # a clear error for arguments the plan was not made for
    return Execution(program_for(plan, args).run(list(args)), [], backend)


def _run_host(plan: Plan, args: list[Any], timed: bool) -> Execution:
    """A host program (stream loops): timed as a whole, since its segments overlap."""
    if not timed:
        return run_host(plan, args)
    result, seconds = time_call(lambda: run_host(plan, args), on_gpu(args))
    result.timings = [SegmentTiming(0, "host_program", seconds, plan.io_bytes, result.backend)]
    return result
