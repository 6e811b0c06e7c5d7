"""The transformer blocks the Thunder benchmark and tests run: Thunder's own nanoGPT ``Block`` and
llama2 ``TransformerBlock``, and a Llama-3-style block written here (RMSNorm, rotary embeddings
applied with rotate-half, grouped-query attention through SDPA, SwiGLU).

``blocks(...)`` gives each as (name, module, extra forward arguments); the caller moves them to a
device and dtype with ``place``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(head_dim: int, seq: int, theta: float = 500000.0) -> tuple[torch.Tensor, ...]:
    """cos and sin of shape [seq, head_dim], Llama 3's base frequency."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


@dataclass
class Llama3Config:
    dim: int = 2048
    n_heads: int = 16
    n_kv_heads: int = 4
    hidden: int = 5632


class Llama3Block(nn.Module):
    """Pre-norm attention (GQA, RoPE) and SwiGLU MLP with residuals, as in Llama 3."""

    def __init__(self, cfg: Llama3Config):
        super().__init__()
        self.cfg = cfg
        self.head_dim = cfg.dim // cfg.n_heads
        kv = cfg.n_kv_heads * self.head_dim
        self.attn_norm = RMSNorm(cfg.dim)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv, bias=False)
        self.wv = nn.Linear(cfg.dim, kv, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim)
        self.w_gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w_down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.cfg.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.cfg.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.cfg.n_kv_heads, self.head_dim).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(x.dtype)
        k = (k * cos + rotate_half(k) * sin).to(x.dtype)
        rep = self.cfg.n_heads // self.cfg.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, self.cfg.dim))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


MODEL_NAMES = ("nanogpt_block", "llama2_block", "llama3_block", "nanogpt_block_dropout0.1")


def blocks(width: int, seq: int, *, dropout: bool = True,
           seed: int = 0) -> list[tuple[str, nn.Module, tuple]]:
    """(name, module, extra forward arguments) of each benchmarked block, fp32 on the CPU.

    Heads are 128 wide (at least one head, for the tests' small widths). The weights are drawn
    from ``seed`` (the caller's random state is left as it was): the same on every call,
    whatever ran before."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _blocks(width, seq, dropout)


def _blocks(width: int, seq: int, dropout: bool) -> list[tuple[str, nn.Module, tuple]]:
    nanogpt = importlib.import_module("thunder.tests.nanogpt_model")
    llama2 = importlib.import_module("thunder.tests.llama2_model")
    heads = max(1, width // 128)
    kv_heads = max(1, heads // 2)

    def gpt(p: float) -> nn.Module:
        return nanogpt.Block(nanogpt.GPTConfig(n_layer=1, n_head=heads, n_embd=width,
                                               block_size=seq, dropout=p, bias=True))

    args = llama2.ModelArgs(dim=width, n_layers=1, n_heads=heads, n_kv_heads=kv_heads,
                            max_seq_len=seq, dropout=0.0, multiple_of=16)
    cos2, sin2 = llama2.precompute_freqs_cis(width // heads, seq)
    cfg = Llama3Config(dim=width, n_heads=heads, n_kv_heads=kv_heads,
                       hidden=max(16, (width * 11 // 4) // 16 * 16))
    cos3, sin3 = rope_tables(width // heads, seq)
    out = [("nanogpt_block", gpt(0.0), ()),
           ("llama2_block", llama2.TransformerBlock(0, args), (cos2, sin2)),
           ("llama3_block", Llama3Block(cfg), (cos3, sin3))]
    if dropout:
        out.append(("nanogpt_block_dropout0.1", gpt(0.1), ()))
    return out


def place(module: nn.Module, extra: tuple, device: str, dtype: torch.dtype
          ) -> tuple[nn.Module, tuple]:
    """The block's parameters in ``dtype`` on ``device``; rotary tables stay fp32."""
    return module.to(device=device, dtype=dtype), tuple(e.to(device) for e in extra)
