"""``fusecut_ex``: a Lightning Thunder fusion executor that plans and runs regions with fusecut.

    import thunder
    from thunder.executor import fusecut_ex

    jitted = thunder.jit(model, executors=[fusecut_ex])

Thunder groups the prims fusecut claims into regions (and keeps its own rematerialization, which
decides what crosses between regions and from forward to backward); fusecut turns each region
into a definition, plans its kernels and runs them. Anything fusecut cannot take (random numbers,
an unsupported dtype, a region the translation or the planner rejects) stays with the next
executor in the list, never an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Number
from typing import Any

import torch

from fusecut.thunder.compat import before_thunder  # noqa: E402

before_thunder()

import thunder  # noqa: E402
from thunder.core import dtypes, prims, utils  # noqa: E402
from thunder.core.proxies import IntegerProxy, Proxy, TensorProxy, unvariableify  # noqa: E402
from thunder.core.rematerialization import rematerialize, replace_uniform  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx  # noqa: E402
from thunder.core.transform_common import dce  # noqa: E402
from thunder.executors.passes import update_fusion_call_ctx  # noqa: E402
from thunder.executors.utils import Region  # noqa: E402
from thunder.extend import FusionExecutor, register_executor  # noqa: E402

from fusecut.definition import FusionDefinition  # noqa: E402
from fusecut.optimizer.errors import FusecutError, counted  # noqa: E402
from fusecut.optimizer.ir.builder import MAX_RANK  # noqa: E402
from fusecut.optimizer.ir.dtypes import DType  # noqa: E402
from fusecut.runtime.compile import CompileError  # noqa: E402
from fusecut.runtime.lru import BoundedCache  # noqa: E402
from fusecut.runtime.run import on_gpu  # noqa: E402
from fusecut.runtime.tensors import from_torch_dtype  # noqa: E402
from fusecut.thunder.attention import guard_thunder_sdpa, sdpa_in_4d  # noqa: E402
from fusecut.thunder.compile_ahead import compile_region_ahead  # noqa: E402
from fusecut.thunder.epilogues import (  # noqa: E402
    EPILOGUE_MIN_BYTES,
    fuse_gemm_epilogues,
    register_epilogue_ops,
)
from fusecut.thunder.fast_tracing import install as install_fast_tracing  # noqa: E402
from fusecut.thunder.layout import is_layout_only, split_region  # noqa: E402
from fusecut.thunder.memory_order import Order, inverse, orders_of, output_orders  # noqa: E402
from fusecut.thunder.missing_sums import sum_mislabelled_gradients  # noqa: E402
from fusecut.version import __version__  # noqa: E402

__all__ = ["FusecutExecutor", "RegionReport", "executors", "fusecut_ex", "region_reports",
           "thunder"]

# Thunder's first step is mostly its interpreter: two shortcuts in it, the same traces
install_fast_tracing()

# ---- what fusecut claims ------------------------------------------------------------------------

_FLOAT = {dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
_SUPPORTED = _FLOAT | {dtypes.int32, dtypes.int64, dtypes.bool8}

# Thunder prim name -> fusecut op name, where they compute the same thing. ``round`` is left out
# (Thunder rounds half to even), so are integer ``div`` (checked below) and complex numbers.
_UNARY = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bitwise_not", "ceil", "cos",
          "cosh", "digamma", "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "floor",
          "isfinite", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "rsqrt",
          "sign", "signbit", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]
_BINARY = ["add", "atan2", "bitwise_and", "bitwise_or", "bitwise_xor", "div", "eq", "fmod", "ge",
           "gt", "le", "lt", "maximum", "minimum", "mul", "ne", "nextafter", "pow", "remainder",
           "sub"]
POINTWISE = {getattr(prims, n).id: n for n in _UNARY + _BINARY if hasattr(prims, n)}
POINTWISE[prims.where.id] = "where"
POINTWISE[prims.convert_element_type.id] = "cast"
POINTWISE[prims.shallow_copy.id] = "set"
POINTWISE[prims.clone.id] = "set"  # ``x.to(dtype, copy=True)`` is clone + cast
REDUCTIONS = {prims.sum.id: "sum", prims.amax.id: "max", prims.amin.id: "min",
              prims.prod.id: "prod", prims.var.id: "var", prims.var_mean.id: "var_mean"}
SHAPES = {prims.broadcast_in_dim.id: "broadcast_in_dim", prims.reshape.id: "reshape",
          prims.transpose.id: "permute", prims.squeeze.id: "squeeze",
          prims.slice_prim.id: "slice", prims.pad.id: "pad", prims.cat.id: "cat",
          prims.take.id: "index_select", prims.take_along_axis.id: "take_along_axis"}
FACTORIES = {prims.full.id: "full", prims.iota.id: "iota",
             prims.uniform_philox.id: "uniform",
             # Claimed only to keep it a prim until the fusion pass turns it into uniform_philox
             # (translating it as such is refused: a stateful draw never runs in a region).
             prims.uniform.id: "uniform_stateful"}
LIBRARY = {prims.matmul.id: "matmul", prims.linear.id: "linear"}


def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat(a))
        else:
            out.append(a)
    return out


def _tensor_ok(t: TensorProxy) -> bool:
    return (t.device.type in ("cpu", "cuda") and t.dtype in _SUPPORTED and t.ndim <= MAX_RANK
            and all(isinstance(s, int) for s in t.shape))


def _args_ok(*args: Any, **kwargs: Any) -> bool:
    """Every tensor is one fusecut can take, every number a constant, devices agree."""
    devices = set()
    for a in _flat(list(args) + list(kwargs.values())):
        if isinstance(a, TensorProxy):
            if not _tensor_ok(a):
                return False
            devices.add(a.device.type)
        elif isinstance(a, Proxy):  # a NumberProxy: a value known only at run time
            return False
        elif isinstance(a, complex):
            return False
    return len(devices) <= 1


def _div_ok(a: Any, b: Any) -> bool:
    # Thunder's integer division truncates; fusecut's div is true division on floats only.
    tensors = [x for x in (a, b) if isinstance(x, TensorProxy)]
    return _args_ok(a, b) and all(t.dtype in _FLOAT for t in tensors)


def _convert_ok(a: Any, dtype: Any) -> bool:
    return isinstance(a, TensorProxy) and _args_ok(a) and dtypes.to_dtype(dtype) in _SUPPORTED


def _reduction_ok(a: TensorProxy, dims: Sequence[int], **kwargs: Any) -> bool:
    return _args_ok(a, **kwargs) and all(isinstance(d, int) for d in dims)


def _pad_ok(a: TensorProxy, value: Any, config: Sequence[tuple[int, int, int]]) -> bool:
    # Interior (dilation) and negative padding have no fusecut op.
    return _args_ok(a, value) and all(lo >= 0 and hi >= 0 and d == 0 for lo, hi, d in config)


def _take_ok(a: TensorProxy, index: TensorProxy, dim: int) -> bool:
    return _args_ok(a, index) and index.ndim == 1 and index.dtype in (dtypes.int32, dtypes.int64)


def _factory_ok(*args: Any, device: Any, dtype: Any, **kwargs: Any) -> bool:
    return (device.type in ("cpu", "cuda") and dtypes.to_dtype(dtype) in _SUPPORTED
            and _args_ok(*args, **kwargs))


def _uniform_philox_ok(shape: Sequence[int], minval: Any, maxval: Any, *, device: Any,
                       dtype: Any, seed: Any, offset: Any) -> bool:
    """Thunder's dropout draw (``replace_uniform`` makes it from ``uniform``): fusecut's Philox
    kernels compute it from the seed and offset Thunder takes from torch's CUDA generator."""
    return (device.type == "cuda" and dtypes.to_dtype(dtype) in _FLOAT
            and all(isinstance(s, int) for s in shape)
            and all(isinstance(v, Number) for v in (minval, maxval))
            and all(isinstance(v, (int, IntegerProxy)) for v in (seed, offset)))


def _checker(prim_id: Any) -> Callable[..., bool]:
    if prim_id == prims.uniform_philox.id:
        return _uniform_philox_ok
    if prim_id == prims.uniform.id:
        return lambda *args, device, dtype: device.type == "cuda"
    if prim_id == prims.div.id:
        return _div_ok
    if prim_id == prims.convert_element_type.id:
        return _convert_ok
    if prim_id in REDUCTIONS:
        return _reduction_ok
    if prim_id == prims.pad.id:
        return _pad_ok
    if prim_id == prims.take.id:
        return _take_ok
    if prim_id in FACTORIES:
        return _factory_ok
    return _args_ok


# ---- translation: a region's prims -> a fusecut definition -----------------------------------


class TranslationError(Exception):
    """A region fusecut cannot express; it is left to the next executor."""


def _fc_dtype(dtype: Any) -> DType:
    return from_torch_dtype(dtypes.to_torch_dtype(dtypes.to_dtype(dtype)))


@dataclass
class Translation:
    definition: FusionDefinition
    ops: list[str]
    inputs: list[str]  # the region's input proxy names, in argument order
    outputs: list[tuple[str, int]]  # per region output: ("in", arg index) or ("out", output index)


def translate(bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy],
              outputs: Sequence[Proxy], claimed: dict[Any, str],
              in_orders: Sequence[Order | None] = (),
              out_orders: Sequence[Order | None] = ()) -> Translation:
    """A fusecut definition computing ``outputs`` from ``inputs`` with ``bsyms`` (claimed prims).

    Input tensors have symbolic extents, size-1 axes broadcast; numbers become scalars. An
    input with a memory order in ``in_orders`` is taken in that order (``x.permute(order)``,
    row-major) and permuted back inside; an output with one in ``out_orders`` is written in it."""
    if not any(isinstance(p, TensorProxy) for p in inputs):
        # fusecut runs where its input tensors are; with none (factories only) it cannot tell.
        raise TranslationError("a region without input tensors")
    fd = FusionDefinition()
    env: dict[str, Any] = {}
    with fd:
        arg_names = []
        for p in inputs:
            if isinstance(p, IntegerProxy):  # a number known at run time (a Philox seed, offset)
                env[p.name] = fd.define_scalar(dtype=DType.int64)
            elif isinstance(p, TensorProxy):
                shape = [1 if s == 1 else -1 for s in p.shape]
                order = in_orders[len(arg_names)] if in_orders else None
                if order is not None:
                    shape = [shape[axis] for axis in order]
                handle = fd.define_tensor(shape=shape, contiguity=[True] * len(shape),
                                          dtype=_fc_dtype(p.dtype))
                env[p.name] = (handle if order is None
                               else fd.ops.permute(handle, list(inverse(order))))
            else:
                raise TranslationError(f"region input {p.name} is not a tensor or an integer")
            arg_names.append(p.name)

        def value(x: Any) -> Any:
            if isinstance(x, Proxy):
                if x.name not in env:
                    raise TranslationError(f"{x.name} is used before it is defined")
                return env[x.name]
            if isinstance(x, bool):
                return fd.define_scalar(x)
            if isinstance(x, Number) and not isinstance(x, complex):
                return fd.define_scalar(x)
            raise TranslationError(f"argument {x!r} has no fusecut form")

        ops = []
        for bsym in bsyms:
            name = claimed.get(bsym.sym.id)
            if name is None:
                raise TranslationError(f"{bsym.sym.name} is not claimed by fusecut")
            try:
                results = _emit(fd, name, bsym, value)
            except FusecutError as e:
                raise TranslationError(f"{bsym.sym.name}: {e}") from e
            outs = [o for o in bsym.flat_outs]
            if len(outs) != len(results):
                raise TranslationError(f"{bsym.sym.name}: {counted(len(results), 'result')} for "
                                       f"{counted(len(outs), 'output')}")
            for proxy, handle in zip(outs, results):
                if isinstance(proxy, TensorProxy):
                    want = _fc_dtype(proxy.dtype)
                    if handle.dtype != want:  # follow Thunder's result dtype exactly
                        handle = fd.ops.cast(handle, want)
                    env[proxy.name] = handle
            ops.append(bsym.sym.name)

        out_spec: list[tuple[str, int]] = []
        n_out = 0
        for k, p in enumerate(outputs):
            if p.name in arg_names:
                out_spec.append(("in", arg_names.index(p.name)))
            elif isinstance(p, TensorProxy) and p.name in env:
                order = out_orders[k] if out_orders else None
                fd.add_output(env[p.name] if order is None
                              else fd.ops.permute(env[p.name], list(order)))
                out_spec.append(("out", n_out))
                n_out += 1
            else:
                raise TranslationError(f"region output {p.name} is not computed in the region")
    return Translation(fd, ops, arg_names, out_spec)


def _emit(fd: FusionDefinition, name: str, bsym: BoundSymbol, value: Callable) -> list[Any]:
    """The fusecut ops for one prim; returns its result handles."""
    a, kw = bsym.args, bsym.kwargs
    o = fd.ops
    if name in ("sum", "max", "min", "prod"):
        return [getattr(o, name)(value(a[0]), list(a[1]))]
    if name in ("var", "var_mean"):
        r = getattr(o, name)(value(a[0]), list(a[1]), kw["correction"])
        return list(r) if isinstance(r, tuple) else [r]
    if name == "cast":
        return [o.cast(value(a[0]), _fc_dtype(a[1]))]
    if name == "uniform":  # uniform_philox: Thunder's stateless dropout draw
        return [o.uniform(value(a[1]), value(a[2]), list(a[0]), dtype=_fc_dtype(kw["dtype"]),
                          rng_seed=value(kw["seed"]), rng_offset=value(kw["offset"]))]
    if name == "uniform_stateful":
        raise TranslationError("a uniform draw with torch's generator state (not uniform_philox)")
    if name == "set":  # shallow_copy, or clone (whose memory format a fresh tensor has anyway)
        return [o.set(value(a[0]))]
    if name == "broadcast_in_dim":
        return [o.broadcast_in_dim(value(a[0]), list(a[1]), list(a[2]))]
    if name == "reshape":
        return [o.reshape(value(a[0]), list(a[1]))]
    if name == "permute":
        return [o.permute(value(a[0]), list(a[1]))]
    if name == "squeeze":
        return [o.squeeze(value(a[0]), list(a[1]))]
    if name == "slice":
        strides = a[3] if len(a) > 3 else kw.get("strides")
        return [o.slice(value(a[0]), list(a[1]), list(a[2]),
                        list(strides) if strides is not None else None)]
    if name == "pad":
        widths = [w for lo, hi, _ in reversed(a[2]) for w in (lo, hi)]  # last axis first
        return [o.pad(value(a[0]), widths, value(a[1]))]
    if name == "cat":
        return [o.cat([value(t) for t in a[0]], a[1])]
    if name in ("index_select", "take_along_axis"):
        return [getattr(o, name)(value(a[0]), value(a[1]), a[2])]
    if name == "full":
        return [o.full(list(a[0]), value(a[1]), _fc_dtype(kw["dtype"]))]
    if name == "iota":
        return [o.iota(value(a[0]), value(kw["start"]), value(kw["step"]),
                       _fc_dtype(kw["dtype"]))]
    if name == "linear":
        bias = a[2] if len(a) > 2 else kw.get("bias")
        return [o.linear(value(a[0]), value(a[1]), value(bias) if bias is not None else None)]
    return [getattr(o, name)(*[value(x) for x in a])]


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

# Where a region's work can fail, in order. A failure at any of them moves the region to the next
# executor for good: a CompileError escaping into a user's training step is never the answer.
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


def _fast_path_off() -> bool:
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
            from fusecut.local import as_metadata

            self.first_args = as_metadata(args)
            self._first_variant = variant
        warm = definition._warm  # a compiled program for arguments like these: no metadata,
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
            definition._local_state().plan(args)
        if on_gpu(args):
            # generated and compiled: a CompileError says "compile"
            with stage("codegen", self.setup_seconds):
                definition._local_state().program(args)
        with stage("launch"):
            return variant.outputs(definition.execute(args))

    def _adopt_remote_plan(self, definition: FusionDefinition, args: list[Any]) -> None:
        """Plan through the service (metadata only) once per input signature; run locally."""
        from fusecut.client import Client
        from fusecut.local import as_metadata
        from fusecut.optimizer.plan.restore import restore_plan

        local = definition._local_state()
        metas = as_metadata(args)
        if local.has_plan(metas):
            return
        with Client(self.plan_remote) as client:
            remote = client.plan(definition.fusion, metas)
        local.adopt(metas, restore_plan(definition.fusion, metas, remote.json))

    def plan(self):
        """The plan of the first call's inputs (cached: planning again costs nothing)."""
        if self.first_args is None or self.fallback_reason is not None:
            return None
        return self._first_variant.definition._local_state().plan(self.first_args)

    @property
    def first_definition(self) -> FusionDefinition:
        """The definition the first call ran (the row-major one, or a memory-order variant)."""
        return self._first_variant.definition


def _region_key(bsyms: Sequence[BoundSymbol], inputs: Sequence[Any],
                outputs: Sequence[Any]) -> tuple:
    """A region's identity for ``FusecutExecutor.fuse``: the very bound symbols, and the names of
    its inputs and outputs (proxies, or Thunder's variables of them), in order."""
    def names(xs: Sequence[Any]) -> tuple[str, ...]:
        return tuple(unvariableify(x).name for x in xs)

    return tuple(map(id, bsyms)), names(inputs), names(outputs)


def _torch_callable(bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy],
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


# ---- the executor -------------------------------------------------------------------------------


class FusecutExecutor(FusionExecutor):
    """Thunder fusion executor backed by fusecut.

    Args:
        name: the executor's name (unique among registered executors).
        claim_matmul: also claim ``matmul`` and ``linear``; they then run as library segments
            inside fusecut's plan instead of on the next executor.
        plan_remote: a fusecut service URL: plan there (metadata only), run here.
        gemm_epilogues: a tanh GELU after a ``linear`` and its derivative after the backward's
            matmul, and a residual added to a ``linear``, run in those GEMMs' epilogues (see
            ``thunder_epilogues``) where the GEMM's output has at least ``epilogue_min_bytes``.
    """

    def __init__(self, name: str = "fusecut", *, claim_matmul: bool = False,
                 plan_remote: str | None = None, gemm_epilogues: bool = True,
                 epilogue_min_bytes: int = EPILOGUE_MIN_BYTES):
        super().__init__(name, version=__version__)
        self.plan_remote = plan_remote
        self.epilogues = (register_epilogue_ops(self, name, epilogue_min_bytes)
                          if gemm_epilogues else None)
        self.claimed: dict[Any, str] = {**POINTWISE, **REDUCTIONS, **SHAPES, **FACTORIES}
        if claim_matmul:
            self.claimed.update(LIBRARY)
        for prim_id in self.claimed:
            self.register_supported(prim_id, _checker(prim_id))
        # the regions fused lately, by _region_key: their bound symbols (kept, so that no other
        # object takes their ids), prepared bound symbols, inputs, outputs and translation
        self._fused: BoundedCache[tuple, tuple] = BoundedCache(4096)
        # PyTorch's fused inference paths of nn.MultiheadAttention and nn.TransformerEncoderLayer
        # (torch._native_multi_head_attention, torch._transformer_encoder_layer_fwd) are opaque
        # calls Thunder cannot trace: with fusecut in the list, Thunder traces these modules with
        # the fast path off, as the ops it fuses (the same values)
        self._lookasides[torch.backends.mha.get_fastpath_enabled] = _fast_path_off
        # Thunder's sdpa executor claims attention whose kernels then refuse a 2-d or 3-d mask
        # (or a mask broadcast over the batch), failing the step: traced in the 4-d form they
        # take instead (``attention.sdpa_in_4d``)
        self._lookasides[torch.nn.functional.scaled_dot_product_attention] = sdpa_in_4d

    def flatten(self, bsym: BoundSymbol) -> list[BoundSymbol]:
        if self.can_execute(bsym):
            return [bsym]
        if not bsym.subsymbols:
            raise TranslationError(f"{bsym.sym.name} is neither claimed nor decomposable")
        return [leaf for sub in bsym.subsymbols for leaf in self.flatten(sub)]

    def _prepare(self, region: Region) -> tuple[list[BoundSymbol], list[Proxy], list[Proxy]]:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        flat = [leaf for bsym in region.bound_symbols for leaf in self.flatten(bsym)]
        # Drop what the outputs do not need (and the inputs only that needed).
        trace = TraceCtx(None)
        trace.bound_symbols = flat + [prims.python_return.bind(outputs, output=None)]
        needed: set = set()
        trace = dce(trace, needed)
        flat = [b for b in trace.bound_symbols if b.sym.id != prims.python_return.id]
        from thunder.core.proxies import variableify

        inputs = [x for x in inputs if variableify(x) in needed]
        return flat, inputs, outputs

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        # Thunder fuses every region again after its passes (update_fusion_call_ctx), most of
        # them unchanged: a region made of the bound symbols and proxies of one fused before
        # takes that one's translation (a 12-layer nanoGPT: 137 of 495 translations)
        made = self._fused.get(_region_key(region.bound_symbols, region.inputs, region.outputs))
        if made is not None:
            _, bsyms, inputs, outputs, translation = made
            return self._fusion(f"fusecut{fusion_counter}", bsyms, inputs, outputs, translation)
        bsyms, inputs, outputs = self._prepare(region)
        return self._fusion(f"fusecut{fusion_counter}", bsyms, inputs, outputs)

    def _fusion(self, name: str, bsyms: list[BoundSymbol], inputs: list[Proxy],
                outputs: list[Proxy], translation: Translation | None = None) -> BoundSymbol:
        """The fusion symbol that runs ``bsyms`` (claimed prims) as fusecut region ``name``
        (``translation``: theirs, where the caller has it already)."""

        def fallback() -> Callable:
            return _torch_callable(bsyms, inputs, outputs)

        def retranslate(in_orders: tuple, out_orders: tuple) -> Translation:
            return translate(bsyms, inputs, outputs, self.claimed, in_orders, out_orders)

        try:
            if translation is None:
                translation = translate(bsyms, inputs, outputs, self.claimed)
            self._fused.put(_region_key(bsyms, inputs, outputs),
                            (tuple(bsyms), bsyms, inputs, outputs, translation))
            out_ranks = [len(p.shape) if isinstance(p, TensorProxy) else 0 for p in outputs]
            fn: Callable = FusecutRegion(name, translation, self.plan_remote, fallback,
                                         retranslate, out_ranks)
        except TranslationError as e:
            # Only reachable when Thunder re-fuses a region it moved ops into; the first
            # fusion_pass already left untranslatable regions to other executors.
            fn = _Fallback(name, str(e), fallback)
        return self.register_temporary_operation(name, fn, inputs=inputs, outputs=outputs,
                                                 bsyms=bsyms)

    def kernel_of(self, region: Region) -> tuple[list[BoundSymbol], list[Proxy], list[Proxy],
                                                 Translation] | None:
        """The region prepared and translated, where it is worth a kernel: it translates and
        computes something (a region of layout prims only would just copy: torch's views do it
        for nothing); else None. The fusion pass hands both to ``_fusion``, so each region is
        prepared and translated once (a 12-layer nanoGPT's fusion passes: 6.0 s of its first
        step on a 2-core CPU, then 4.9 s)."""
        try:
            bsyms, inputs, outputs = self._prepare(region)
            translation = translate(bsyms, inputs, outputs, self.claimed)
        except TranslationError:
            return None
        return None if is_layout_only(bsyms) else (bsyms, inputs, outputs, translation)

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        start = time.perf_counter_ns()
        from thunder.executors.data_dependent_partition import Node, fuse_bound_symbols

        # Thunder may label a broadcast-shaped gradient 0-d; fusecut plans from labels, so the
        # sum Thunder left out goes in first (``missing_sums``)
        trace = sum_mislabelled_gradients(trace, POINTWISE)
        if self.epilogues is not None:
            trace = fuse_gemm_epilogues(trace, self.epilogues)
        if _uniform_on_cuda_only(trace):
            # As Thunder's nvFuser pass: stateless draws from the generator's seed and offset,
            # which rematerialization may recompute in the backward instead of saving a mask.
            trace = replace_uniform(trace)
        fused = from_trace(trace)
        producers, consumers = utils.producers_and_consumers(trace)

        def fusible(n: Node) -> bool:
            return len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0])

        groups = fuse_bound_symbols(trace, lambda a, b: fusible(a) and fusible(b))
        bsyms_out: list[BoundSymbol] = []
        counter = 0
        for bsyms in groups:
            if len(bsyms) == 1 and not self.can_fuse(bsyms[0]):
                bsyms_out.append(bsyms[0])
                continue
            kernel = self.kernel_of(Region(producers, consumers, bsyms))
            if kernel is None:
                bsyms_out.extend(bsyms)
                continue
            bsyms_out.append(self._fusion(f"fusecut{counter}", *kernel))
            counter += 1
        fused.bound_symbols = bsyms_out
        fused = rematerialize(fused)
        fused = dce(fused)
        fused = self._views_out_of_kernels(fused)
        fused = update_fusion_call_ctx(fused)
        self._compile_ahead(fused)
        ms = (time.perf_counter_ns() - start) // 1_000_000
        fused.set_provenance(TraceProvenance(f"Fusion by fusecut (took {ms} milliseconds)"))
        return fused

    def _compile_ahead(self, trace: TraceCtx) -> None:
        """Each region on CUDA tensors planned and its kernels compiled in background threads
        while Thunder finishes the step's traces (``compile_ahead``): its first launch then
        finds them compiled."""
        for bsym, fn in fusecut_regions(trace):
            if isinstance(fn, FusecutRegion) and fn.plan_remote is None:
                compile_region_ahead(fn.definition, bsym.flat_args)

    def _views_out_of_kernels(self, trace: TraceCtx) -> TraceCtx:
        """Each region's outputs that torch can return as views leave its kernel (see
        ``thunder_layout``); a region left with nothing to compute dissolves into torch prims."""
        out = from_trace(trace)
        bsyms: list[BoundSymbol] = []
        for bsym in trace.bound_symbols:
            if not (bsym.sym.is_fusion and bsym.sym.executor is self):
                bsyms.append(bsym)
                continue
            inputs = [a for a in bsym.flat_args if isinstance(a, Proxy)]
            split = split_region(bsym.subsymbols, inputs, list(bsym.flat_outs))
            if not split.changed:
                bsyms.append(bsym)
                continue
            bsyms.extend(split.before)
            if split.kernel:
                bsyms.append(self._fusion(bsym.sym.name, split.kernel, split.kernel_inputs,
                                          split.kernel_outputs))
            bsyms.extend(split.after)
        out.bound_symbols = bsyms
        return dce(out)


def _uniform_on_cuda_only(trace: TraceCtx) -> bool:
    """Some ``uniform`` draws, all on CUDA (Thunder's generator-state prim reads CUDA's)."""
    draws = [b for b in trace.bound_symbols if b.sym.id == prims.PrimIDs.UNIFORM]
    return bool(draws) and all(b.kwargs["device"].type == "cuda" for b in draws)


class _Fallback:
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


fusecut_ex = FusecutExecutor()
register_executor(fusecut_ex)


# Thunder 0.2.6's cudnn executor computes wrong attention gradients in 16-bit: measured on the
# H100 (cuDNN 9.19, frontend 1.16), a bf16 nanoGPT step's gradients were 1.27-1.52 of their own
# size off the fp32 step where SDPA's were 0.012 (head size 32 and 64, sequences 24 to 128).
# Its forward is right, but a step that trains on it does not train: left out unless asked for.
CUDNN_ATTENTION_WRONG = ("Thunder's cudnn executor computes wrong bf16 attention gradients "
                         "(measured on the H100, cuDNN 9.19, frontend 1.16)")


def executors(executor: FusecutExecutor | None = None, *, cudnn: bool = False,
              attention: bool = True, cross_entropy: bool = True) -> list[Any]:
    """Thunder's default executors with fusecut (``executor``, ``fusecut_ex`` by default) in
    nvFuser's place, or last where nvFuser is absent: just before the executors Thunder always
    appends (torch, python).

    Attention runs on cuDNN through torch's own cuDNN SDPA kernels where they apply
    (``fusecut.thunder.attention``, listed first; ``attention=False`` leaves it out), else on
    Thunder's SDPA executor. Thunder lists its own cudnn executor first where the cuDNN frontend
    is installed; it is left out (``CUDNN_ATTENTION_WRONG``) unless ``cudnn=True``.

    ``cross_entropy`` is differentiated by ``fusecut.thunder.cross_entropy`` (listed first;
    ``cross_entropy=False`` leaves it to Thunder's Inductor executor): its backward recomputes
    the softmax from the logits in fusecut's kernels instead of saving it.

        jitted = thunder.jit(model, executors=fusecut.thunder.executors())
    """
    fusecut = executor if executor is not None else fusecut_ex
    chosen = [e for e in thunder.get_default_executors()
              if e is not fusecut and (cudnn or e.name != "cudnn")]
    names = [e.name for e in chosen]
    for e in chosen:
        if e.name == "sdpa":  # it claims no call its kernels refuse later (``attention``)
            guard_thunder_sdpa(e)
    if "nvfuser" in names:
        chosen[names.index("nvfuser")] = fusecut
    elif "torch" in names:
        chosen.insert(names.index("torch"), fusecut)
    else:
        chosen.append(fusecut)
    if cross_entropy:
        from fusecut.thunder.cross_entropy import cross_entropy_ex

        chosen.insert(0, cross_entropy_ex)
    if attention:
        from fusecut.thunder.attention import cudnn_attention_available, cudnn_attention_ex

        if cudnn_attention_available():
            chosen.insert(0, cudnn_attention_ex)
    return chosen


def transforms(*, cuda_graphs: bool = False) -> list[Any]:
    """The transforms to jit a module with, beside ``executors()``: ``nn.MultiheadAttention`` in
    ops Thunder can differentiate (``fusecut.thunder.multihead_attention``), tied parameters
    traced as one value (``fusecut.thunder.tied_parameters``), and with ``cuda_graphs`` fusecut's
    CUDA-graph transform (``fusecut.thunder.cudagraphs``).

        jitted = thunder.jit(model, executors=fusecut.thunder.executors(),
                             transforms=fusecut.thunder.transforms())
    """
    from fusecut.thunder.multihead_attention import MultiheadAttentionTransform
    from fusecut.thunder.tied_parameters import TiedParametersTransform

    chosen: list[Any] = [MultiheadAttentionTransform(), TiedParametersTransform()]
    if cuda_graphs:
        from fusecut.thunder.cudagraphs import CUDAGraphTransform

        chosen.append(CUDAGraphTransform())
    return chosen


# ---- reports ------------------------------------------------------------------------------------


@dataclass
class RegionReport:
    name: str
    direction: str  # "forward" or "backward"
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

    def summary(self) -> str:
        if self.fallback is not None:
            return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')} on torch "
                    f"({self.fallback})")
        if self.planned_bytes is None:
            return f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, not run yet"
        return (f"{self.direction} {self.name}: {counted(len(self.ops), 'op')}, "
                f"{counted(len(self.segments), 'segment')}, {self.planned_bytes} B planned "
                f"(greedy {self.greedy_bytes}, lower bound {self.lower_bound_bytes}), "
                f"{counted(self.calls, 'call')}, "
                f"set up in {sum(self.setup_seconds.values()):.2f} s")


def fusecut_regions(trace: TraceCtx) -> list[tuple[BoundSymbol, Any]]:
    """The fusecut fusion symbols of an execution trace and the callables they run, including
    those inside another executor's fusion (a CUDA graph's region holds fusecut's)."""
    def found(bsyms: Sequence[BoundSymbol]) -> list[tuple[BoundSymbol, Any]]:
        out = []
        for bsym in bsyms:
            if bsym.sym.is_fusion and isinstance(bsym.sym.executor, FusecutExecutor):
                out.append((bsym, bsym._call_ctx[bsym.sym.name]))
            elif bsym.sym.is_fusion:
                out.extend(found(bsym.subsymbols))
        return out

    return found(trace.bound_symbols)


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
            if isinstance(fn, _Fallback) or getattr(fn, "fallback_reason", None):
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
                report.planned_bytes = plan.io_bytes
                report.greedy_bytes = plan.baseline["io_bytes"]
                report.lower_bound_bytes = plan.totals["lower_bound_bytes"]
                report.segments = [s.kind for s in plan.segments]
            reports.append(report)
    return reports
