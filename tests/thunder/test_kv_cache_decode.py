"""Generation with a KV cache through Thunder with fusecut: a prefill, then decode steps of one
token, each writing its keys and values into cache buffers in place (``index_copy_``, as litgpt's
``KVCache`` does) and attending over the cache through a mask row picked by position.

Each step's logits, and the caches after it, equal eager torch's; no region falls back; every
region compiles with NVRTC. (Probed beside this on litgpt's own llama2, GPT-NeoX and Falcon
configs, which need the ``litgpt`` package.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusecut.thunder
from fusecut.thunder.executor import thunder
from tests.thunder.test_model_zoo import assert_every_region_runs_on_fusecut_and_compiles

VOCAB, WIDTH, HEADS, MAX_LEN, LAYERS = 64, 32, 4, 16, 2


class CachedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        shape = (1, HEADS, MAX_LEN, WIDTH // HEADS)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, input_pos, mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        self.k_cache.index_copy_(2, input_pos, k.to(self.k_cache.dtype))
        self.v_cache.index_copy_(2, input_pos, v.to(self.v_cache.dtype))
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, WIDTH))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.norms = nn.ModuleList(nn.RMSNorm(WIDTH) for _ in range(2 * LAYERS))
        self.attns = nn.ModuleList(CachedAttention() for _ in range(LAYERS))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                nn.Linear(2 * WIDTH, WIDTH))
                                  for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        causal = torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, tokens, input_pos):
        mask = self.causal.index_select(0, input_pos)[None, None]  # the rows of these positions
        h = self.emb(tokens)
        for i, (attn, mlp) in enumerate(zip(self.attns, self.mlps)):
            h = h + attn(self.norms[2 * i](h), input_pos, mask)
            h = h + mlp(self.norms[2 * i + 1](h))
        return self.head(h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_and_decode_steps_give_eagers_logits_and_caches(dtype):
    torch.manual_seed(0)
    eager = Decoder().to(dtype).eval()
    model = Decoder().to(dtype).eval()
    model.load_state_dict(eager.state_dict())
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    tokens, pos = torch.randint(0, VOCAB, (1, 6)), torch.arange(6)
    with torch.no_grad():
        for step in range(6):
            want, got = eager(tokens, pos), ours(tokens, pos)
            torch.testing.assert_close(got, want, **tol, msg=lambda m, s=step: f"step {s}: {m}")
            for name, cache in model.named_buffers():
                torch.testing.assert_close(cache, eager.get_buffer(name), **tol,
                                           msg=lambda m, n=name, s=step: f"{n} after {s}: {m}")
            tokens = want[:, -1:].argmax(-1)  # greedy: eager's token, so both decode the same
            pos = torch.tensor([6 + step])
    assert model.attns[0].k_cache[0, :, 10].abs().sum() > 0  # the decode steps wrote the cache
    assert_every_region_runs_on_fusecut_and_compiles(ours)
