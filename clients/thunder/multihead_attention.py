"""``nn.MultiheadAttention`` as ops Thunder can differentiate: a training step of a model built
on ``nn.TransformerEncoderLayer`` (BERT-style encoders, torchvision's ViT) runs.

Thunder registers ``F.multi_head_attention_forward`` as an opaque torch call and derives its
backward with ``torch.autograd.functional.vjp``. That fails whenever the call returns no attention
weights (``need_weights=False``, what ``nn.TransformerEncoderLayer`` asks for): the second output
is ``None``, and the first backward raises ``NotImplementedError`` with every executor, Thunder's
torch executor included.

The idea: before Thunder differentiates the trace, each such call is replaced by what it
computes, in Thunder's own ops: the packed input projection, the heads, scaled dot-product
attention (whose gradients Thunder and fusecut's attention executor know) and the output
projection. Calls with options outside that (attention weights asked for, a key padding mask,
``bias_k``/``bias_v``, zero attention, separate projection weights, static keys) are left as they
are.
"""

from __future__ import annotations

import thunder.torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.transform_common import Transform

from fusecut.thunder.attention import sdpa_in_4d

_MHA_ID = "torch.nn.functional.multi_head_attention_forward"
_POSITIONAL = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
               "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p",
               "out_proj_weight", "out_proj_bias")
_DEFAULTS = {"training": True, "key_padding_mask": None, "need_weights": True, "attn_mask": None,
             "use_separate_proj_weight": False, "q_proj_weight": None, "k_proj_weight": None,
             "v_proj_weight": None, "static_k": None, "static_v": None,
             "average_attn_weights": True, "is_causal": False}


def _arguments(bsym) -> dict | None:
    """The call's arguments by name, or None where it is not one this module decomposes."""
    if len(bsym.args) > len(_POSITIONAL):
        return None
    a = {**_DEFAULTS, **dict(zip(_POSITIONAL, bsym.args)), **bsym.kwargs}
    unsupported = (a["need_weights"] or a["key_padding_mask"] is not None
                   or a["bias_k"] is not None or a["bias_v"] is not None or a["add_zero_attn"]
                   or a["use_separate_proj_weight"] or a["static_k"] is not None
                   or a["static_v"] is not None)
    tensors = (a["query"], a["key"], a["value"], a["in_proj_weight"], a["out_proj_weight"])
    if unsupported or not all(isinstance(t, TensorProxy) for t in tensors):
        return None
    if a["query"].ndim != 3 or a["key"].ndim != 3:
        return None  # unbatched calls: rare, left to Thunder
    mask = a["attn_mask"]
    if mask is not None and not a["is_causal"]:
        # torch adds a float mask; a boolean one marks what may NOT be attended (the opposite of
        # scaled_dot_product_attention's): only a float [L, S] mask is passed through as it is
        if not (isinstance(mask, TensorProxy) and mask.ndim == 2
                and dtypes.is_float_dtype(mask.dtype)):
            return None
    if a["is_causal"] and mask is None:
        return None  # torch refuses this ("Need attn_mask if specifying the is_causal hint")
    return a


def _decomposed(a: dict) -> TensorProxy:
    """What ``F.multi_head_attention_forward`` returns as its first output, for the supported
    arguments (``_arguments``): query [L, N, E], key and value [S, N, E]."""
    query, key, value = a["query"], a["key"], a["value"]
    length, batch, embed = query.shape
    heads = a["num_heads"]
    head = embed // heads
    weight, bias = a["in_proj_weight"], a["in_proj_bias"]
    if key is query and value is query:  # self-attention: one projection, as torch does
        q, k, v = ltorch.chunk(ltorch.linear(query, weight, bias), 3, -1)
    else:
        ws = ltorch.chunk(weight, 3, 0)
        bs = ltorch.chunk(bias, 3, 0) if bias is not None else (None, None, None)
        q, k, v = (ltorch.linear(x, w, b) for x, w, b in zip((query, key, value), ws, bs))

    def by_head(x: TensorProxy) -> TensorProxy:  # [T, N, E] -> [N, heads, T, head]
        return ltorch.permute(ltorch.reshape(x, (x.shape[0], batch, heads, head)), (1, 2, 0, 3))

    # is_causal with a mask: torch drops the mask and asks attention for the causal one
    mask = None if a["is_causal"] else a["attn_mask"]
    dropout = a["dropout_p"] if a["training"] else 0.0
    # in the 4-d form Thunder's sdpa kernels take (a 2-d mask broadcast to every head), so that
    # a masked call stays on the fused kernels
    out = sdpa_in_4d(by_head(q), by_head(k), by_head(v), mask, dropout, bool(a["is_causal"]))
    out = ltorch.reshape(ltorch.permute(out, (2, 0, 1, 3)), (length, batch, embed))
    return ltorch.linear(out, a["out_proj_weight"], a["out_proj_bias"])


class MultiheadAttentionTransform(Transform):
    """Replaces ``F.multi_head_attention_forward`` calls Thunder cannot differentiate by their
    computation in Thunder's ops (see the module's docstring)."""

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace: TraceCtx,
                                      epilogue_trace, **kwargs):
        if not any(b.sym.id == _MHA_ID for b in computation_trace.bound_symbols):
            return prologue_trace, computation_trace, epilogue_trace
        new = from_trace(computation_trace)
        swap: dict = {}  # each decomposed call's output -> the decomposition's
        for bsym in computation_trace.bound_symbols:
            bsym = bsym.from_bsym_swap_proxies(swap) if swap else bsym
            a = _arguments(bsym) if bsym.sym.id == _MHA_ID else None
            outputs = bsym.output if isinstance(bsym.output, (tuple, list)) else ()
            if a is None or len(outputs) != 2 or not isinstance(outputs[0], TensorProxy):
                new.bound_symbols.append(bsym)
                continue
            new.push_scope([])
            with tracectx(new):
                out = _decomposed(a)
            new.bound_symbols += new.pop_scope()
            swap[variableify(outputs[0])] = out
        if not swap:
            return prologue_trace, computation_trace, epilogue_trace
        assert new.bound_symbols[-1].sym.id == prims.python_return.id
        new.set_provenance(TraceProvenance("fusecut: multi-head attention decomposed"))
        return prologue_trace, new, epilogue_trace
