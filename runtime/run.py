"""Run a plan on real arguments: the one place that picks how.

Generated kernels where the tensors are on a GPU, the torch reference interpreter otherwise (the
CPU path). Untimed GPU runs go through a compiled ``Program`` (cached per plan and argument
signature); timed runs (the service, the CLI, ``return_execution``) go segment by segment with
CUDA events around each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from optimizer.plan.plan import Plan
from runtime.executor import (
    Execution,
    SegmentRunner,
    check_matches_plan,
    execute_plan,
    reference_runner,
)
from runtime.program import Program, baked_positions, build_program, signature

_programs: OrderedDict[tuple, Program] = OrderedDict()
_lock = threading.Lock()
MAX_PROGRAMS = 256


def on_gpu(args: list[Any]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def runner_for(args: list[Any]) -> tuple[SegmentRunner, str]:
    """Generated kernels when the tensors are on a GPU; the torch reference otherwise."""
    if on_gpu(args):
        from runtime.kernels import cuda_runner

        return cuda_runner, "cuda"
    return reference_runner, "reference"


def program_for(plan: Plan, args: list[Any]) -> Program:
    """The compiled program of ``plan`` for arguments like these (built on first use)."""
    baked = getattr(plan, "_baked", None)
    if baked is None:
        baked = plan._baked = baked_positions(plan.fusion)  # type: ignore[attr-defined]
    sig = signature(args, baked)
    key = (plan.plan_id, sig)
    with _lock:
        program = _programs.get(key)
        if program is not None:
            _programs.move_to_end(key)
            return program
    program = build_program(plan, args, sig)
    with _lock:
        _programs[key] = program
        while len(_programs) > MAX_PROGRAMS:
            _programs.popitem(last=False)
    return program


def run_plan(plan: Plan, args: list[Any], *, timed: bool = False) -> Execution:
    """Run ``plan`` on ``args``; with ``timed``, per-segment times (which synchronise)."""
    if plan.host is not None:
        return _run_host(plan, list(args), timed)
    runner, backend = runner_for(args)
    if timed or backend == "reference":
        return execute_plan(plan, list(args), runner, backend, timed=timed)
    check_matches_plan(plan, args)  # a clear error for arguments the plan was not made for
    return Execution(program_for(plan, args).run(list(args)), [], backend)


def _run_host(plan: Plan, args: list[Any], timed: bool) -> Execution:
    """A host program (stream loops): timed as a whole, since its segments overlap."""
    from runtime.executor import SegmentTiming, time_call
    from runtime.streams import run_host

    if not timed:
        return run_host(plan, args)
    result, seconds = time_call(lambda: run_host(plan, args), on_gpu(args))
    result.timings = [SegmentTiming(0, "host_program", seconds, plan.io_bytes, result.backend)]
    return result
