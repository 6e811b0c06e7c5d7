"""Run a stream-lowered host program: its stages in order, each stream loop's iterations on CUDA
streams from a per-device pool.

A loop records an event on the caller's stream once; iteration ``i`` runs on stream
``i % num_streams``, which first waits for that event (the caller's work before the loop), then
launches the loop's segments on slice ``i`` of its operands and allocations (views), and the
caller's stream waits for it. Waits are stream-to-stream (``cudaStreamWaitEvent``), never a
device or host synchronisation. On the CPU the same loop runs in order, through the reference.

The first GPU call runs this loop in Python and notes the compiled program each segment ran;
when one program served every iteration and each runs in C++, later calls run the whole host
program in the C++ launcher (``runtime.native_host``): about 28 us of Python per iteration
become a few of C++.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fusecut.optimizer.plan.plan import Plan, Step
from fusecut.runtime.executor import (
    Execution,
    check_matches_plan,
    execute_plan,
    expand_compact,
    plan_steps,
)
from fusecut.runtime.kernels import current_stream
from fusecut.runtime.program import program_for, signature
from fusecut.runtime.rng import call_with_draw, with_implicit_rng
from fusecut.runtime.stream_pool import events_pool, segment_io
from fusecut.runtime.tensors import TORCH_DTYPE, unshare

# GPU runs of a host program that may hand its loop to C++. More than one: a segment program
# that became native during the first run left its intermediates in another layout (a library
# result kept unsqueezed) for part of the iterations, which the second run does not.
NATIVE_TRIES = 3


@dataclass
class HostCall:
    """A host program as the SDK's warm call sees a compiled program: ``call`` answers None
    for arguments unlike the ones it was built for. After its first GPU run it runs in C++ when
    the launcher can (``native``: the launcher's run function and the host program's capsule)."""

    plan: Plan
    signature: tuple
    baked: frozenset[int]
    native: Any = None
    tries: int = 0  # GPU runs that tried to hand the loop to C++
    python_why: str = ""  # why the loop stays in Python, once tried

    def call(self, args: list[Any]) -> list[torch.Tensor] | None:
        if self.native is not None:
            return self._call_native(args)
        if signature(args, self.baked) != self.signature:
            return None
        return self.run(args)

    def _call_native(self, args: list[Any]) -> list[torch.Tensor] | None:
        fusion = self.plan.fusion
        run, capsule, device = self.native
        if fusion.implicit_rng and len(args) == len(fusion.inputs) - len(fusion.implicit_rng):
            return call_with_draw(len(fusion.implicit_rng) - 1, device, args,
                                  lambda full: run(capsule, full, current_stream(device.index)))
        return run(capsule, args, current_stream(device.index))

    def run(self, args: list[Any]) -> list[torch.Tensor]:
        if self.native is not None:
            outs = self._call_native(list(args))
            if outs is not None:
                return outs
        used: dict | None = None
        if self.tries < NATIVE_TRIES and any(isinstance(a, torch.Tensor) and a.is_cuda
                                             for a in args):
            used = {}
        full = with_implicit_rng(self.plan.fusion.implicit_rng, len(self.plan.fusion.inputs),
                                 list(args))
        outputs = run_host(self.plan, full, used).outputs
        if used is not None:
            from fusecut.runtime import launcher
            from fusecut.runtime.native_host import native_host_call

            native = native_host_call(self.plan, full, used)
            self.native, self.python_why = (None, native) if isinstance(native, str) else \
                (native, "")
            # a try unless the launcher is still building (then the next call tries)
            if not launcher.enabled() or launcher.failure() is not None or \
                    launcher.native() is not None:
                self.tries += 1
        return outputs


def run_host(plan: Plan, args: list[Any], used: dict | None = None,
             gpu: bool | None = None) -> Execution:
    """Run ``plan``'s host program on ``args``. ``used``: filled with the programs each
    segment ran, by (step, segment), on the GPU. ``gpu``: compiled programs on streams rather
    than the reference (default: whether a tensor is on a GPU)."""
    fusion = plan.fusion
    args = with_implicit_rng(fusion.implicit_rng, len(fusion.inputs), args)
    scalars = check_matches_plan(plan, args)
    if gpu is None:
        gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    env: dict[str, Any] = dict(zip(fusion.inputs, args))
    for k, step in enumerate(plan.host.steps):
        programs = _Programs(k, used)
        if step.is_loop:
            _run_loop(plan, step, env, scalars, gpu, programs)
        else:
            for j in step.segments:
                env.update(_run_segment(plan, step, j, env, scalars, gpu, {}, programs))
    outputs = []
    for t, how in zip(fusion.outputs, plan_steps(plan).expand):
        outputs.append(env[t] if how is None else expand_compact(env[t], how[1], how[2]))
    for out, inp in fusion.aliases.items():
        env[inp].copy_(outputs[fusion.outputs.index(out)])
    unshare(outputs, args)
    return Execution(outputs, [], "cuda" if gpu else "reference")


class _Programs(dict):
    """The program each segment of a step ran last (iterations differ only in addresses), and
    in ``used`` every program each one ran."""

    def __init__(self, step: int, used: dict | None):
        super().__init__()
        self.step, self.used = step, used

    def ran(self, j: int, program: Any) -> None:
        if self.used is not None:
            seen = self.used.setdefault((self.step, j), [])
            if not any(p is program for p in seen):
                seen.append(program)


def _run_segment(plan: Plan, step: Step, j: int, env: dict[str, Any], scalars: dict[str, Any],
                 gpu: bool, into: dict[str, torch.Tensor], programs: _Programs
                 ) -> dict[str, torch.Tensor]:
    """Run segment ``j`` (as planned for this step) on the values in ``env``; outputs named in
    ``into`` are written there. Returns the segment's outputs by tensor."""
    sources, names = segment_io(plan, j)
    args = [env[s] if is_tensor else scalars[s] for s, is_tensor in sources]
    targets = [into.get(t) for t in names] if into else None
    if gpu:
        program = programs.get(j)
        outs = program.call(args, targets) if program is not None else None
        if outs is None:
            program = programs[j] = program_for(step.plans[j], args)
            outs = program.run(args, targets)
        programs.ran(j, program)
    else:
        outs = execute_plan(step.plans[j], args).outputs
        for value, target in zip(outs, targets or ()):
            if target is not None:
                target.copy_(value.reshape(target.shape))
    return {t: into.get(t, value) for t, value in zip(names, outs)}


def _run_loop(plan: Plan, step: Step, env: dict[str, Any], scalars: dict[str, Any],
              gpu: bool, programs: _Programs) -> None:
    bound = plan.bound
    device = next((v.device for v in env.values() if isinstance(v, torch.Tensor)), None)
    for t in step.allocations:  # ALLOCATE: whole, before the loop, on the caller's stream
        env[t] = torch.empty(bound.compact_shape(t), dtype=TORCH_DTYPE[plan.fusion.tensors[
            t].dtype], device=device)
    if not gpu:
        for i in range(step.stage.extent):
            _run_iteration(plan, step, env, scalars, i, False, programs)
        return
    caller = torch.cuda.current_stream(device)
    entry = caller.record_event()
    pool = events_pool(device, plan.host.num_streams)
    set_stream = torch._C._cuda_setStream  # torch.cuda.set_stream without its Python checks
    try:
        for i in range(step.stage.extent):
            stream, done = pool[i % len(pool)]
            entry.wait(stream)  # Synchronize Stream 0
            set_stream(stream.stream_id, stream.device_index, stream.device_type)
            _run_iteration(plan, step, env, scalars, i, True, programs)  # on the slice's stream
            done.record(stream)
            set_stream(caller.stream_id, caller.device_index, caller.device_type)
            caller.wait_event(done)  # Synchronize Stream ( StreamIdx % numberOfStreams )
    finally:
        set_stream(caller.stream_id, caller.device_index, caller.device_type)


def _run_iteration(plan: Plan, step: Step, env: dict[str, Any], scalars: dict[str, Any],
                   i: int, gpu: bool, programs: _Programs) -> None:
    """One iteration: HirAliasSelect of every slice, then the loop's segments on them."""
    local = {t: env[t] if axis is None else env[t].narrow(axis, i, 1)
             for t, axis in step.slices.items()}
    into = {t: local[t] for t in step.allocations}
    for j in step.segments:
        local.update(_run_segment(plan, step, j, local, scalars, gpu, into, programs))
