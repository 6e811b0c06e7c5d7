"""A Thunder region's prims as a fusecut ``FusionDefinition``: ``translate`` walks the region in
program order and emits each prim as the frontend op of the same meaning (``_emit``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Number
from typing import Any

from thunder.core import dtypes
from thunder.core.proxies import IntegerProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol

from fusecut.definition import FusionDefinition
from fusecut.optimizer.errors import FusecutError, counted
from fusecut.optimizer.ir.dtypes import DType
from fusecut.runtime.memory_order import Order, inverse
from fusecut.runtime.tensors import from_torch_dtype

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
