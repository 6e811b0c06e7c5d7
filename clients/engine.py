"""The in-process engine: a fusion's road from definition to launched kernels, in stages, each
with one bounded cache that every door of the process shares.

    plan(inputs, options)     -> Plan             by (fusion id, input metadata, options)
    execution_plan(inputs)    -> Plan             the plan of the inputs' range of shapes, rebound
    program(inputs, options)  -> Program          by (fusion id, argument signature, options)
    run(plan, args, timed)    -> Execution        segment by segment (kernels or torch reference)
    execute(inputs, options)  -> outputs          the compiled program on a GPU, ``run`` elsewhere

The doors are the SDK (``fd.plan``, ``fd.execute``, nvFuser's caches), the CLI, the service's
worker, Thunder regions (and the next compiler front). Each holds a ``FusionHandle`` (one
fusion's way in: its id, and the warm call of its last program) from ``Engine.fusion``; the
caches are keyed by the fusion's content id, so a plan one door made is served to another door
asking for the same fusion and metadata. A plan made elsewhere (a service's, restored) enters
through ``adopt``. A plan made here is also kept on disk (``runtime.plan_files``, written in
the background), so the same script's next process restores it instead of planning. Nothing
else renders JSON: a ``PlanView`` does, when someone reads it.

Why bounded: a long-running service or training script sees new definitions and shapes without
end; the least recently used plan or program is dropped (a warm call that holds its program
keeps working).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

from fusecut.optimizer.errors import FusecutError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta
from fusecut.optimizer.ir.wire import fusion_id, meta_from_json
from fusecut.optimizer.plan.plan import Plan
from fusecut.optimizer.plan.rebind import (
    bound_as_planned,
    fixed_extents,
    rebind,
    representative,
    representative_fusion,
)
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime import plan_files
from fusecut.runtime.device_profile import with_device
from fusecut.runtime.executor import Execution, SegmentTiming, time_call
from fusecut.runtime.lru import BoundedCache
from fusecut.runtime.program import Program, baked_positions, signature
from fusecut.runtime.run import compile_plan, on_gpu, run_plan
from fusecut.runtime.streams import HostCall
from fusecut.runtime.tensors import meta_of, with_cpu_scalars_on_device

MAX_PLANS = 1024
MAX_PROGRAMS = 1024


def as_metadata(inputs: list[Any]) -> list[InputMeta]:
    """Input metadata from tensors, numbers, InputMeta objects or wire dicts."""
    out: list[InputMeta] = []
    for x in inputs:
        if isinstance(x, (TensorMeta, ScalarMeta)):
            out.append(x)
        elif isinstance(x, dict):
            out.append(meta_from_json(x))
        else:
            out.append(meta_of(x))
    return out


def options_key(options: dict[str, Any]) -> str:
    """The plan options as a key: every option at its value, defaults filled in (so that
    ``time_limit_s`` given at its default is the same plan as not given)."""
    return json.dumps(PlanOptions(**options).to_json(), sort_keys=True)


@dataclass
class EngineStats:
    """What the caches did since the engine was made (or ``clear``ed)."""

    plans_made: int = 0
    plan_hits: int = 0
    plans_loaded: int = 0  # from disk: planned by an earlier process
    plans_adopted: int = 0
    plans_rebound: int = 0  # a known segmentation bound to new extents (no search)
    programs_built: int = 0
    program_hits: int = 0


class Engine:
    """The process's caches of plans and compiled programs. Thread-safe: Thunder's autograd
    thread runs backward regions while the main thread runs others."""

    def __init__(self, max_plans: int = MAX_PLANS, max_programs: int = MAX_PROGRAMS):
        self.plans: BoundedCache[tuple, Plan] = BoundedCache(max_plans)
        self.programs: BoundedCache[tuple, Program | HostCall] = BoundedCache(max_programs)
        self.stats = EngineStats()
        self._lock = threading.Lock()

    def fusion(self, fusion: Fusion) -> FusionHandle:
        """A door's handle on ``fusion`` (a complete definition: its content is its key)."""
        return FusionHandle(self, fusion)

    def run(self, plan: Plan, args: list[Any], timed: bool = False) -> Execution:
        """Run ``plan`` (one this engine holds, or any) segment by segment: generated kernels on
        a GPU, the torch reference elsewhere; with ``timed``, each segment's time."""
        return run_plan(plan, args, timed=timed)

    def clear(self) -> None:
        """Forget every plan and program (nvFuser's ``FusionCache.reset``)."""
        self.plans.clear()
        self.programs.clear()
        self.stats = EngineStats()

    def count(self, stat: str) -> None:
        with self._lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)


class FusionHandle:
    """One fusion's way into the engine: the staged calls, keyed by the fusion's content id
    (computed once), and ``warm``, the call of the last program ``execute`` ran without
    options: one signature comparison, then allocate and launch."""

    def __init__(self, engine: Engine, fusion: Fusion):
        self.engine = engine
        self.fusion = fusion
        self.warm = None
        self._id: str | None = None
        self._baked: frozenset[int] | None = None

    @property
    def id(self) -> str:
        if self._id is None:
            self._id = fusion_id(self.fusion)
        return self._id

    # ---- stage 1: plan ------------------------------------------------------------------------

    def plan_key(self, inputs: list[Any], options: dict[str, Any]) -> tuple:
        return (self.id, tuple(as_metadata(inputs)), options_key(with_device(options)))

    def cached_plan(self, inputs: list[Any], **options: Any) -> Plan | None:
        return self.engine.plans.get(self.plan_key(inputs, options))

    def plan(self, inputs: list[Any], **options: Any) -> Plan:
        """The plan for inputs like ``inputs`` (tensors, numbers, metadata): cached, else made."""
        key = self.plan_key(inputs, options)
        found = self.engine.plans.get(key)
        if found is not None:
            self.engine.count("plan_hits")
            return found
        where = plan_files.plan_file(self.id, list(key[1]), key[2]) \
            if plan_files.enabled() else None
        found = plan_files.load(where, self.fusion, list(key[1])) if where else None
        if found is not None:  # planned by an earlier process
            self.engine.plans.put(key, found)
            self.engine.count("plans_loaded")
            return found
        made = make_plan(self.fusion, list(key[1]), PlanOptions(**with_device(options)))
        self.engine.plans.put(key, made)
        self.engine.count("plans_made")
        if where is not None:
            plan_files.save_later(where, made)
        return made

    def execution_plan(self, inputs: list[Any], **options: Any) -> Plan:
        """The plan a run at ``inputs`` uses: the plan of their representative shape (every
        free extent rounded up to a power of two: ``optimizer.plan.rebind``), searched once per
        range of shapes and bound to these extents without a search; their own plan where
        that one does not hold. ``plan`` stays the search's plan for exactly these inputs
        (what ``fd.plan`` and ``fusecut plan`` show)."""
        metas = as_metadata(inputs)
        key = self.plan_key(metas, options) + ("rebound",)
        found = self.engine.plans.get(key)
        if found is not None:
            self.engine.count("plan_hits")
            return found
        try:
            bound = bound_as_planned(self.fusion, metas)
        except FusecutError:  # planning says what is wrong with these inputs
            return self.plan(metas, **options)
        fixed = fixed_extents(bound)
        shape = representative(metas, fixed)
        definition = representative_fusion(self.fusion, metas, fixed)
        if shape == metas and definition is self.fusion:
            return self.plan(metas, **options)
        # a definition written for this shape (Thunder's, the torch.compile backend's: sizes
        # in it) is searched as its representative's definition, shared by the range
        at = self if definition is self.fusion else self.engine.fusion(definition)
        try:
            source = at.plan(shape, **options)
        except FusecutError:  # the definition fixes these extents otherwise (a slice's ends)
            source = None
        made = rebind(source, self.fusion, metas, bound) if source is not None else None
        if made is None:
            return self.plan(metas, **options)
        self.engine.plans.put(key, made)
        self.engine.count("plans_rebound")
        return made

    def adopt(self, inputs: list[Any], plan: Plan, **options: Any) -> None:
        """Serve ``plan`` (made elsewhere: a service's, restored here) for these inputs, to runs
        as well: a plan the caller hands over is the one that runs, not its range's."""
        key = self.plan_key(inputs, options)
        self.engine.plans.put(key, plan)
        self.engine.plans.put(key + ("rebound",), plan)
        self.engine.count("plans_adopted")

    # ---- stage 2: program ---------------------------------------------------------------------

    def program(self, inputs: list[Any], **options: Any) -> Program | HostCall:
        """The compiled program for GPU arguments like ``inputs``: planned (cached), its
        kernels generated and compiled (cached) the first time, nothing launched."""
        if self._baked is None:
            self._baked = baked_positions(self.fusion)
        sig = signature(inputs, self._baked)
        key: tuple = (self.id, sig, json.dumps(options, sort_keys=True, default=str))
        if not any(isinstance(a, torch.Tensor) for a in inputs) and torch.cuda.is_available():
            key += (torch.cuda.current_device(),)  # no tensor names the device: the program is
            # built for the current one
        program = self.engine.programs.get(key)
        if program is not None:
            self.engine.count("program_hits")
            return program
        program = compile_plan(self.execution_plan(inputs, **options), inputs, sig)
        self.engine.programs.put(key, program)
        self.engine.count("programs_built")
        return program

    def programs(self) -> list[Program | HostCall]:
        """This fusion's programs the engine holds, least recently used first."""
        return [program for key, program in self.engine.programs.items() if key[0] == self.id]

    # ---- stage 3: run -------------------------------------------------------------------------

    def run(self, inputs: list[Any], timed: bool = False, **options: Any) -> Execution:
        """Segment by segment (generated kernels on a GPU, the torch reference elsewhere); with
        ``timed``, each segment's time."""
        return self.engine.run(self.execution_plan(inputs, **options), inputs, timed=timed)

    def execute(self, inputs: list[Any], return_execution: bool = False,
                device: torch.device | None = None, keep_warm: bool = True,
                **options: Any) -> list[torch.Tensor] | Execution:
        """Plan, compile and run on real inputs: the compiled program on a GPU (the fast path
        every door shares), ``run`` on the CPU or when per-segment times are asked for.
        ``device``: the GPU to run on when no argument is a tensor (nvFuser runs a random or
        iota fusion without tensor inputs there: its kernels, its CUDA generator); ignored
        otherwise, the arguments' device decides. ``keep_warm``: whether the program run becomes
        ``warm`` (a run without plan options only; a caller's own options may rule it out)."""
        keep_warm = keep_warm and not options
        inputs = with_cpu_scalars_on_device(list(inputs))
        tensorless = not any(isinstance(a, torch.Tensor) for a in inputs)
        gpu = on_gpu(inputs) or (tensorless and device is not None and device.type == "cuda")
        if not gpu or (return_execution and not tensorless):
            result = self.run(inputs, timed=return_execution, **options)
            return result if return_execution else result.outputs
        if not tensorless:
            return self._launch(self.program(inputs, **options), inputs, keep_warm)
        with torch.cuda.device(device):
            # no tensor has touched the GPU yet in a fresh process: torch makes the device's
            # primary context current on its first use, and the kernels launch in it
            torch.empty(0, device=device)
            program = self.program(inputs, **options)
            if not return_execution:
                return self._launch(program, inputs, keep_warm)
            # timed whole: no tensor names the device for a segment
            outputs, seconds = time_call(lambda: program.run(inputs), True)
            planned = self.execution_plan(inputs, **options)
            return Execution(outputs, [SegmentTiming(0, "program", seconds, planned.io_bytes,
                                                     "cuda")], "cuda")

    def _launch(self, program: Program | HostCall, inputs: list[Any],
                keep_warm: bool) -> list[torch.Tensor]:
        if keep_warm:
            self.warm = program.call
        return program.run(inputs)


_DEFAULT = Engine()


def default_engine() -> Engine:
    """The process's engine: every door uses it unless handed another."""
    return _DEFAULT
