"""Blocks that trained with silently wrong gradients on the GPU (issue 41): each reaches a bias
gradient, a column sum of the output gradient over every row, through a permute or a reshape.

Both end as classifiers do: the block's output is pooled (a mean over the spatial axes, over the
latents), then a linear head and cross-entropy. The gradient reaching the block is then the
pooled gradient broadcast along the pooled axes; fusecut hands it on between regions as a view
with stride 0 there. The bias gradient sums it over every row (batch and pooled axes): a
reduction of a tensor broadcast along some of its reduced axes, whose kernel visited one element
per broadcast row and counted it once (fixed: ``codegen.kernel.Reducer.copies``).

``BLOCKS[name]()`` gives (module, inputs): the module's forward returns its loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNeXtBlock(nn.Module):
    """A depthwise 7x7 conv, a permute to channels-last, LayerNorm, Linear(4d) -> GELU ->
    Linear(d), a layer-scale, the permute back and the residual."""

    def __init__(self, d: int = 32, classes: int = 10):
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 0.5))
        self.head = nn.Linear(d, classes)

    def forward(self, x, y):
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.gamma * self.down(F.gelu(self.up(self.norm(h))))
        out = x + h.permute(0, 3, 1, 2)
        return F.cross_entropy(self.head(out.mean((2, 3))), y)


class PerceiverBlock(nn.Module):
    """Learned latents cross-attend to the inputs, then an MLP Linear -> GELU -> Linear with a
    residual; the loss reads the latents."""

    def __init__(self, d: int = 32, latents: int = 8, heads: int = 4, classes: int = 10):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(latents, d) * 0.5)
        self.ln_q, self.ln_kv, self.ln_mlp = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, classes)
        self.heads = heads

    def forward(self, x, y):
        b, n, d = x.shape
        lat = self.latents.expand(b, -1, -1)
        q = self.q(self.ln_q(lat)).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        k, v = self.kv(self.ln_kv(x)).view(b, n, 2, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2))
        h = lat + self.o(a.transpose(1, 2).reshape(b, -1, d))
        h = h + self.down(F.gelu(self.up(self.ln_mlp(h))))
        return F.cross_entropy(self.head(h.mean(1)), y)


def convnext(d: int = 32, batch: int = 2, side: int = 14):
    return ConvNeXtBlock(d), (torch.randn(batch, d, side, side), torch.randint(0, 10, (batch,)))


def perceiver(d: int = 32, latents: int = 8, n: int = 50, batch: int = 3):
    return (PerceiverBlock(d, latents, heads=max(1, d // 16)),
            (torch.randn(batch, n, d), torch.randint(0, 10, (batch,))))


BLOCKS = {
    "convnext": convnext,
    "convnext_wide": lambda: convnext(96, 4, 28),
    "perceiver": perceiver,
    "perceiver_wide": lambda: perceiver(256, 64, 512, 4),
}
