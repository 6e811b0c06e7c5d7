"""GEMM epilogues in a Thunder trace: elementwise work beside a matmul moves into it.

- Forward: ``h = linear(x, w, b)`` followed by elementwise ops computing ``g = gelu_tanh(h)``
  becomes one call returning ``(g, h)`` (cuBLASLt GELU_AUX_BIAS).
- Backward: ``dg = matmul(dy, w2)`` (perhaps reshaped) followed by elementwise ops computing
  ``dh = dg * gelu_tanh'(h)`` becomes one call (cuBLASLt DGELU), where ``dg`` has no other use.
- Residual: ``y = linear(x, w, b)`` used only in ``r + y`` becomes one call reading ``r`` as
  the GEMM's ``C`` (``beta = 1``).

The idea: recognition is by value, not by shape of the graph. Thunder decomposes GELU and its
derivative into a few dozen prims whose order and casts vary with dtype and version. So the
elementwise subgraph computed from ``h`` (and ``dg``) is evaluated in float64 at fixed sample
points and compared with the closed form. Only branch-free arithmetic qualifies (mul, add, sub,
div, neg, pow, tanh, casts), so the values are analytic functions of the inputs: two different
ones agreeing to 1e-9 at 257 scattered points is no realistic accident. Casts count as exact:
cuBLASLt computes the epilogue in fp32 with no 16-bit rounding between its steps, as fusecut's
regions drop round trips through 16 bits that nothing compares (``thunder.layout``); a GELU's
output is never compared, so the missing roundings move it by a few bf16 units at most.

Only GEMMs whose output has at least ``EPILOGUE_MIN_BYTES`` are rewritten: a library call's host
time would cost small ones more than the pass it saves. The fused calls run
``thunder.fused_gemm`` (cuBLASLt on CUDA, the same values through torch elsewhere);
everything the rewrite makes dead leaves through dead-code elimination.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Number

import torch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, from_trace
from thunder.core.transform_common import dce

from fusecut.thunder.fused_gemm import linear_gelu_tanh, linear_residual, matmul_dgelu_tanh

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


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(((got - want).abs() <= _TOLERANCE * want.abs().clamp(min=1.0)).all())


# A fused call costs more host time than torch's linear (ctypes, about 20-40 us on the H100's
# host), so it pays only where the pass it removes is worth that much GPU time: a 16 MiB product
# read back takes about 6 us. Batch-1 inference products (128 tokens: at most 2 MiB) stay
# unfused; a training step's (16384 tokens: 64-256 MiB) fuse.
EPILOGUE_MIN_BYTES = 16 << 20


@dataclass
class EpilogueOps:
    """The fused calls, as operators of one executor, and the smallest GEMM output worth one."""

    linear_gelu: Symbol
    matmul_dgelu: Symbol
    linear_residual: Symbol
    min_bytes: int = EPILOGUE_MIN_BYTES


def register_epilogue_ops(executor, prefix: str,
                          min_bytes: int = EPILOGUE_MIN_BYTES) -> EpilogueOps:
    def linear_gelu_meta(x, weight, bias):
        shape = (*x.shape[:-1], weight.shape[0])
        return TensorProxy(like=x, shape=shape), TensorProxy(like=x, shape=shape)

    def matmul_dgelu_meta(grad, weight, h):
        return TensorProxy(like=h)

    def linear_residual_meta(x, weight, bias, residual):
        return TensorProxy(like=residual)

    return EpilogueOps(
        executor.register_operator(f"{prefix}_linear_gelu_tanh", meta=linear_gelu_meta,
                                   fn=linear_gelu_tanh),
        executor.register_operator(f"{prefix}_matmul_dgelu_tanh", meta=matmul_dgelu_meta,
                                   fn=matmul_dgelu_tanh),
        executor.register_operator(f"{prefix}_linear_residual", meta=linear_residual_meta,
                                   fn=linear_residual),
        min_bytes)


@dataclass
class Rewrite:
    """One pass over a trace: its bound symbols indexed, and what replaces or drops which."""

    bsyms: list[BoundSymbol]
    producer: dict[str, int] = field(default_factory=dict)
    proxies: dict[str, TensorProxy] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    returned: set[str] = field(default_factory=set)
    replaced: dict[int, BoundSymbol] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)

    def __post_init__(self):
        for i, b in enumerate(self.bsyms):
            for o in b.flat_outs:
                if isinstance(o, TensorProxy):
                    self.producer[o.name] = i
                    self.proxies[o.name] = o
            for a in b.flat_args:
                if isinstance(a, TensorProxy):
                    self.consumers.setdefault(a.name, []).append(i)
                    self.proxies.setdefault(a.name, a)
            if b.sym.id == prims.python_return.id:
                self.returned.update(a.name for a in b.flat_args if isinstance(a, TensorProxy))

    def sources(self, name: str) -> list[str]:
        """``name`` and what it is a cast or copy of, back to where the value was computed."""
        chain = [name]
        while chain[-1] in self.producer:
            bsym = self.bsyms[self.producer[chain[-1]]]
            tensors = [a for a in bsym.flat_args if isinstance(a, TensorProxy)]
            if len(tensors) != 1 or any(leaf.sym.id not in _IDENTITY for leaf in _leaves(bsym)):
                break
            chain.append(tensors[0].name)
        return chain

    def path(self, name: str, seeds: set[str]) -> set[int]:
        """The bound symbols that compute ``name`` from ``seeds``."""
        out, todo = set(), [name]
        while todo:
            v = todo.pop()
            if v in seeds or v not in self.producer or self.producer[v] in out:
                continue
            out.add(self.producer[v])
            todo += [a.name for a in self.bsyms[self.producer[v]].flat_args
                     if isinstance(a, TensorProxy)]
        return out

    def only_on_path(self, result: str, seeds: set[str], kept: set[str]) -> bool:
        """Every value from ``seeds`` to ``result`` (those in ``kept`` aside, which stay live
        anyway) is used only on the way to ``result``: once ``result`` comes from elsewhere, all
        of them, and the seeds not kept, are dead."""
        path = self.path(result, seeds)
        steps = {o.name for i in path for o in self.bsyms[i].flat_outs
                 if isinstance(o, TensorProxy)} | seeds
        steps -= kept | {result}
        return not (steps & self.returned) and all(
            u in path for v in steps for u in self.consumers.get(v, []))

    def shaped_like(self, name: str, like: TensorProxy) -> bool:
        p = self.proxies[name]
        return tuple(p.shape) == tuple(like.shape) and p.dtype == like.dtype

    def exits(self, closure: Closure, like: TensorProxy) -> list[str]:
        """Values the closure computes, shaped and typed like ``like``, that something outside
        it uses (or the trace returns)."""
        return [o.name for i in sorted(closure.bsyms) for o in self.bsyms[i].flat_outs
                if isinstance(o, TensorProxy) and self.shaped_like(o.name, like)
                and (o.name in self.returned
                     or any(u not in closure.bsyms for u in self.consumers.get(o.name, [])))]

    def linears(self, min_bytes: int):
        """(position, x, weight, bias, output) of each ``linear`` not yet rewritten whose
        output has at least ``min_bytes``."""
        for i, bsym in enumerate(self.bsyms):
            if i in self.replaced or not _is(bsym, prims.linear):
                continue
            x, weight, bias = (list(bsym.args) + [None])[:3]
            y = bsym.output
            if (isinstance(y, TensorProxy) and isinstance(weight, TensorProxy)
                    and weight.ndim == 2 and (bias is None or bias.ndim == 1)
                    and math.prod(y.shape) * y.dtype.bytes >= min_bytes):
                yield i, x, weight, bias, y


def fuse_gemm_epilogues(trace: TraceCtx, ops: EpilogueOps) -> TraceCtx:
    """``trace`` with each tanh GELU after a ``linear`` computed in that linear's epilogue, each
    GELU derivative applied in the epilogue of the matmul that produces its gradient, and each
    residual added to a ``linear``'s output read by that GEMM."""
    rewrite = Rewrite(list(trace.bound_symbols))
    _fuse_gelu(rewrite, ops)
    _fuse_residuals(rewrite, ops)
    if not rewrite.replaced:
        return trace
    out = from_trace(trace)
    out.bound_symbols = [rewrite.replaced.get(i, b) for i, b in enumerate(rewrite.bsyms)
                         if i in rewrite.replaced or i not in rewrite.dropped]
    return dce(out)


def _fuse_gelu(rewrite: Rewrite, ops: EpilogueOps) -> None:
    bsyms = rewrite.bsyms
    h_samples = _samples(0)
    want_g = gelu_tanh(h_samples)
    for i, x, weight, bias, h in list(rewrite.linears(ops.min_bytes)):
        forward = _closure(bsyms, {h.name: h_samples})
        gs = [g for g in rewrite.exits(forward, h)
              if _close(forward.values[g], want_g)]
        if not gs:
            continue
        rewrite.replaced[i] = ops.linear_gelu.bind(x, weight, bias,
                                                   output=(rewrite.proxies[gs[0]], h))
        rewrite.dropped.add(rewrite.producer[gs[0]])
        _fuse_derivative(rewrite, h, forward, ops)


def _fuse_derivative(rewrite: Rewrite, h: TensorProxy, forward: Closure,
                     ops: EpilogueOps) -> None:
    """The matmul whose product, times GELU's derivative at ``h``, is some ``dh``: one call."""
    bsyms, consumers = rewrite.bsyms, rewrite.consumers
    dg_samples = _samples(1)
    want_dh = gelu_tanh_backward(dg_samples, forward.values[h.name])
    for m, bsym in enumerate(bsyms):
        if not _is(bsym, prims.matmul) or m in rewrite.replaced:
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
        candidates = [d for d in rewrite.exits(both, h)
                      if d not in forward.values and _close(both.values[d], want_dh)]
        if candidates and rewrite.only_on_path(candidates[0], {h.name, dg.name},
                                               set(forward.values)):
            rewrite.replaced[rewrite.producer[candidates[0]]] = ops.matmul_dgelu.bind(
                grad, weight, h, output=rewrite.proxies[candidates[0]])
            return


def _fuse_residuals(rewrite: Rewrite, ops: EpilogueOps) -> None:
    """A ``linear`` output used only to be added to another tensor ``r`` of its shape: the sum
    comes from the GEMM, reading ``r`` as its ``C``."""
    bsyms = rewrite.bsyms
    y_samples, r_samples = _samples(2), _samples(3)
    want = y_samples + r_samples
    for _, x, weight, bias, y in list(rewrite.linears(ops.min_bytes)):
        alone = _closure(bsyms, {y.name: y_samples})
        others = {a.name for v in alone.values for i in rewrite.consumers.get(v, [])
                  for a in bsyms[i].flat_args if isinstance(a, TensorProxy)} - set(alone.values)
        for r in sorted({root for o in others for root in rewrite.sources(o)}):
            if not rewrite.shaped_like(r, y):
                continue
            both = _closure(bsyms, {y.name: y_samples, r: r_samples})
            sums = [v for v in both.values if v not in alone.values and v != r
                    and rewrite.shaped_like(v, y) and _close(both.values[v], want)]
            if not sums or rewrite.producer[sums[0]] in rewrite.replaced:
                continue
            if not rewrite.only_on_path(sums[0], {y.name, r}, {r}):
                continue  # y, or a step from it to the sum, has another use
            rewrite.replaced[rewrite.producer[sums[0]]] = ops.linear_residual.bind(
                x, weight, bias, rewrite.proxies[r], output=rewrite.proxies[sums[0]])
            break
