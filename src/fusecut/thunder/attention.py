"""cuDNN attention for Thunder through torch's own cuDNN SDPA kernels.

Attention is the largest kernel of a transformer step that fusecut does not generate. On the
H100 cuDNN's (flash) attention is faster than FlashAttention-2, which Thunder's ``sdpa`` executor
runs (GPT-2 small, bf16, forward and backward of one layer: 0.45 ms against 0.38 ms forward and
the backward 1.48 ms against 2.08 ms for the 12 layers of a step), and torch.compile runs it.

Thunder's own ``cudnn`` executor builds cuDNN graphs through the cuDNN frontend, and its bf16
gradients measured wrong (``executor.CUDNN_ATTENTION_WRONG``). This executor instead calls the
ATen operators that torch's SDPA dispatches to for cuDNN
(``aten._scaled_dot_product_cudnn_attention`` and its backward): the kernels and the gradient
formula torch.compile and eager use, behind a Thunder operator with a grad transform.

It claims ``scaled_dot_product_attention`` only where those kernels apply: CUDA tensors of bf16
or fp16, 4-d (batch, heads, sequence, head size) with the same heads and head size for query,
key and value, a head size that is a multiple of 8 up to 128, no mask, no dropout, and a causal
mask only on a square score matrix. Anything else stays with the next executor (SDPA).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from thunder.core import devices, dtypes
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy, pyval
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor
from thunder.torch import scaled_dot_product_attention as thunder_sdpa

cudnn_attention_ex = OperatorExecutor("fusecut_attention", version="0.1")
register_executor(cudnn_attention_ex)

HALF_TYPES = (dtypes.bfloat16, dtypes.float16)
MAX_HEAD_SIZE = 128


@functools.lru_cache(maxsize=1)
def cudnn_attention_available() -> bool:
    """torch has cuDNN's fused attention here: a CUDA GPU of compute capability 8.0 or newer,
    cuDNN 9 and SDPA's cuDNN backend enabled."""
    if not (torch.cuda.is_available() and torch.backends.cudnn.is_available()):
        return False
    if (torch.backends.cudnn.version() or 0) < 90000:
        return False
    if torch.cuda.get_device_capability() < (8, 0):
        return False
    return torch.backends.cuda.cudnn_sdp_enabled()


def claims(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: Any = 0.0,
           is_causal: Any = False, *, scale: Any = None) -> bool:
    """Whether this call of ``scaled_dot_product_attention`` runs on cuDNN here (see the module
    docstring for the conditions)."""
    tensors = (query, key, value)
    if attn_mask is not None or pyval(dropout_p) != 0.0:
        return False
    if not all(isinstance(t, TensorProxy) and t.ndim == 4 for t in tensors):
        return False
    if any(t.device.devicetype is not devices.DeviceType.CUDA or t.dtype not in HALF_TYPES
           or t.dtype != query.dtype for t in tensors):
        return False
    (b, h, s_q, d), (kb, kh, s_k, kd), (vb, vh, vs, vd) = (t.shape for t in tensors)
    if not (b == kb == vb and h == kh == vh and s_k == vs and d == kd == vd):
        return False
    if d % 8 or d > MAX_HEAD_SIZE:
        return False
    if pyval(is_causal) and s_q != s_k:  # which corner the causal mask starts from differs
        return False
    return cudnn_attention_available()


# ---- the operators ------------------------------------------------------------------------------


def _output_meta(query, key, value, is_causal, scale):
    return TensorProxy(like=query, shape=(*query.shape[:3], value.shape[-1]))


def _forward_meta(query, key, value, is_causal, scale):
    scalar = {"shape": (), "dtype": dtypes.int64, "device": query.device, "requires_grad": False}
    return (_output_meta(query, key, value, is_causal, scale),
            TensorProxy(shape=tuple(query.shape[:3]), dtype=dtypes.float32, device=query.device,
                        requires_grad=False),
            TensorProxy(**scalar), TensorProxy(**scalar))


def _forward(query, key, value, is_causal, scale):
    """Output, log-sum-exp of the scores (what the backward needs) and the dropout RNG state
    (unused without dropout, passed on as torch's autograd passes it)."""
    found = torch.ops.aten._scaled_dot_product_cudnn_attention(
        query, key, value, None, True, 0.0, bool(is_causal), False, scale=scale)
    out, logsumexp, seed, offset = found[0], found[1], found[6], found[7]
    return out, logsumexp, seed, offset


cudnn_attention_forward = cudnn_attention_ex.register_operator(
    "fusecut_cudnn_attention_forward", meta=_forward_meta, fn=_forward,
    tags=(OpTags.DONT_AUTO_RECOMPUTE_IN_BACKWARD,))


def _inference(query, key, value, is_causal, scale):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        query, key, value, None, False, 0.0, bool(is_causal), False, scale=scale)[0]


cudnn_attention = cudnn_attention_ex.register_operator(
    "fusecut_cudnn_attention", meta=_output_meta, fn=_inference)


def _backward_meta(grad, query, key, value, out, logsumexp, seed, offset, is_causal, scale):
    return (TensorProxy(like=query), TensorProxy(like=key), TensorProxy(like=value))


def _backward(grad, query, key, value, out, logsumexp, seed, offset, is_causal, scale):
    # cuDNN reads the output's gradient in the output's layout: a gradient laid out otherwise
    # (Thunder's backward may make it contiguous where the output is a transposed view) is
    # copied into that layout first
    if grad.stride() != out.stride():
        grad = torch.empty_strided(out.shape, out.stride(), dtype=grad.dtype,
                                   device=grad.device).copy_(grad)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad, query, key, value, out, logsumexp, seed, offset, None, None, None,
        query.shape[2], key.shape[2], 0.0, bool(is_causal), scale=scale)


cudnn_attention_backward = cudnn_attention_ex.register_operator(
    "fusecut_cudnn_attention_backward", meta=_backward_meta, fn=_backward)


# ---- scaled_dot_product_attention on them -------------------------------------------------------


def _execution(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    return cudnn_attention(query, key, value, pyval(is_causal), scale)


def _grad(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    causal = pyval(is_causal)
    out, logsumexp, seed, offset = cudnn_attention_forward(query, key, value, causal, scale)
    grads = cudnn_attention_backward(get_grad(out), query, key, value, out, logsumexp, seed,
                                     offset, causal, scale)
    put_grads((query, key, value), grads)
    return out


cudnn_attention_ex.register_implementation(thunder_sdpa, checker=claims,
                                           execution_transform=_execution, grad_transform=_grad)
