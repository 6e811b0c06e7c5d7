"""GEMM epilogues in a Thunder trace: an MLP's tanh GELU moves into the matmuls beside it.

- Forward: ``h = linear(x, w, b)`` followed by elementwise ops computing ``g = gelu_tanh(h)``
  becomes one call returning ``(g, h)`` (cuBLASLt GELU_AUX_BIAS).
- Backward: ``dg = matmul(dy, w2)`` (perhaps reshaped) followed by elementwise ops computing
  ``dh = dg * gelu_tanh'(h)`` becomes one call (cuBLASLt DGELU), where ``dg`` has no other use.

The idea: recognition is by value, not by shape of the graph. Thunder decomposes GELU and its
derivative into a few dozen prims whose order and casts vary with dtype and version. So the
elementwise subgraph computed from ``h`` (and ``dg``) is evaluated in float64 at fixed sample
points and compared with the closed form. Only branch-free arithmetic qualifies (mul, add, sub,
div, neg, pow, tanh, casts), so the values are analytic functions of the inputs, and agreement
at a few hundred points to 1e-9 is agreement everywhere. Casts count as exact: fusecut's regions
compute such chains in fp32 too, dropping the round trips through 16 bits.

The fused calls run ``runtime.gemm_epilogues`` (cuBLASLt on CUDA, the same values through torch
elsewhere); everything the rewrite makes dead leaves through dead-code elimination.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Number

import torch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, from_trace
from thunder.core.transform_common import dce

from runtime.gemm_epilogues import linear_gelu_tanh, matmul_dgelu_tanh

_IDENTITY = (prims.convert_element_type.id, prims.shallow_copy.id)
_ARITHMETIC: dict = {prims.add.id: torch.add, prims.sub.id: torch.sub, prims.mul.id: torch.mul,
                     prims.div.id: torch.div, prims.neg.id: torch.neg, prims.pow.id: torch.pow,
                     prims.tanh.id: torch.tanh}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TOLERANCE = 1e-9


def gelu_tanh(h: torch.Tensor) -> torch.Tensor:
    return 0.5 * h * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (h + 0.044715 * h ** 3)))


def gelu_tanh_backward(dg: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(_SQRT_2_OVER_PI * (h + 0.044715 * h ** 3))
    slope = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * h ** 2)
    return dg * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * slope)


def _samples(seed: int) -> torch.Tensor:
    """Points across GELU's curved part and both tails, and a seeded scatter."""
    generator = torch.Generator().manual_seed(seed)
    return torch.cat([torch.linspace(-6.0, 6.0, 193, dtype=torch.float64),
                      3.0 * torch.randn(64, generator=generator, dtype=torch.float64)])


def _leaves(bsym: BoundSymbol) -> list[BoundSymbol]:
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for sub in bsym.subsymbols for leaf in _leaves(sub)]


def _is(bsym: BoundSymbol, prim: Symbol) -> bool:
    """The bound symbol runs exactly one prim, ``prim`` (at any level of decomposition)."""
    leaves = _leaves(bsym)
    return len(leaves) == 1 and leaves[0].sym.id == prim.id


def _evaluate(bsym: BoundSymbol, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The bound symbol's outputs from ``values`` when it is branch-free arithmetic over them
    (and numbers), else None."""
    local = dict(values)
    for leaf in _leaves(bsym):
        args = []
        for a in leaf.args:
            if isinstance(a, TensorProxy):
                if a.name not in local:
                    return None
                args.append(local[a.name])
            elif isinstance(a, Number) and not isinstance(a, bool):
                args.append(a)
            elif leaf.sym.id == prims.convert_element_type.id:
                continue  # the target dtype
            else:
                return None
        out = leaf.output
        if not isinstance(out, TensorProxy) or not args:
            return None
        if leaf.sym.id in _IDENTITY:
            local[out.name] = args[0]
        elif leaf.sym.id in _ARITHMETIC and not leaf.kwargs:
            local[out.name] = _ARITHMETIC[leaf.sym.id](*args)
        else:
            return None
    outs = [o for o in bsym.flat_outs if isinstance(o, TensorProxy)]
    if not outs or any(o.name not in local for o in outs):
        return None
    return {o.name: local[o.name] for o in outs}


@dataclass
class Closure:
    """The values computed elementwise from some seeds, at the sample points, and the bound
    symbols computing them."""

    values: dict[str, torch.Tensor]
    bsyms: set[int]  # positions in the trace


def _closure(bsyms: Sequence[BoundSymbol], seeds: dict[str, torch.Tensor]) -> Closure:
    values, inside = dict(seeds), set()
    for i, bsym in enumerate(bsyms):
        tensors = [a for a in bsym.flat_args if isinstance(a, TensorProxy)]
        if not tensors or any(a.name not in values for a in tensors):
            continue
        outs = _evaluate(bsym, values)
        if outs is not None:
            values.update(outs)
            inside.add(i)
    return Closure(values, inside)


def _exits(bsyms: Sequence[BoundSymbol], closure: Closure, like: TensorProxy,
           returned: set[str]) -> list[str]:
    """Values of the closure shaped and typed like ``like`` that something outside it uses."""
    used_outside = set(returned)
    for i, bsym in enumerate(bsyms):
        if i not in closure.bsyms:
            used_outside.update(a.name for a in bsym.flat_args if isinstance(a, TensorProxy))
    names = []
    for i in sorted(closure.bsyms):
        for o in bsyms[i].flat_outs:
            if (isinstance(o, TensorProxy) and o.name in used_outside
                    and tuple(o.shape) == tuple(like.shape) and o.dtype == like.dtype):
                names.append(o.name)
    return names


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(((got - want).abs() <= _TOLERANCE * want.abs().clamp(min=1.0)).all())


@dataclass
class EpilogueOps:
    """The two fused calls, as operators of one executor."""

    linear_gelu: Symbol
    matmul_dgelu: Symbol


def register_epilogue_ops(executor, prefix: str) -> EpilogueOps:
    def linear_gelu_meta(x, weight, bias):
        shape = (*x.shape[:-1], weight.shape[0])
        return TensorProxy(like=x, shape=shape), TensorProxy(like=x, shape=shape)

    def matmul_dgelu_meta(grad, weight, h):
        return TensorProxy(like=h)

    return EpilogueOps(
        executor.register_operator(f"{prefix}_linear_gelu_tanh", meta=linear_gelu_meta,
                                   fn=linear_gelu_tanh),
        executor.register_operator(f"{prefix}_matmul_dgelu_tanh", meta=matmul_dgelu_meta,
                                   fn=matmul_dgelu_tanh))


def _returned(trace: TraceCtx) -> set[str]:
    names: set[str] = set()
    for bsym in trace.bound_symbols:
        if bsym.sym.id == prims.python_return.id:
            names.update(a.name for a in bsym.flat_args if isinstance(a, TensorProxy))
    return names


def fuse_gelu_epilogues(trace: TraceCtx, ops: EpilogueOps) -> TraceCtx:
    """``trace`` with each tanh GELU after a ``linear`` computed in that linear's epilogue, and
    each GELU derivative applied in the epilogue of the matmul that produces its gradient."""
    bsyms = list(trace.bound_symbols)
    producer = {o.name: i for i, b in enumerate(bsyms) for o in b.flat_outs
                if isinstance(o, TensorProxy)}
    returned = _returned(trace)
    h_samples, dg_samples = _samples(0), _samples(1)
    want_g = gelu_tanh(h_samples)
    want_dh = gelu_tanh_backward(dg_samples, h_samples)
    replaced: dict[int, BoundSymbol] = {}
    dropped: set[int] = set()
    for i, bsym in enumerate(bsyms):
        if not _is(bsym, prims.linear):
            continue
        x, weight, bias = (list(bsym.args) + [None])[:3]
        h = bsym.output
        if not (isinstance(h, TensorProxy) and isinstance(weight, TensorProxy)
                and weight.ndim == 2 and (bias is None or bias.ndim == 1)):
            continue
        forward = _closure(bsyms, {h.name: h_samples})
        gs = [g for g in _exits(bsyms, forward, h, returned)
              if _close(forward.values[g], want_g)]
        if not gs:
            continue
        g = gs[0]
        replaced[i] = ops.linear_gelu.bind(x, weight, bias, output=(_proxy(bsyms, g), h))
        dropped.add(producer[g])
        _fuse_derivative(bsyms, h, forward, returned, dg_samples, want_dh, ops, producer,
                         replaced, dropped)
    if not replaced:
        return trace
    out = from_trace(trace)
    out.bound_symbols = [replaced.get(i, b) for i, b in enumerate(bsyms)
                         if i in replaced or i not in dropped]
    return dce(out)


def _proxy(bsyms: Sequence[BoundSymbol], name: str) -> TensorProxy:
    for b in bsyms:
        for o in b.flat_outs:
            if isinstance(o, TensorProxy) and o.name == name:
                return o
    raise KeyError(name)


def _fuse_derivative(bsyms: Sequence[BoundSymbol], h: TensorProxy, forward: Closure,
                     returned: set[str], dg_samples: torch.Tensor, want_dh: torch.Tensor,
                     ops: EpilogueOps, producer: dict[str, int], replaced: dict[int, BoundSymbol],
                     dropped: set[int]) -> None:
    """The matmul whose product, times GELU's derivative at ``h``, is some ``dh``: one call."""
    consumers: dict[str, list[int]] = {}
    for i, b in enumerate(bsyms):
        for a in b.flat_args:
            if isinstance(a, TensorProxy):
                consumers.setdefault(a.name, []).append(i)
    for m, bsym in enumerate(bsyms):
        if not _is(bsym, prims.matmul) or m in replaced:
            continue
        grad, weight = bsym.args[:2]
        product = bsym.output
        if not (isinstance(grad, TensorProxy) and isinstance(weight, TensorProxy)
                and weight.ndim == 2 and math.prod(product.shape) == math.prod(h.shape)
                and product.shape[-1] == h.shape[-1]):
            continue
        dg = product
        users = consumers.get(product.name, [])
        if len(users) == 1 and _is(bsyms[users[0]], prims.reshape):
            dg = bsyms[users[0]].output
        if tuple(dg.shape) != tuple(h.shape):
            continue
        both = _closure(bsyms, {h.name: forward.values[h.name], dg.name: dg_samples})
        if any(u not in both.bsyms for u in consumers.get(dg.name, [])):
            continue  # the product has another use: it must be written anyway
        candidates = [d for d in _exits(bsyms, both, h, returned)
                      if d not in forward.values and _close(both.values[d], want_dh)]
        if not candidates:
            continue
        dh = candidates[0]
        at = producer[dh]
        replaced[at] = ops.matmul_dgelu.bind(grad, weight, h, output=_proxy(bsyms, dh))
        return
