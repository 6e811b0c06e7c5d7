"""Whole language models, as users train them through Thunder: token embeddings, blocks, a tied
head and the loss, in one module whose forward returns the loss (training) or the logits
(inference).

- ``nanogpt``: Thunder's own nanoGPT ``GPT`` (token and position embeddings, LayerNorm blocks
  with GELU MLPs, tied head, cross-entropy with ``ignore_index=-1``);
- ``llama2``: Thunder's llama2 ``Transformer`` (RMSNorm, complex-free rotary embeddings,
  grouped-query attention, SwiGLU) with its cross-entropy;
- ``llama3``: a Llama-3-style LM written here (RMSNorm, rotate-half RoPE, grouped-query
  attention through SDPA, SwiGLU, tied head, cross-entropy with ``ignore_index=-100``).

``whole_model(name, size)`` gives (module, make_batch); ``make_batch(batch, seq, device)`` gives
(tokens, targets). Sizes: ``tiny`` (CI, CPU), ``gpt2_small`` / ``llama_2048`` (the benchmark's).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models import Llama3Block, Llama3Config, RMSNorm, rope_tables

IGNORE_INDEX = -100  # the Llama-3 model's padding label: positions that carry no loss


class Llama3LM(nn.Module):
    """Embedding, Llama-3 blocks, a final RMSNorm and a head tied to the embedding."""

    def __init__(self, cfg: Llama3Config, vocab: int, layers: int, max_seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.dim)
        self.blocks = nn.ModuleList(Llama3Block(cfg) for _ in range(layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, max_seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1),
                               ignore_index=IGNORE_INDEX)


class LossOf(nn.Module):
    """A model whose forward returns logits (llama2) or (logits, loss) (nanoGPT), as one module
    returning the loss given targets and the logits without: the loss is part of the step."""

    def __init__(self, model: nn.Module, ignore_index: int):
        super().__init__()
        self.model = model
        self.ignore_index = ignore_index

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model(tokens, targets)
        logits = out[0] if isinstance(out, tuple) else out
        if targets is None:
            return logits
        if isinstance(out, tuple):
            return out[1]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=self.ignore_index)


@dataclass(frozen=True)
class Size:
    layers: int
    width: int
    heads: int
    kv_heads: int
    vocab: int
    max_seq: int


SIZES = {
    # CI: every kind of region at a size the CPU steps through in seconds; a vocabulary and a
    # width that are no power of two, as real ones often are not
    "tiny": Size(layers=2, width=96, heads=3, kv_heads=1, vocab=200, max_seq=32),
    # the benchmark's: GPT-2 small (124M), and a Llama of width 2048
    "gpt2_small": Size(layers=12, width=768, heads=12, kv_heads=12, vocab=50304, max_seq=1024),
    "llama_2048": Size(layers=4, width=2048, heads=16, kv_heads=4, vocab=32000, max_seq=2048),
}
MODEL_NAMES = ("nanogpt", "llama2", "llama3")


def whole_model(name: str, size: str | Size, seed: int = 0
                ) -> tuple[nn.Module, Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """(fp32 CPU module, make_batch) of whole model ``name`` at ``size``; the weights are
    drawn from ``seed``, leaving the caller's random state as it was."""
    s = SIZES[size] if isinstance(size, str) else size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, ignore = _build(name, s)

    def make_batch(batch: int, seq: int, device: str = "cpu", seed: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, s.vocab, (batch, seq), generator=g)
        targets = torch.randint(0, s.vocab, (batch, seq), generator=g)
        targets[:, -2:] = ignore  # padding: positions the loss must skip
        return tokens.to(device), targets.to(device)

    return model, make_batch


def _build(name: str, s: Size) -> tuple[nn.Module, int]:
    if name == "nanogpt":
        nanogpt = importlib.import_module("thunder.tests.nanogpt_model")
        config = nanogpt.GPTConfig(n_layer=s.layers, n_head=s.heads, n_embd=s.width,
                                   block_size=s.max_seq, vocab_size=s.vocab, dropout=0.0,
                                   bias=True)
        return LossOf(nanogpt.GPT(config), ignore_index=-1), -1
    if name == "llama2":
        llama2 = importlib.import_module("thunder.tests.llama2_model")
        args = llama2.ModelArgs(dim=s.width, n_layers=s.layers, n_heads=s.heads,
                                n_kv_heads=s.kv_heads, vocab_size=s.vocab, multiple_of=32,
                                max_seq_len=s.max_seq, dropout=0.0)
        return LossOf(llama2.Transformer(args), ignore_index=-1), -1
    if name == "llama3":
        hidden = max(32, (s.width * 8 // 3 + 31) // 32 * 32)
        cfg = Llama3Config(dim=s.width, n_heads=s.heads, n_kv_heads=s.kv_heads, hidden=hidden)
        return Llama3LM(cfg, s.vocab, s.layers, s.max_seq), IGNORE_INDEX
    if name in HF_MODELS:
        return HFLossOf(_hf_model(name, s)), IGNORE_INDEX
    raise ValueError(f"unknown model {name!r}; choose one of "
                     f"{', '.join(MODEL_NAMES + tuple(HF_MODELS))}")


# Hugging Face transformers models (issue 42): Llama with grouped-query attention and GPT-2,
# built from their configs at a given size (random weights, nothing downloaded)
HF_MODELS = ("hf_llama", "hf_gpt2")


def _hf_model(name: str, s: Size) -> nn.Module:
    import transformers as hf

    if name == "hf_llama":
        return hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=s.vocab, hidden_size=s.width, num_hidden_layers=s.layers,
            num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
            intermediate_size=max(32, (s.width * 8 // 3 + 31) // 32 * 32),
            max_position_embeddings=s.max_seq, tie_word_embeddings=True))
    return hf.GPT2LMHeadModel(hf.GPT2Config(
        vocab_size=s.vocab, n_embd=s.width, n_layer=s.layers, n_head=s.heads,
        n_positions=s.max_seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0))


class HFLossOf(nn.Module):
    """A transformers causal LM as ``LossOf`` presents a model: the loss given targets (the
    model's own cross-entropy, ignoring ``IGNORE_INDEX``), the logits without."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return self.model(input_ids=tokens).logits
        return self.model(input_ids=tokens, labels=targets).loss
