"""Torch implementations of nvFuser's library-like ops (``optimizer.ir.ops_library``).

Each takes ``(op, args, env, out_dtypes)`` like the entries of ``runtime.reference._SPECIAL`` and
returns the op's outputs. Ops over NVFP4 data (packed fp4 values, swizzled block-scale layouts) have
no torch implementation on every device: they raise an InputError naming the op, so a definition
using them still parses and plans.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.ops_library import grouped_mm_shape
from fusecut.optimizer.ir.opspec import OPERAND_KINDS, get_spec

UINT64 = getattr(torch, "uint64", torch.int64)


def operands(op: Op, args: list[Any]) -> dict[str, Any]:
    """The op's operands by parameter name; absent optional ones are None."""
    out: dict[str, Any] = {}
    values = iter(args)
    for p in get_spec(op.name).params:
        if p.kind in OPERAND_KINDS:
            present = op.attrs.get(f"has_{p.name}", True) if p.kind in ("T?", "S?") else True
            out[p.name] = next(values) if present else None
    return out


def _compute(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- attention -------------------------------------------------------------------------------


def _dropout_keep(shape, p: float, seed: int, device) -> torch.Tensor:
    """The dropout mask of seed ``seed``: forward and backward draw the same one."""
    gen = torch.Generator(device=device).manual_seed(seed % (1 << 63))
    return torch.rand(shape, generator=gen, dtype=torch.float64, device=device) >= p


def attention(q, k, v, bias, mask, dropout_p: float, is_causal: bool, scale, seed: int):
    """softmax(q k^T * scale + bias, masked) (with dropout) @ v, and the logsumexp of its rows."""
    ct = _compute(q)
    q, k, v = q.to(ct), k.to(ct), v.to(ct)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(ct)
    if is_causal:  # top-left aligned, as torch's is_causal
        L, S = scores.shape[-2:]
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    if dropout_p > 0:
        keep = _dropout_keep(probs.shape, dropout_p, seed, q.device)
        probs = probs * keep / (1.0 - dropout_p)
    return torch.matmul(probs, v), lse


def _seed_of(philox_seed: torch.Tensor | None) -> int:
    if philox_seed is None or philox_seed.numel() == 0:
        return 0
    return int(philox_seed.reshape(-1)[0].to(torch.int64))


def _sdpfa_fwd(op, args, env, outs):
    a = operands(op, args)
    seed = 0  # the rng state it reports; sdpfa_bwd draws the same dropout mask from it
    out, lse = attention(a["query"], a["key"], a["value"], a["bias"], a["mask"],
                         float(a["dropout_p"] or 0.0), bool(a["is_causal"]), a["scale"], seed)
    device = out.device
    return [out.to(outs[0]), lse.to(outs[1]),
            torch.tensor([seed, 0], dtype=UINT64, device=device),
            torch.tensor(0, dtype=UINT64, device=device)]


def _sdpfa_bwd(op, args, env, outs):
    a = operands(op, args)
    q, k, v = (a[n].detach().to(_compute(a["query"])).requires_grad_(True)
               for n in ("query", "key", "value"))
    with torch.enable_grad():
        out, _ = attention(q, k, v, None, None, float(a["dropout_p"] or 0.0),
                           bool(a["is_causal"]), a["scale"], _seed_of(a["philox_seed"]))
        gq, gk, gv = torch.autograd.grad(out, (q, k, v), a["grad_output"].to(out.dtype))
    return [gq.to(outs[0]), gk.to(outs[1]), gv.to(outs[2])]


# ---- embedding, scatter, index_put, sorting -------------------------------------------------


def _embedding_fwd(op, args, env, outs):
    a = operands(op, args)
    weight = a["weight"]
    max_norm = a["max_norm"]
    if max_norm is not None:  # torch renormalises the rows it reads in place: not our input
        weight = weight.clone()
    norm_type = 2.0 if a["norm_type"] is None else float(a["norm_type"])
    padding_idx = None if a["padding_idx"] is None else int(a["padding_idx"])
    out = F.embedding(a["input"].to(torch.int64), weight, padding_idx, max_norm, norm_type)
    return [out.to(outs[0])]


def _checked_index(index: torch.Tensor, extent: int, op: str) -> torch.Tensor:
    index = index.to(torch.int64)
    if index.numel() and (bool((index < -extent).any()) or bool((index >= extent).any())):
        raise InputError(f"{op}: index out of range for an axis of extent {extent}")
    return index % max(extent, 1)


def _scatter(op, args, env, outs):
    x, index, src = args
    dim = op.attrs["dim"] % x.dim()
    index = _checked_index(index, x.shape[dim], "scatter")
    if isinstance(src, torch.Tensor):
        return [x.scatter(dim, index, src.to(x.dtype)).to(outs[0])]
    return [x.scatter(dim, index, src).to(outs[0])]


def _index_put_accumulate(op, args, env, outs):
    acc, index, value = args
    index = _checked_index(index, acc.shape[0], "index_put_accumulate")
    return [torch.index_put(acc, (index,), value.to(acc.dtype), accumulate=True).to(outs[0])]


def _topk(op, args, env, outs):
    x, k = args
    values, indices = torch.topk(x, int(k), dim=op.attrs["dim"], largest=op.attrs["largest"],
                                 sorted=op.attrs["sorted"])
    return [values.to(outs[0]), indices.to(outs[1])]


def _argsort(op, args, env, outs):
    return [torch.argsort(args[0], dim=op.attrs["dim"], descending=op.attrs["descending"],
                          stable=op.attrs["stable"]).to(outs[0])]


# ---- grouped matmul ----------------------------------------------------------------------------


def _group_bounds(offsets: torch.Tensor, extent: int) -> list[tuple[int, int]]:
    ends = [int(e) for e in offsets.to(torch.int64).tolist()]
    starts = [0, *ends[:-1]]
    if any(s > e for s, e in zip(starts, ends)) or (ends and not 0 <= ends[-1] <= extent):
        raise InputError(f"grouped_mm: offsets {ends} are not non-decreasing group ends within "
                         f"{extent}")
    return list(zip(starts, ends))


def _grouped_mm(op, args, env, outs):
    m1, m2, offsets = args
    if m1.dim() == 2 and m2.dim() == 3:  # groups of rows of mat1
        bounds = _group_bounds(offsets, m1.shape[0])
    elif m1.dim() == 3:  # groups of columns of mat2
        bounds = _group_bounds(offsets, m2.shape[1])
    else:  # groups along K
        bounds = _group_bounds(offsets, m1.shape[1])
    library = _torch_grouped_mm(m1, m2, offsets, outs[0])
    if library is not None:
        return [library]
    ct = _compute(m1)
    a, b = m1.to(ct), m2.to(ct)
    shape = grouped_mm_shape(tuple(m1.shape), tuple(m2.shape), offsets.shape[0])
    out = torch.zeros(shape, dtype=ct, device=m1.device)
    for g, (s, e) in enumerate(bounds):
        if m1.dim() == 2 and m2.dim() == 3:
            out[s:e] = a[s:e] @ b[g]
        elif m1.dim() == 3:
            out[:, s:e] = a[g] @ b[:, s:e]
        else:
            out[g] = a[:, s:e] @ b[s:e]
    return [out.to(outs[0])]


def _torch_grouped_mm(m1: torch.Tensor, m2: torch.Tensor, offsets: torch.Tensor,
                      out: torch.dtype) -> torch.Tensor | None:
    """torch._grouped_mm's result for bf16 operands, which is what nvFuser's grouped_mm
    evaluates to (ATen's kernel): float32 products rounded to bf16 once per group differ from
    its accumulation order by more than the bf16 comparison allows where sums cancel. None
    where torch lacks it or its kernels refuse these operands (then the group loop above)."""
    library = getattr(torch, "_grouped_mm", None)
    if library is None or not (m1.dtype == m2.dtype == out == torch.bfloat16):
        return None
    try:
        return library(m1, m2, offsets.to(torch.int32))
    except (RuntimeError, NotImplementedError):  # shapes, strides or a device it refuses
        return None


def _preprocess_grouped_matmul_input_sf(op, args, env, outs):
    # the values are the input's: only the allocation (per-group padding and swizzle) differs
    return [args[0].clone()]


def _no_reference(what: str):
    def run(op, args, env, outs):
        reason = what
        if "dtype" in op.attrs and op.attrs["dtype"] is not None and "fp4" in what:
            reason = f"block quantization to {op.attrs['dtype'].value} is not written yet"
        raise InputError(f"{op.name}: no torch reference ({reason}); it parses and plans, but "
                         f"runs only through nvFuser's kernels")

    return run


LIBRARY_REFERENCE = {
    "sdpfa_fwd": _sdpfa_fwd, "sdpfa_bwd": _sdpfa_bwd, "embedding_fwd": _embedding_fwd,
    "scatter": _scatter, "index_put_accumulate": _index_put_accumulate, "topk": _topk,
    "argsort": _argsort, "grouped_mm": _grouped_mm,
    "preprocess_grouped_matmul_input_sf": _preprocess_grouped_matmul_input_sf,
    "cutlass_nvfp4_grouped_mm": _no_reference("NVFP4 operands and swizzled block scales"),
    "nv_block_quantize": _no_reference("torch has no unpacked fp4 tensors"),
    "nv_grouped_block_quantize": _no_reference("torch has no unpacked fp4 tensors"),
}
