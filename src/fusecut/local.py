"""In-process planning and execution: what ``fd.plan``, ``fd.execute`` and the CLI run.

``Local`` is one definition's state: its plans (per input metadata and options) and its compiled
programs (per argument signature). ``fd.execute`` first offers its arguments to the last program
it ran (``warm``: one signature comparison, then allocate and launch); everything else comes here.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta
from fusecut.optimizer.ir.wire import meta_from_json
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.plan import PlanView
from fusecut.runtime.executor import Execution, SegmentTiming, time_call
from fusecut.runtime.program import Program, baked_positions, signature
from fusecut.runtime.run import compile_plan, on_gpu, run_plan
from fusecut.runtime.streams import HostCall
from fusecut.runtime.tensors import meta_of, with_cpu_scalars_on_device


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


def plan_key(metas: list[InputMeta], options: dict[str, Any]) -> tuple:
    return (tuple(metas), json.dumps(PlanOptions(**options).to_json(), sort_keys=True))


def plan(fusion: Fusion, inputs: list[Any], cache: dict | None = None, **options: Any) -> PlanView:
    metas = as_metadata(inputs)
    opts = PlanOptions(**options)
    key = plan_key(metas, options)
    if cache is not None and key in cache:
        return cache[key]
    internal = make_plan(fusion, metas, opts)
    result = PlanView(internal.to_json(), internal)
    if cache is not None:
        cache[key] = result
    return result


class Local:
    """A definition's plans and compiled programs. Thread-safe: the autograd thread may run a
    backward definition while the main thread runs others."""

    MAX_PROGRAMS = 64

    def __init__(self, fusion: Fusion):
        self.fusion = fusion
        self.plans: dict[Any, PlanView] = {}
        self.programs: dict[tuple, Program] = {}
        self.warm = None  # the last program's warm call (None on another signature)
        self._baked: frozenset[int] | None = None
        self._lock = threading.Lock()

    def plan(self, inputs: list[Any], **options: Any) -> PlanView:
        with self._lock:
            return plan(self.fusion, inputs, self.plans, **options)

    def has_plan(self, inputs: list[Any], **options: Any) -> bool:
        with self._lock:
            return plan_key(as_metadata(inputs), options) in self.plans

    def adopt(self, inputs: list[Any], internal: Any, **options: Any) -> None:
        """Use a plan made elsewhere (a service's, restored here) for these inputs."""
        with self._lock:
            self.plans[plan_key(as_metadata(inputs), options)] = PlanView(internal.to_json(),
                                                                          internal)

    def execute(self, inputs: list[Any], return_execution: bool = False,
                device: torch.device | None = None,
                **options: Any) -> list[torch.Tensor] | Execution:
        """Plan (cached per input metadata), compile (cached) and run on real inputs.
        ``device``: the GPU to run on when no argument is a tensor (nvFuser runs a random or
        iota fusion without tensor inputs there: its kernels, its CUDA generator); ignored
        otherwise, the arguments' device decides."""
        inputs = with_cpu_scalars_on_device(list(inputs))
        tensorless = not any(isinstance(a, torch.Tensor) for a in inputs)
        gpu = on_gpu(inputs) or (tensorless and device is not None and device.type == "cuda")
        if not gpu or (return_execution and not tensorless):
            result = run_plan(self.plan(inputs, **options)._internal, inputs,
                              timed=return_execution)
            return result if return_execution else result.outputs
        if tensorless:
            with torch.cuda.device(device):
                # no tensor has touched the GPU yet in a fresh process: torch makes the device's
                # primary context current on its first use, and the kernels launch in it
                torch.empty(0, device=device)
                program = self.program(inputs, **options)
                if return_execution:  # timed whole: no tensor names the device for a segment
                    outputs, seconds = time_call(lambda: program.run(inputs), True)
                    planned = self.plan(inputs, **options)._internal
                    return Execution(outputs, [SegmentTiming(0, "program", seconds,
                                                             planned.io_bytes, "cuda")], "cuda")
                return self._launch(program, inputs, options)
        return self._launch(self.program(inputs, **options), inputs, options)

    def _launch(self, program: Program | HostCall, inputs: list[Any],
                options: dict[str, Any]) -> list[torch.Tensor]:
        if not options:
            self.warm = program.call
        return program.run(inputs)

    def program(self, inputs: list[Any], **options: Any) -> Program | HostCall:
        """The compiled program for GPU arguments like ``inputs``: planned (cached), its
        kernels generated and compiled (cached) the first time, nothing launched."""
        if self._baked is None:
            self._baked = baked_positions(self.fusion)
        sig = signature(inputs, self._baked)
        key = (sig, json.dumps(options, sort_keys=True, default=str)) if options else sig
        if not any(isinstance(a, torch.Tensor) for a in inputs) and torch.cuda.is_available():
            key = (key, torch.cuda.current_device())  # no tensor names the device: the program
            # is built for the current one
        program = self.programs.get(key)
        if program is None:
            planned = self.plan(inputs, **options)._internal
            program = compile_plan(planned, inputs, sig)
            with self._lock:
                if len(self.programs) >= self.MAX_PROGRAMS:
                    self.programs.pop(next(iter(self.programs)))
                self.programs[key] = program
        return program
