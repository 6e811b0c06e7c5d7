"""GEMMs with their neighbours fused into the epilogue, as apex's fused_dense and Transformer
Engine do:

- ``linear_gelu_tanh``: ``h = x w^T + b`` and ``g = gelu_tanh(h)`` in one call that writes both
  (the backward needs ``h``), instead of a GEMM and a pass that reads ``h`` back;
- ``matmul_dgelu_tanh``, its backward: ``dh = (dy @ w) * gelu_tanh'(h)`` in one call, the
  derivative applied to the product before it is written, instead of writing ``dy @ w`` and
  reading it back;
- ``linear_residual``: ``r + x w^T + b``, the residual read by the GEMM as its ``C`` operand.

On CUDA with 16-bit contiguous operands these are cuBLASLt calls (epilogues GELU_AUX_BIAS,
DGELU, BIAS with beta = 1). Anywhere else, or where cuBLASLt offers no algorithm, the same values
come unfused from torch, GELU computed in fp32 from the rounded ``h`` as the unfused trace does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fusecut.thunder.cublaslt import (
    ALIGNMENT,
    DATA_TYPE,
    OP_N,
    OP_T,
    WORKSPACE_BYTES,
    CublasLtError,
    cublaslt,
)


def _fusable(*tensors: torch.Tensor | None) -> bool:
    """cuBLASLt can take them as they are: CUDA, one 16-bit dtype, dense row-major, aligned.
    (On every call's host path: plain attribute reads only.)"""
    first = tensors[0]
    if not first.is_cuda or first.dtype not in DATA_TYPE or first.numel() == 0:
        return False
    device, dtype = first.get_device(), first.dtype
    for t in tensors:
        if t is not None and not (t.dtype == dtype and t.get_device() == device
                                  and t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0):
            return False
    return True


def _run_fused(dtype: torch.dtype, shapes: tuple, epilogue: str, a: torch.Tensor,
               b: torch.Tensor, d: torch.Tensor, **pointers: torch.Tensor | None) -> bool:
    """One cuBLASLt call writing ``d`` (``shapes``: ``plan``'s transposes and column-major
    shapes). False, with nothing launched, where cuBLASLt cannot be loaded, offers no algorithm
    or refuses the call: the caller then computes the same values unfused."""
    try:
        lt = cublaslt()
        plan = lt.plan(dtype, *shapes, epilogue, WORKSPACE_BYTES)
        if plan is None:
            return False
        lt.run(plan, a, b, d, **pointers)
        return True
    except CublasLtError:
        return False


def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gelu_tanh(h), h)`` with ``h = linear(x, weight, bias)``."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if _fusable(rows, weight, bias):
        m = rows.shape[0]
        g = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
        h = torch.empty_like(g)
        # column-major: g^T (n, m) = weight (k, n)^T @ rows^T (k, m)
        if _run_fused(x.dtype, (OP_T, (k, n), OP_N, (k, m), (n, m)),
                      "GELU_AUX" if bias is None else "GELU_AUX_BIAS", weight, rows, g,
                      bias=bias, aux=h):
            return g, h
    h = F.linear(x, weight, bias)
    return F.gelu(h.float(), approximate="tanh").to(h.dtype), h


def matmul_dgelu_tanh(grad: torch.Tensor, weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``(grad @ weight) * gelu_tanh'(h)``, shaped like ``h``."""
    n2, n1 = weight.shape
    rows = grad.reshape(-1, n2)
    m = rows.shape[0]
    if m * n1 != h.numel():
        raise ValueError(f"matmul_dgelu_tanh: grad @ weight is [{m}, {n1}], h is "
                         f"{list(h.shape)}: expected as many elements")
    if _fusable(rows, weight, h):
        dh = torch.empty_like(h)
        # column-major: dh^T (n1, m) = weight (n1, n2) @ rows^T (n2, m)
        if _run_fused(h.dtype, (OP_N, (n1, n2), OP_N, (n2, m), (n1, m)), "DGELU", weight, rows,
                      dh, aux=h):
            return dh
    dg = rows @ weight
    dh = torch.ops.aten.gelu_backward(dg.float(), h.reshape(dg.shape).float(), approximate="tanh")
    return dh.to(h.dtype).reshape(h.shape)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x, weight, bias)``: the residual read by the GEMM (``beta C``) instead
    of by a pass over the GEMM's output."""
    n, k = weight.shape
    rows = x.reshape(-1, k)
    if residual.shape == (*x.shape[:-1], n) and _fusable(rows, weight, bias, residual):
        m = rows.shape[0]
        out = torch.empty_like(residual)
        if _run_fused(x.dtype, (OP_T, (k, n), OP_N, (k, m), (n, m)),
                      "DEFAULT" if bias is None else "BIAS", weight, rows, out, bias=bias,
                      c=residual):
            return out
    return torch.add(residual, F.linear(x, weight, bias))
