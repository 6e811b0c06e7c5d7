"""Small models of architectures beyond the language models (``benchmarks.whole_models``), for
checking that Thunder with fusecut trains what users bring: a ViT and a BERT-style encoder on
``nn.TransformerEncoderLayer``, a top-2 mixture of experts, a ResNet block with batch norm, a
GPT-NeoX-style block (parallel residual, partial rotary, z-loss), a diffusion UNet block
(GroupNorm, SiLU, strided conv, nearest upsampling), a T5-style block (RMSNorm, bucketed relative
position bias, label smoothing), an MLP-Mixer with a padding mask, a GRU cell unrolled in
Python, Hugging Face's BART self-attention as Thunder's tests ship it (explicit batched
matmuls, an additive padding mask), and a Mistral-style decoder (grouped-query attention, RMSNorm,
rotary, a 2-d additive sliding-window mask).

``ZOO[name]()`` gives (module, inputs): the module's forward returns its loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ViT(nn.Module):
    """Patches by a strided conv, a class token, pre-norm encoder layers, a classifier."""

    def __init__(self, d: int = 64, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x, y):
        p = self.patch(x).flatten(2).transpose(1, 2)
        p = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], 1) + self.pos
        return F.cross_entropy(self.head(self.norm(self.enc(p))[:, 0]), y)


class BertLike(nn.Module):
    """Token, position and segment embeddings, post-norm encoder layers, a masked-LM loss."""

    def __init__(self, vocab: int = 100, d: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(32, d)
        self.segment = nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.mlm = nn.Linear(d, vocab)

    def forward(self, tokens, labels):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.emb(tokens) + self.pos(positions)[None] + self.segment(torch.zeros_like(tokens))
        h = self.enc(self.ln(h))
        return F.cross_entropy(self.mlm(h).flatten(0, 1), labels.flatten(), ignore_index=-100)


class MoE(nn.Module):
    """A softmax router's top-2 experts, weights renormalized, experts as batched einsums."""

    def __init__(self, d: int = 32, experts: int = 4, k: int = 2):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, 64) * 0.05)
        self.w2 = nn.Parameter(torch.randn(experts, 64, d) * 0.05)
        self.k = k

    def forward(self, x, y):
        probs = torch.softmax(self.router(x), -1)
        top, chosen = torch.topk(probs, self.k, -1)
        gates = torch.zeros_like(probs).scatter(-1, chosen, top / top.sum(-1, keepdim=True))
        h = F.silu(torch.einsum("nd,edf->nef", x, self.w1))
        out = (torch.einsum("nef,efd->ned", h, self.w2) * gates[..., None]).sum(1)
        return F.mse_loss(out, y)


class ResBlock(nn.Module):
    """Two 3x3 convs with batch norm (training: running statistics updated), a residual."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 5)

    def forward(self, x, y):
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)) + x)
        return F.cross_entropy(self.fc(h.mean((2, 3))), y)


class GPTNeoXish(nn.Module):
    """Attention and MLP in parallel off one residual, rotary on half of each head, an untied
    head and a z-loss on the log-partition."""

    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.heads = heads

    def forward(self, tokens, y):
        x = self.emb(tokens)
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        rot = (d // self.heads) // 2
        inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32, device=x.device) / rot))
        angle = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * inv[None]
        cos, sin = angle.cos().repeat(1, 2).to(x.dtype), angle.sin().repeat(1, 2).to(x.dtype)

        def rope(u):
            turned, kept = u[..., :rot], u[..., rot:]
            half1, half2 = turned[..., : rot // 2], turned[..., rot // 2:]
            return torch.cat([turned * cos + torch.cat([-half2, half1], -1) * sin, kept], -1)

        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        a = self.o(a.transpose(1, 2).reshape(b, t, d))
        x = x + a + self.down(F.gelu(self.up(self.ln2(x))))
        logits = self.head(x).float()
        z = torch.logsumexp(logits, -1)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten()) + 1e-4 * (z ** 2).mean()


class UNetBlock(nn.Module):
    """A diffusion UNet's residual block with a time embedding, then down and up again."""

    def __init__(self, c: int = 16, t: int = 32):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)
        self.temb = nn.Linear(t, c)
        self.n2, self.c2 = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)

    def forward(self, x, temb, y):
        h = self.c1(F.silu(self.n1(x))) + self.temb(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h))) + x
        up = F.interpolate(self.down(h), scale_factor=2.0, mode="nearest")
        return F.mse_loss(up + h, y)


class T5ish(nn.Module):
    """RMSNorm without mean, a relative position bias from log-spaced buckets, unscaled
    attention in fp32, a ReLU MLP, logits from the embedding, label smoothing."""

    def __init__(self, d: int = 32, heads: int = 4, buckets: int = 8, vocab: int = 50):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rel = nn.Embedding(buckets, heads)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w = nn.Parameter(torch.ones(d))
        self.wi, self.wo = nn.Linear(d, 64, bias=False), nn.Linear(64, d, bias=False)
        self.heads, self.buckets = heads, buckets

    def rms(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def bias(self, t: int, device):
        position = torch.arange(t, device=device)
        back = -(position[None, :] - position[:, None])
        back = torch.max(back, torch.zeros_like(back))
        exact = self.buckets // 2
        far = exact + (torch.log(back.float() / exact + 1e-6) / math.log(16 / exact)
                       * (self.buckets - exact)).to(torch.long)
        far = torch.min(far, torch.full_like(far, self.buckets - 1))
        return self.rel(torch.where(back < exact, back, far)).permute(2, 0, 1)[None]

    def forward(self, tokens, y):
        x = self.emb(tokens)
        b, t, d = x.shape
        h = self.rms(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) + self.bias(t, x.device)
        a = torch.softmax(scores.float(), -1).type_as(scores) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.wo(F.relu(self.wi(self.rms(x))))
        logits = x @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), label_smoothing=0.1)


class Mixer(nn.Module):
    """An MLP-Mixer layer (token mixing across a transpose, channel mixing), then a mean over the
    positions a padding mask keeps."""

    def __init__(self, t: int = 16, d: int = 32):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.tokens = nn.Sequential(nn.Linear(t, 32), nn.GELU(), nn.Linear(32, t))
        self.ln2 = nn.LayerNorm(d)
        self.channels = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
        self.head = nn.Linear(d, 3)

    def forward(self, x, keep, y):
        x = x + self.tokens(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.channels(self.ln2(x))
        x = x.masked_fill(~keep[..., None], 0.0)
        pooled = x.sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        return F.cross_entropy(self.head(pooled), y)


class GRUish(nn.Module):
    """A GRU cell unrolled over 6 steps in Python: Thunder traces the loop."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.x2h, self.h2h = nn.Linear(d, 3 * d), nn.Linear(d, 3 * d)

    def forward(self, x, y):
        h = torch.zeros(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
        for step in range(x.shape[1]):
            rx, zx, nx = self.x2h(x[:, step]).chunk(3, -1)
            rh, zh, nh = self.h2h(h).chunk(3, -1)
            r, z = torch.sigmoid(rx + rh), torch.sigmoid(zx + zh)
            h = (1 - z) * torch.tanh(nx + r * nh) + z * h
        return F.smooth_l1_loss(h, y)


class BartSelfAttention(nn.Module):
    """Hugging Face's ``BartAttention`` (``thunder.tests.hf_bart_self_attn``: q/k/v projections,
    the query scaled, ``bmm`` scores plus an additive mask, softmax, ``bmm``), regressed onto a
    target."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        from thunder.tests.hf_bart_self_attn import BartAttention

        self.attn = BartAttention(d, heads, dropout=0.0, bias=True)

    def forward(self, x, mask, target):
        return F.mse_loss(self.attn(x, mask), target)


class RMSNorm(nn.Module):
    """Mistral's: the mean square in float32, the weight applied in the input's dtype."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.type_as(x)


class MistralLayer(nn.Module):
    """Pre-norm attention with grouped-query heads (the key/value heads repeated, as Hugging
    Face's ``repeat_kv``), rotary on half-rotated heads, ``scaled_dot_product_attention`` with
    the 2-d mask as it is, then a SwiGLU MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.size = heads, kv_heads, d // heads
        self.ln1, self.ln2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.size, bias=False)
        self.v = nn.Linear(d, kv_heads * self.size, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        h = self.ln1(x)
        q = self.q(h).view(b, t, self.heads, self.size).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.size).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.size).transpose(1, 2)

        def rotate(u):
            half = u.shape[-1] // 2
            return torch.cat([-u[..., half:], u[..., :half]], -1)

        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        groups = self.heads // self.kv_heads
        k, v = (u[:, :, None].expand(b, self.kv_heads, groups, t, self.size)
                .reshape(b, self.heads, t, self.size) for u in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Mistralish(nn.Module):
    """A tiny Mistral-style decoder: 2 layers, width 64, 4 query and 2 key/value heads, each
    position attending to itself and the 3 before it through a 2-d additive mask (which
    Thunder's sdpa executor claimed and then refused on the GPU: issue 41), an LM loss."""

    def __init__(self, vocab: int = 128, d: int = 64, layers: int = 2, heads: int = 4,
                 kv_heads: int = 2, window: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(MistralLayer(d, heads, kv_heads, 2 * d)
                                    for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.window, self.size = window, d // heads

    def forward(self, tokens, y):
        x = self.emb(tokens)
        t = tokens.shape[1]
        position = torch.arange(t, device=x.device)
        back = position[:, None] - position[None, :]
        keep = (back >= 0) & (back < self.window)
        mask = torch.zeros(t, t, dtype=x.dtype, device=x.device).masked_fill(~keep, float("-inf"))
        steps = torch.arange(0, self.size, 2, dtype=torch.float32, device=x.device) / self.size
        angle = position.float()[:, None] / (10000 ** steps)[None]
        angle = torch.cat([angle, angle], -1)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _padding_mask(batch: int, length: int, padded: int) -> torch.Tensor:
    """BART's additive mask, (batch, 1, query, key): the last ``padded`` keys masked out."""
    mask = torch.zeros(batch, 1, length, length)
    mask[..., length - padded:] = -1e9  # finite in bf16 too (float32's min is not)
    return mask


def _tokens(vocab: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _bert():
    tokens, labels = _tokens(100, (2, 16), 1), _tokens(100, (2, 16), 2)
    labels[:, ::3] = -100  # positions without a masked-token label
    return BertLike(), (tokens, labels)


ZOO = {
    "vit": lambda: (ViT(), (torch.randn(2, 3, 16, 16), _tokens(10, (2,), 0))),
    "bert": _bert,
    "moe": lambda: (MoE(), (torch.randn(24, 32), torch.randn(24, 32))),
    "resnet": lambda: (ResBlock(), (torch.randn(2, 16, 8, 8), _tokens(5, (2,), 3))),
    "neox": lambda: (GPTNeoXish(), (_tokens(128, (2, 16), 4), _tokens(128, (2, 16), 5))),
    "unet": lambda: (UNetBlock(), (torch.randn(2, 16, 8, 8), torch.randn(2, 32),
                                   torch.randn(2, 16, 8, 8))),
    "t5": lambda: (T5ish(), (_tokens(50, (2, 12), 6), _tokens(50, (2, 12), 7))),
    "mixer": lambda: (Mixer(), (torch.randn(2, 16, 32), torch.rand(2, 16) > 0.3,
                                _tokens(3, (2,), 8))),
    "gru": lambda: (GRUish(), (torch.randn(3, 6, 16), torch.randn(3, 16))),
    "bart": lambda: (BartSelfAttention(), (torch.randn(2, 12, 64), _padding_mask(2, 12, 3),
                                           torch.randn(2, 12, 64))),
    "mistral": lambda: (Mistralish(), (_tokens(128, (2, 12), 9), _tokens(128, (2, 12), 10))),
}
