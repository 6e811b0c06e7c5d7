"""Tiny random Hugging Face transformers models, one per family, with a batch for each: made
from configs alone (nothing is downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

VOCAB, BATCH, SEQ = 128, 2, 16


def _causal(config_name: str, model_name: str, **extra: Any) -> Callable[[], torch.nn.Module]:
    def make():
        import transformers as hf

        config = getattr(hf, config_name)(vocab_size=VOCAB, hidden_size=64,
                                          intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64, **extra)
        return getattr(hf, model_name)(config)
    return make


def _gpt2():
    import transformers as hf

    return hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                            n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def _bert():
    import transformers as hf

    return hf.BertForMaskedLM(hf.BertConfig(vocab_size=VOCAB, hidden_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=128, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0))


def _t5():
    import transformers as hf

    return hf.T5ForConditionalGeneration(hf.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def _vit():
    import transformers as hf

    return hf.ViTForImageClassification(hf.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


# name -> (the model, its batch): causal LMs with grouped-query attention and tied embeddings
# (Llama), with a sliding window (Mistral); GPT-2; BERT's masked LM; T5; ViT
MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": _causal("LlamaConfig", "LlamaForCausalLM", tie_word_embeddings=True),
    "mistral": _causal("MistralConfig", "MistralForCausalLM", sliding_window=8),
    "gpt2": _gpt2, "bert": _bert, "t5": _t5, "vit": _vit,
}


def batch(name: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    if name == "vit":
        return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=generator),
                "labels": torch.randint(0, 10, (BATCH,), generator=generator)}
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=generator)
    if name == "t5":
        return {"input_ids": ids,
                "labels": torch.randint(2, VOCAB, (BATCH, SEQ // 2), generator=generator)}
    return {"input_ids": ids, "labels": ids}
