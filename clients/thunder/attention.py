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

Thunder's ``sdpa`` executor claims calls its kernels then refuse: its checker asks torch which
kernel would run, and the kernels' metas (run later, for the forward and the gradient) demand
4-d query, key, value and mask, and a mask with the query's batch size. A Mistral-style 2-d
sliding-window mask (``attn_mask=mask2d``, which torch broadcasts) failed the step with
``grad_forward_sdpa: Expected attn_mask tensor to have 4 dimension`` (issue 41). Two things here:

- ``sdpa_in_4d`` is what fusecut's executor has Thunder trace for
  ``torch.nn.functional.scaled_dot_product_attention`` (an executor lookaside): 3-d calls get a
  unit head axis, the mask is broadcast (a view) to (batch, heads, query, key), and
  ``enable_gqa`` repeats the key and value heads, as torch does. The call stays on Thunder's
  fused kernels, with the values torch's broadcasting gives.
- ``guard_thunder_sdpa`` makes the ``sdpa`` executor's checker also run the metas its kernels
  will run, so that a call they would refuse (one built in a trace, not traced from
  ``torch.nn.functional``) is not claimed: Thunder decomposes it into ops fusecut fuses, as
  Thunder alone runs it.
"""

from __future__ import annotations

import functools
from typing import Any

import thunder.torch as ltorch
import torch
from thunder.core import devices, dtypes
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy, pyval
from thunder.core.trace import TraceCtx, tracectx
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


# ---- calls Thunder's sdpa executor takes --------------------------------------------------------


def sdpa_in_4d(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: Any = 0.0,
               is_causal: Any = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` in the form Thunder's ``sdpa``
    executor accepts (traced in its place; see the module docstring): query, key and value 4-d
    with the same heads, a mask broadcast to (batch, heads, query, key). The same values as
    torch's broadcasting; a call this cannot put in that form goes to Thunder as it is."""
    tensors = (query, key, value)
    rank = query.ndim if isinstance(query, TensorProxy) else 0
    if (rank not in (3, 4) or not all(isinstance(t, TensorProxy) and t.ndim == rank
                                      for t in tensors)
            or (attn_mask is not None and not (isinstance(attn_mask, TensorProxy)
                                               and attn_mask.ndim <= rank))):
        if enable_gqa:  # Thunder 0.2.6 has no enable_gqa: refused there, as it was
            return thunder_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                enable_gqa=enable_gqa)
        return thunder_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
    if attn_mask is not None and attn_mask.ndim < rank:
        # torch aligns a mask's axes with the query's from the right
        ones = (1,) * (rank - attn_mask.ndim)
        attn_mask = ltorch.reshape(attn_mask, ones + tuple(attn_mask.shape))
    if rank == 3:  # (batch, sequence, size): one head
        query, key, value = (ltorch.unsqueeze(t, 1) for t in tensors)
        if attn_mask is not None:
            attn_mask = ltorch.unsqueeze(attn_mask, 1)
    if enable_gqa and key.shape[1] != query.shape[1]:
        # each key/value head serves query.heads / key.heads query heads, in order (torch's
        # repeat_interleave); an expand and a reshape, which fusecut runs as views where it can
        groups = query.shape[1] // key.shape[1]

        def repeat(t):
            b, h, s, d = t.shape
            return ltorch.reshape(ltorch.expand(ltorch.unsqueeze(t, 2), b, h, groups, s, d),
                                  (b, h * groups, s, d))

        key, value = repeat(key), repeat(value)
    if attn_mask is not None:
        full = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        if tuple(attn_mask.shape) != full:
            attn_mask = ltorch.expand(attn_mask, *full)
    out = thunder_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
    return ltorch.squeeze(out, 1) if rank == 3 else out


def _kernel_metas_accept(query: Any, key: Any, value: Any, attn_mask: Any = None,
                         dropout_p: Any = 0.0, is_causal: Any = False, *, scale: Any = None
                         ) -> bool:
    """Thunder's sdpa executor's kernel for this call (the one its checker picked) takes its
    arguments: its meta, which runs after the claim (for the forward and in the gradient
    rule), raises nothing."""
    from thunder.executors import sdpaex

    backend = sdpaex._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale)
    try:
        with tracectx(TraceCtx()):  # the metas make proxies: names from a throwaway trace
            if backend == sdpaex.SpdaBackend.FLASH_ATTENTION:
                sdpaex._grad_forward_scaled_dot_product_flash_attention_meta(
                    query, key, value, dropout_p, is_causal, scale=scale)
            elif backend == sdpaex.SpdaBackend.MEMORY_EFFICIENT:
                sdpaex._grad_forward_scaled_dot_product_efficient_attention_meta(
                    query, key, value, attn_mask, dropout_p, is_causal, scale)
    except Exception:
        return False
    return True


def guard_thunder_sdpa(executor: Any) -> None:
    """Thunder's ``sdpa`` executor (``executor``) claims only calls its kernels' metas accept
    (see the module docstring); anything else decomposes, as with Thunder alone. Once per
    executor; where its implementation is not the one this knows, nothing changes."""
    impl = executor.implmap.get(thunder_sdpa.id) if hasattr(executor, "implmap") else None
    checker = getattr(impl, "checker", None)
    if checker is None or getattr(checker, "_fusecut_guarded", False):
        return
    try:
        from thunder.executors import sdpaex

        known = (sdpaex._fused_sdp_choice, sdpaex.SpdaBackend,
                 sdpaex._grad_forward_scaled_dot_product_flash_attention_meta,
                 sdpaex._grad_forward_scaled_dot_product_efficient_attention_meta)
    except (ImportError, AttributeError):
        return
    del known

    def guarded(*args: Any, **kwargs: Any) -> bool:
        return bool(checker(*args, **kwargs)) and _kernel_metas_accept(*args, **kwargs)

    guarded._fusecut_guarded = True  # type: ignore[attr-defined]
    impl.checker = guarded
