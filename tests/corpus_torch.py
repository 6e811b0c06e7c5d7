"""The corpus cases written as plain torch code: an oracle independent of fusecut's interpreter.

Hand-written for every case whose math a person writes; the two generated stress cases run
through ``EagerDefinition``, a direct torch evaluation of the frontend calls they use.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

f32 = torch.float32
bf16 = torch.bfloat16


def adam_step(p, g, m, v):
    m1 = m * 0.9 + g * 0.1
    v1 = v * 0.999 + g * g * 0.001
    step = m1 / (torch.sqrt(v1) + 1e-08) * 0.0003
    return [p - step, m1, v1]


def bias_dropout_add_layernorm(x, b, res, w, bias, seed, offset):
    from fusecut.runtime.philox import random_values  # the generated kernels' random numbers

    h = x.float() + b.float()
    u = random_values("uniform", h.numel(), False, seed, offset, 0.0, 1.0, h.device)
    z = h * (u.reshape(h.shape) < 0.9) * 1.11111 + res.float()
    var, mean = torch.var_mean(z, dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-05)
    y = (z - mean[:, None]) * rstd[:, None] * w.float() + bias.float()
    return [z.to(bf16), y.to(bf16), mean, rstd]


def cross_entropy_fwd(logits, target):
    x = logits.float()
    lse = torch.logsumexp(x, dim=1)
    picked = x.gather(1, target[:, None]).squeeze(1)
    return [(lse - picked).sum() * 0.00048828125, lse]


def gelu_tanh_fwd(x, b):
    h = x.float() + b.float()
    inner = (h + h * h * h * 0.044715) * 0.7978845608028654
    return [(h * 0.5 * (torch.tanh(inner) + 1.0)).to(bf16)]


def group_norm_fwd(x, w, b):
    n, c, h, wd = x.shape
    g = x.float().reshape(n, 32, c // 32, h, wd)
    var, mean = torch.var_mean(g, dim=(2, 3, 4), correction=0, keepdim=True)
    rstd = torch.rsqrt(var + 1e-05)
    y = ((g - mean) * rstd).reshape(x.shape) * w.float()[:, None, None] + b.float()[:, None, None]
    return [y.to(bf16), mean.reshape(n, 32), rstd]


def layernorm_bwd(x, dy, mean, rstd, w):
    x, dy = x.float(), dy.float()
    xhat = (x - mean) * rstd
    g = dy * w.float()
    n = x.shape[1]
    s1 = g.sum(1, keepdim=True)
    s2 = (g * xhat).sum(1, keepdim=True)
    dx = rstd * (1.0 / 4096.0) * (g * 4096.0 - s1 - xhat * s2)
    assert n == x.shape[1]
    return [dx.to(bf16), (dy * xhat).sum(0).to(bf16), dy.sum(0).to(bf16)]


def layernorm_fwd(x, w, b):
    x = x.float()
    var, mean = torch.var_mean(x, dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-05)
    y = (x - mean[:, None]) * rstd[:, None] * w.float() + b.float()
    return [y.to(bf16), mean, rstd]


def mlp_gelu(x, w1, b1, w2):
    h = F.linear(x, w1).float() + b1.float()
    g = h * 0.5 * (torch.erf(h * 0.7071067811865476) + 1.0)
    return [F.linear(g.to(bf16), w2)]


def rmsnorm_fwd(x, w):
    x = x.float()
    r = torch.rsqrt((x * x).sum(1) * (1.0 / x.shape[1]) + 1e-06)
    return [(x * r[:, None] * w.float()).to(bf16), r]


def rmsnorm_bwd_2d_weight(x, dy, w, rstd):
    x, dy = x.float(), dy.float()
    g = dy * w.float()[:, None, :]
    xhat = x * rstd[:, :, None]
    s = (g * xhat).sum(2, keepdim=True) * 0.00048828125
    dx = (g - xhat * s) * rstd[:, :, None]
    return [dx.to(bf16), (dy * xhat).sum(1).to(bf16)]


def seed_2146_rmsnorm_bwd(t0, t1, t2, t3, t4, t5, t6):
    t7 = t6.float()
    t18 = t7 - t4[:, :, None]
    t24 = t18 * t5
    t25 = t0.float()
    t28 = t24 * t25 + t1.float()
    t38 = (1.0 + t2.float()).to(bf16).float().expand(t7.shape)
    t39 = t3.float()
    t49 = t39.sum(1).to(bf16)
    t50 = t38 * t39
    t61 = (t28 * t39).sum(1).to(bf16)
    t63 = t50.sum((0, 1)).to(bf16)
    t64 = t25 * t50
    t67 = (t24 * t50).sum((0, 1)).to(bf16)
    t68 = t5 * t64
    t70 = (t18 * t64).sum(2, keepdim=True)
    t77 = (-t68).sum(2, keepdim=True)
    t89 = (-0.5 * t70 * t5 ** 3.0).sum(2, keepdim=True)
    t129 = 0.000976562 * t77 + 2.0 * t89 * (t7 - t4[:, :, None]) * (1.0 / 1024.0)
    return [t49, t61, t63, t67, (t68 + t129).to(bf16)]


def seed_3334_reduction_broadcast_pointwise(t0, t1):
    return [t1 + t0.sum(1)[:, None]]


def seed_3366_neg_broadcast_mul(t0, t1):
    return [(-t0)[:, None] * t1]


def seed_4147_stream_set(t0):
    return [t0.clone()]


def seed_4147_stream_two_ops(t0):
    t1 = t0 + t0
    return [t1, t1.sum(1)]


def seed_4269_forward_full(t0):
    ones = torch.ones_like(t0)
    return [t0 + ones + ones]


def rope_bwd_gqa_thunder(dk, dq, sin, dv, cos):
    """Thunder's region of a Llama-3 block's backward: RoPE undone on q's and k's gradients (k's
    first summed over the 2 query heads sharing each of the 8 key/value heads), v's summed."""
    b, s, h, d = dk.shape
    half = d // 2

    def group_sum(g):  # [b, s, h, d] -> bf16 [b, 8, s, d]
        return g.permute(0, 2, 1, 3).reshape(b, 8, h // 8, s, d).float().sum(2).to(bf16)

    def rope_bwd(g):  # g: float [b, heads, s, d]
        x = (sin * g).to(bf16)
        rotated = F.pad((-x[..., :half].float()).to(bf16), (half, 0)).float() + \
            F.pad(x[..., half:], (0, half)).float()
        return (rotated + cos * g).to(bf16).permute(0, 2, 1, 3)

    dv_sum = group_sum(dv).permute(0, 2, 1, 3).reshape(b, s, 8 * d)
    return [dv_sum, rope_bwd(dq.permute(0, 2, 1, 3).float()), rope_bwd(group_sum(dk).float())]


def rmsnorm_bwd_thunder(g0, g1, w, x, rstd, g_res):
    """Thunder's RMSNorm backward region of a Llama-3 block: the input's gradient plus the
    residual's, and the weight's gradient."""
    g = g0.float() + g1.float()
    wg = w.float() * g
    xf = x.float()
    d = -0.5 * (xf * wg).sum(-1, keepdim=True) * rstd ** 3 / x.shape[-1]
    dx = rstd * wg + 2 * d * xf
    return [(g_res.float() + dx).to(bf16), (xf * rstd * g).sum((0, 1)).to(bf16)]


def rope_fwd_thunder(v, cos, q, sin, k):
    """Thunder's RoPE forward region of a Llama-3 block traced on the CPU: q's and k's RoPE, k
    and v repeated from 8 to 16 heads, q and k scaled for the attention's product (k
    transposed for it)."""
    scale = 0.29730177875068026
    b, s, kv_heads, d = k.shape

    def rope(x):  # bf16 [b, heads, s, d] -> float
        half = d // 2
        rotated = torch.cat([(-x[..., half:].float()).to(bf16), x[..., :half]], -1)
        return x.float() * cos + rotated.float() * sin

    def repeat(x):  # [b, 8, s, d] -> [b, 16, s, d], each head twice in a row
        return x.unsqueeze(2).expand(b, kv_heads, 2, s, d).reshape(b, 2 * kv_heads, s, d)

    vh = v.reshape(b, s, kv_heads, d).permute(0, 2, 1, 3)
    k16 = repeat(rope(k.permute(0, 2, 1, 3)).to(bf16))
    q_out = (rope(q.permute(0, 2, 1, 3)) * scale).to(bf16).permute(0, 2, 1, 3)
    k_out = (k16.transpose(2, 3).float() * scale).to(bf16).permute(0, 2, 1, 3)
    return [repeat(vh).permute(0, 2, 1, 3), q_out, k_out]


def rope_bwd_interleaved_thunder(dk, dq, dv, cos, sin):
    """Thunder's interleaved-RoPE/GQA backward region of the llama2 block: k's and v's
    gradients summed over the 2 query heads of each group (rounded to bf16), then q's and k's
    gradients rotated back pair by pair: (ge, go) -> (ge * cos + go * sin, go * cos - ge * sin)."""
    b, s, heads, d = dq.shape

    def group_sum(x):  # [b, s, 16, d] -> [b, s, 8, d], through bf16 as the region rounds it
        return x.float().reshape(b, s, heads // 2, 2, d).sum(3).to(bf16)

    def rope_bwd(g):
        even, odd = g[..., 0::2], g[..., 1::2]
        c, sn = cos[None, :, None, :], sin[None, :, None, :]
        pairs = torch.stack([even * c + odd * sn, odd * c - even * sn], -1)
        return pairs.reshape(g.shape).to(bf16).permute(0, 2, 1, 3)

    return [group_sum(dv).permute(0, 2, 1, 3), rope_bwd(dq.float()),
            rope_bwd(group_sum(dk).float())]


def silu_mul_fwd(a, b):
    a = a.float()
    return [(a * (1.0 / (1.0 + torch.exp(-a))) * b.float()).to(bf16)]


def softmax_bwd(y, dy):
    y, dy = y.float(), dy.float()
    return [(y * (dy - (y * dy).sum(1, keepdim=True))).to(bf16)]


def softmax_fwd(x):
    x = x.float()
    e = torch.exp(x - x.amax(1, keepdim=True))
    return [(e / e.sum(1, keepdim=True)).to(bf16)]


def transpose_add(x, y):
    return [(x.float() + y.float().T).to(bf16)]


CASES = {f.__name__: f for f in (
    adam_step, bias_dropout_add_layernorm, cross_entropy_fwd, gelu_tanh_fwd, group_norm_fwd,
    layernorm_bwd, layernorm_fwd, mlp_gelu, rmsnorm_bwd_2d_weight, rmsnorm_fwd,
    seed_2146_rmsnorm_bwd, seed_3334_reduction_broadcast_pointwise, seed_3366_neg_broadcast_mul,
    seed_4147_stream_set, seed_4147_stream_two_ops, seed_4269_forward_full, silu_mul_fwd,
    softmax_bwd, softmax_fwd, transpose_add, rope_bwd_gqa_thunder, rmsnorm_bwd_thunder,
    rope_fwd_thunder, rope_bwd_interleaved_thunder)}

# Cases whose definitions fix their sizes (a reshape's shape, slice and pad bounds): the numbers
# to rewrite for the same definition at a size a CPU test runs quickly.
FIXED_SIZES = {"rope_bwd_gqa_thunder": {"2048": "16", "1024": "256", "128": "32", "64": "16"},
               "rmsnorm_bwd_thunder": {"2048": "16"}, "rope_fwd_thunder": {"2048": "32"},
               "rope_bwd_interleaved_thunder": {"2048": "16"}}


def small_definition(text: str, name: str) -> str:
    """A corpus case's definition text at small sizes (as it is where its sizes are free)."""
    sizes = FIXED_SIZES.get(name, {})
    if not sizes:
        return text
    return re.sub(r"\b(" + "|".join(sizes) + r")\b", lambda m: sizes[m.group(1)], text)


def assert_cpu_path_equals_oracle(name: str, parsed, plan) -> None:
    """``plan`` of corpus case ``name`` (``parsed``), run on the CPU path on seeded inputs,
    equals the case's torch code (to a bf16 rounding)."""
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.tensors import make_input

    gen = torch.Generator().manual_seed(0)
    args = [make_input(m, generator=gen) for m in parsed.inputs]
    got = execute_plan(plan, args).outputs
    for a, e in zip(got, CASES[name](*args), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2)


class _Lazy:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def shape(self):
        return _Lazy(lambda t: list(t.shape), [self])


class _EagerOps:
    UNARY = {"exp": torch.exp, "neg": torch.neg, "abs": torch.abs, "tanh": torch.tanh}
    BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}

    def __getattr__(self, name):
        if name in self.UNARY:
            return lambda a: _Lazy(self.UNARY[name], [a])
        if name in self.BINARY:
            return lambda a, b: _Lazy(lambda x, y: self.BINARY[name](x, y), [a, b])
        if name == "cast":
            return lambda a, dtype: _Lazy(lambda x: x.to(dtype), [a])
        if name == "sum":
            return lambda a, dims, keepdim, dtype: _Lazy(lambda x: x.sum(dims, keepdim), [a])
        if name == "broadcast_in_dim":
            def bid(a, shape, broadcast_dims):
                def run(x, s):
                    view = [1] * len(s)
                    for i, d in enumerate(broadcast_dims):
                        view[d] = x.shape[i]
                    return x.reshape(view).expand(s)
                return _Lazy(run, [a, shape])
            return bid
        raise AttributeError(name)


class EagerDefinition:
    """Evaluates a generated stress definition directly with torch (dtype names -> torch)."""

    DTYPES = {"Float": f32, "BFloat16": bf16, "Double": torch.float64, "Null": None}

    def __init__(self):
        self.ops = _EagerOps()
        self.inputs: list[_Lazy] = []
        self.outputs: list[_Lazy] = []

    def define_tensor(self, **kw):
        lazy = _Lazy(None, [len(self.inputs)])
        self.inputs.append(lazy)
        return lazy

    def define_scalar(self, value, dtype=None):
        return value

    def add_output(self, t):
        self.outputs.append(t)

    def run(self, args):
        cache: dict[int, object] = {}

        def ev(x):
            if not isinstance(x, _Lazy):
                return x
            if id(x) not in cache:
                cache[id(x)] = args[x.args[0]] if x.fn is None else x.fn(*[ev(a) for a in x.args])
            return cache[id(x)]

        return [ev(o) for o in self.outputs]
