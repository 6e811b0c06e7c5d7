"""Cross-entropy for Thunder whose backward recomputes the softmax instead of saving it.

The language-model loss reads the largest tensor of a training step: the logits, batch x
sequence x vocabulary. Thunder differentiates ``cross_entropy`` as ``log_softmax`` then
``nll_loss``: the forward writes the whole log-softmax (as large as the logits, in float32 after
the usual ``logits.float()``), the backward reads it back and writes the gradient. Its default
list hands those two ops to Inductor (``torchcompile_xentropy``).

Here the gradient is written out in primitives that fusecut's fusion executor fuses, around one
saved vector: the log-sum-exp of each row.

- forward: ``lse = max + log(sum(exp(x - max)))`` per row, ``loss = lse - x[target]`` over the
  rows whose target is not ``ignore_index``, summed or averaged over them;
- backward: ``dx = (exp(x - lse) - onehot(target)) * dloss / count`` on those rows, 0 on the
  others: one pass that reads the logits and writes their gradient, with the float32 upcast
  and the cast back fused into it.

The forward keeps the logits alive for the backward instead of their log-softmax; each pass
reads and writes the logits once instead of also writing and reading a log-softmax, which in
float32 is twice their size.

It claims ``cross_entropy`` with 2-d (rows, classes) floating input, 1-d integer targets, no
class weights, no label smoothing and a ``mean`` or ``sum`` reduction; anything else stays with
the next executor.
"""

from __future__ import annotations

from typing import Any

import thunder.torch as ltorch
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy, pyval
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor

cross_entropy_ex = OperatorExecutor("fusecut_cross_entropy", version="0.1")
register_executor(cross_entropy_ex)

FLOAT_TYPES = (dtypes.float32, dtypes.bfloat16, dtypes.float16)
INTEGER_TYPES = (dtypes.int64, dtypes.int32)


def claims(a: Any, target: Any, weight: Any = None, size_average: Any = None,
           ignore_index: Any = -100, reduce: Any = None, reduction: Any = "mean",
           label_smoothing: Any = 0.0) -> bool:
    """Whether this ``cross_entropy`` is one this executor writes out (module docstring)."""
    if weight is not None or size_average is not None or reduce is not None:
        return False
    if pyval(label_smoothing) != 0.0 or pyval(reduction) not in ("mean", "sum"):
        return False
    if not (isinstance(a, TensorProxy) and isinstance(target, TensorProxy)):
        return False
    if a.ndim != 2 or target.ndim != 1 or a.shape[0] != target.shape[0]:
        return False
    if a.shape[1] == 0:
        return False
    return (a.dtype in FLOAT_TYPES and target.dtype in INTEGER_TYPES
            and a.device == target.device)


def _forward(a, target, ignore_index: int, reduction: str):
    """(loss, float32 logits, lse per row, the rows that count, the target made safe to index,
    the number of rows that count)."""
    x = ltorch.to(a, dtypes.float32) if a.dtype != dtypes.float32 else a
    row_max = ltorch.amax(x, 1, keepdim=True)
    shifted = ltorch.sub(x, row_max)
    lse = ltorch.add(ltorch.log(ltorch.sum(ltorch.exp(shifted), 1)), ltorch.squeeze(row_max, 1))
    kept = ltorch.ne(target, ignore_index)
    safe = ltorch.where(kept, target, 0)
    picked = ltorch.squeeze(ltorch.take_along_dim(x, ltorch.unsqueeze(safe, 1), 1), 1)
    losses = ltorch.where(kept, ltorch.sub(lse, picked), 0.0)
    total = ltorch.sum(losses)
    count = ltorch.sum(ltorch.to(kept, dtypes.float32))
    loss = ltorch.true_divide(total, count) if reduction == "mean" else total
    return ltorch.to(loss, a.dtype), lse, kept, safe, count


def _execution(a, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
               reduction="mean", label_smoothing=0.0):
    return _forward(a, target, pyval(ignore_index), pyval(reduction))[0]


def _grad(a, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
          reduction="mean", label_smoothing=0.0):
    reduction = pyval(reduction)
    loss, lse, kept, safe, count = _forward(a, target, pyval(ignore_index), reduction)
    grad = ltorch.to(get_grad(loss), dtypes.float32)
    if reduction == "mean":
        grad = ltorch.true_divide(grad, count)
    scale = ltorch.where(kept, grad, 0.0)  # per row
    # the softmax again, from the logits themselves (not a saved float32 copy: the upcast is
    # recomputed here, inside the backward's fusion)
    x = ltorch.to(a, dtypes.float32) if a.dtype != dtypes.float32 else a
    softmax = ltorch.exp(ltorch.sub(x, ltorch.unsqueeze(lse, 1)))
    classes = ltorch.arange(a.shape[1], device=a.device, dtype=safe.dtype)
    onehot = ltorch.eq(ltorch.unsqueeze(classes, 0), ltorch.unsqueeze(safe, 1))
    dx = ltorch.mul(ltorch.sub(softmax, ltorch.to(onehot, dtypes.float32)),
                    ltorch.unsqueeze(scale, 1))
    put_grads((a,), (ltorch.to(dx, a.dtype),))
    return loss


cross_entropy_ex.register_implementation(ltorch.cross_entropy, checker=claims,
                                         execution_transform=_execution, grad_transform=_grad)
