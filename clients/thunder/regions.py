"""A region at run time: ``FusecutRegion`` runs its definition (shared process-wide by text,
thread-safe), one variant per memory order of its inputs; a failure at any stage (translate,
plan, codegen, compile, launch) runs the region on torch from then on, never the user's step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from thunder.core import prims
from thunder.core.proxies import Proxy, unvariableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, tracectx

from fusecut.definition import FusionDefinition
from fusecut.fronts import RegionFailure, stage
from fusecut.plan import PlanView
from fusecut.runtime.memory_order import Order, inverse, orders_of, output_orders
from fusecut.runtime.run import on_gpu
from fusecut.thunder.translation import Translation

# ---- plans and runs: process-wide, thread-safe -----------------------------------------------

_definitions: dict[str, FusionDefinition] = {}  # definition text -> the one shared definition
_definitions_lock = threading.Lock()


def shared_definition(fd: FusionDefinition) -> FusionDefinition:
    """One definition object per definition text, so that every region with the same fusion (a
    forward re-fused after rematerialization, a second jitted model) shares its plans and
    programs. The definition's own cache is keyed by input metadata and is thread-safe."""
    key = repr(fd)
    with _definitions_lock:
        return _definitions.setdefault(key, fd)


@dataclass(frozen=True)
class _Variant:
    """The definition a region runs for inputs in given memory orders (see ``memory_order``)."""

    definition: FusionDefinition
    in_orders: tuple[Order | None, ...]
    # per computed output, in the definition's order: the permutation that views it in the
    # logical order (the inverse of the memory order it was written in)
    out_views: tuple[Order | None, ...]

    def inputs(self, args: list[Any]) -> list[Any]:
        if not self.in_orders:
            return args
        return [a if o is None else a.permute(o) for a, o in zip(args, self.in_orders)]

    def outputs(self, results: list[Any]) -> list[Any]:
        if not self.out_views:
            return results
        return [r if v is None else r.permute(v) for r, v in zip(results, self.out_views)]


# ---- failures --------------------------------------------------------------------------------

log = logging.getLogger("fusecut.thunder")

def fast_path_off() -> bool:
    return False


class FusecutRegion:
    """The callable a fusion symbol runs: fusecut's plan and kernels for one region.

    ``retranslate(in_orders, out_orders)`` makes the region's definition for inputs in other
    memory orders: the first call with a new layout of permuted inputs builds that variant."""

    def __init__(self, name: str, translation: Translation, plan_remote: str | None,
                 fallback: Callable[[], Callable],
                 retranslate: Callable[[tuple, tuple], Translation] | None = None,
                 out_ranks: Sequence[int] = ()):
        self.name = name
        self.translation = translation
        self.definition = shared_definition(translation.definition)
        self.plan_remote = plan_remote
        self.calls = 0
        self.first_args: list[Any] | None = None  # metadata of the first call, for reports
        self.fallback_reason: str | None = None
        self.fallback_stage: str | None = None  # one of STAGES, when the region gave up
        # wall seconds of translate, plan and codegen (generation and NVRTC): the region's part
        # of the first step (later calls add a cache lookup)
        self.setup_seconds: dict[str, float] = {}
        self._fallback_factory = fallback
        self._fallback: Callable | None = None
        self._lock = threading.Lock()
        self._retranslate = retranslate
        self._out_ranks = tuple(out_ranks)
        row_major = _Variant(self.definition, (), ())
        self._variants: dict[tuple, _Variant] = {(): row_major}
        self._first_variant = row_major

    def __call__(self, *args: Any) -> list[Any]:
        self.calls += 1
        if self._fallback is not None:
            return self._fallback(*args)
        try:
            results = self._run(list(args))
        except RegionFailure as failure:  # never the user's step: this region runs on torch
            self._give_up(failure)
            return self._fallback(*args)
        return [args[i] if where == "in" else results[i]
                for where, i in self.translation.outputs]

    def _give_up(self, failure: RegionFailure) -> None:
        """From now on the region runs on the next executor (torch); said once, in a warning
        and in the region's report."""
        with self._lock:
            if self._fallback is not None:
                return
            self.fallback_stage = failure.stage
            self.fallback_reason = str(failure)
            self._fallback = self._fallback_factory()
        log.warning("fusecut region %s runs on torch from now on: %s", self.name, failure)

    def _variant(self, args: list[Any]) -> _Variant:
        in_orders = orders_of(args) if self._retranslate is not None else ()
        key = in_orders if any(o is not None for o in in_orders) else ()
        variant = self._variants.get(key)
        if variant is None:
            per_output = output_orders(args, in_orders, self._out_ranks)
            views = tuple(None if o is None else inverse(o)
                          for o, (where, _) in zip(per_output, self.translation.outputs)
                          if where == "out")
            with stage("translate", self.setup_seconds):
                translation = self._retranslate(in_orders, per_output)
            variant = _Variant(shared_definition(translation.definition), in_orders, views)
            with self._lock:
                variant = self._variants.setdefault(key, variant)
        return variant

    def _run(self, args: list[Any]) -> list[Any]:
        variant = self._variant(args)
        args = variant.inputs(args)
        definition = variant.definition
        if self.first_args is None:
            from fusecut.engine import as_metadata

            self.first_args = as_metadata(args)
            self._first_variant = variant
        handle = definition.handle
        warm = handle.warm  # a compiled program for arguments like these: no metadata,
        if warm is not None:  # no planning, no service call
            with stage("launch"):
                outputs = warm(args)
            if outputs is not None:
                return variant.outputs(outputs)
        # Each stage on its own, so that a failure says where it happened (all are cached: a
        # stage done before costs a lookup).
        with stage("plan", self.setup_seconds):
            if self.plan_remote is not None:
                self._adopt_remote_plan(definition, args)
            handle.execution_plan(args)
        if on_gpu(args):
            # generated and compiled: a CompileError says "compile"
            with stage("codegen", self.setup_seconds):
                handle.program(args)
        with stage("launch"):
            return variant.outputs(definition.execute(args))

    def _adopt_remote_plan(self, definition: FusionDefinition, args: list[Any]) -> None:
        """Plan through the service (metadata only) once per input signature; run locally."""
        from fusecut.client import Client
        from fusecut.engine import as_metadata
        from fusecut.optimizer.plan.restore import restore_plan

        handle = definition.handle
        metas = as_metadata(args)
        if handle.cached_plan(metas) is not None:
            return
        with Client(self.plan_remote) as client:
            remote = client.plan(handle.fusion, metas)
        handle.adopt(metas, restore_plan(handle.fusion, metas, remote.json))

    def plan(self):
        """The plan the first call ran (cached: asking again costs nothing)."""
        if self.first_args is None or self.fallback_reason is not None:
            return None
        handle = self._first_variant.definition.handle
        return PlanView(plan=handle.execution_plan(self.first_args))

    @property
    def first_definition(self) -> FusionDefinition:
        """The definition the first call ran (the row-major one, or a memory-order variant)."""
        return self._first_variant.definition


def region_key(bsyms: Sequence[BoundSymbol], inputs: Sequence[Any],
                outputs: Sequence[Any]) -> tuple:
    """A region's identity for ``FusecutExecutor.fuse``: the very bound symbols, and the names of
    its inputs and outputs (proxies, or Thunder's variables of them), in order."""
    def names(xs: Sequence[Any]) -> tuple[str, ...]:
        return tuple(unvariableify(x).name for x in xs)

    return tuple(map(id, bsyms)), names(inputs), names(outputs)


def torch_callable(bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy],
                    outputs: Sequence[Proxy]) -> Callable:
    """The region run by Thunder's torch executor: the fallback when fusecut cannot plan it."""
    from thunder.core.codeutils import SigInfo
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torchex import ex as pytorch_ex

    trace = TraceCtx(None)
    trace.args = list(inputs)
    trace.kwargs = {}
    trace.names = {a.name for a in inputs}
    with tracectx(trace):
        for a in inputs:
            prims.unpack_trivial(a, name=a.name)
    trace.bound_symbols += list(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in trace.bound_symbols:
        for o in bsym.flat_outs:
            if isinstance(o, Proxy) and o.name not in trace.names:
                trace.add_name(o.name)
    trace._siginfo = SigInfo("fusecut_fallback")
    trace._siginfo.args = [(a.name, None) for a in inputs]
    fn = transform_for_execution(trace, executors_list=(pytorch_ex,)).python_callable(
        include_decorators=False)
    return torch.no_grad()(fn)


class Fallback:
    """A re-fused region fusecut cannot express, run by Thunder's torch executor."""

    def __init__(self, name: str, reason: str, factory: Callable[[], Callable]):
        self.name = name
        self.fallback_stage = "translate"
        self.fallback_reason = f"translate failed: {reason}"
        self.calls = 0
        self._fn = factory()
        log.warning("fusecut region %s runs on torch: %s", name, self.fallback_reason)

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self._fn(*args)


def fusecut_regions(trace: TraceCtx) -> list[tuple[BoundSymbol, Any]]:
    """The fusecut fusion symbols of an execution trace and the callables they run, including
    those inside another executor's fusion (a CUDA graph's region holds fusecut's)."""
    def found(bsyms: Sequence[BoundSymbol]) -> list[tuple[BoundSymbol, Any]]:
        out = []
        for bsym in bsyms:
            fn = (bsym._call_ctx or {}).get(bsym.sym.name) if bsym.sym.is_fusion else None
            if isinstance(fn, (FusecutRegion, Fallback)):  # what fusecut_ex's fusions call
                out.append((bsym, fn))
            elif bsym.sym.is_fusion:
                out.extend(found(bsym.subsymbols))
        return out

    return found(trace.bound_symbols)
