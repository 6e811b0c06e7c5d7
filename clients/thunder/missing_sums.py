"""Gradients Thunder labels 0-d but computes at a broadcast shape: the missing sum put back.

Thunder's prims let a 0-d tensor broadcast against any shape (``scale * w`` with a 0-d
``scale``). Thunder 0.2.6's backward does not always sum the gradient of such an operand over the
broadcast axes: on ``(scale.exp().clamp(max=100) * w) @ y.t()`` in bf16 a prim computes a
``[4, 16]`` value whose proxy says ``bf16[]``, and every value after it inherits the label
(issue 41). Thunder alone gets away with it: torch runs whatever shape comes, and autograd sums
the mis-shaped gradient down to the parameter. fusecut plans a region from its proxies, so the
region that received the value could not plan and fell back to torch.

The label is what Thunder means, the value is what it computed. So where an elementwise bound
symbol has tensor operands of one shape with elements and a 0-d output, this pass makes the
output the sum over every axis, which the gradient of a broadcast is: the bound symbol writes a
new value of the operands' shape, and a ``sum`` (in float32 for 16-bit values, as Thunder sums)
makes the 0-d output from it. Every later label is then true. The sum sits as early as the
labels allow; after it the values on a gradient's path are linear in it, with 0-d coefficients,
so summing there or (as autograd does for Thunder alone) at the end gives the same gradient, and
a gradient added to another, correctly 0-d, one is no longer counted once per element.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from thunder.core import dtypes, prims
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, tracectx

__all__ = ["mislabelled_shape", "sum_mislabelled_gradients"]


def _leaves(bsym: BoundSymbol) -> list[BoundSymbol]:
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for sub in bsym.subsymbols for leaf in _leaves(sub)]


def mislabelled_shape(bsym: BoundSymbol, elementwise: Collection[Any]) -> tuple[int, ...] | None:
    """The shape a bound symbol of elementwise prims (``elementwise``: their ids) really
    computes, where its output says 0-d and its tensor operands with elements all have that one
    shape; else None (its label is right, or it is not elementwise)."""
    out = bsym.output
    if not (isinstance(out, TensorProxy) and out.ndim == 0):
        return None
    if not dtypes.is_float_dtype(dtypes.to_dtype(out.dtype)):
        return None  # a gradient is a float; anything else is left as it is
    shapes = {tuple(a.shape) for a in bsym.flat_args if isinstance(a, TensorProxy) and a.ndim}
    if len(shapes) != 1:
        return None
    if not all(leaf.sym.id in elementwise for leaf in _leaves(bsym)):
        return None
    return shapes.pop()


def sum_mislabelled_gradients(trace: TraceCtx, elementwise: Collection[Any]) -> TraceCtx:
    """``trace`` with each elementwise bound symbol that labels a broadcast-shaped result 0-d
    computing it at its real shape, then summed to the 0-d value its label promises (see the
    module docstring). ``trace`` itself when there is none (almost always)."""
    if not any(mislabelled_shape(b, elementwise) is not None for b in trace.bound_symbols):
        return trace
    out = from_trace(trace)
    bsyms: list[BoundSymbol] = []
    with tracectx(out):
        for bsym in trace.bound_symbols:
            shape = mislabelled_shape(bsym, elementwise)
            if shape is None:
                bsyms.append(bsym)
                continue
            zero_d = bsym.output
            full = TensorProxy(like=zero_d, shape=shape)
            bsyms.append(bsym.from_bsym_swap_proxies({variableify(zero_d): full}))
            out.push_scope([])
            dtype = dtypes.to_dtype(zero_d.dtype)
            wide = dtype in (dtypes.bfloat16, dtypes.float16)
            summed = prims.sum(prims.convert_element_type(full, dtypes.float32) if wide else full,
                               tuple(range(len(shape))))
            if wide:
                summed = prims.convert_element_type(summed, dtype)
            made = out.pop_scope()
            # the last prim writes the very proxy later bound symbols read
            made[-1] = made[-1].from_bsym_swap_proxies({variableify(summed): zero_d})
            bsyms.extend(made)
    out.bound_symbols = bsyms
    return out
