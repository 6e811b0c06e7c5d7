"""``nn.MultiheadAttention`` through Thunder (``fusecut.thunder.multihead_attention``): Thunder
alone cannot differentiate ``F.multi_head_attention_forward`` when it returns no weights, so a
training step of ``nn.TransformerEncoderLayer`` raises with every executor. With fusecut's
transforms the call is decomposed and the step's loss and gradients match eager torch: self- and
cross-attention, a causal mask, an additive float mask. Calls the decomposition does not cover
(attention weights asked for) stay Thunder's opaque call.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusecut.thunder
from fusecut.thunder.executor import thunder
from fusecut.thunder.reports import region_reports
from tests.thunder.thunder_steps import assert_as_close_to_fp32

D, HEADS = 32, 4


def jit(module: nn.Module, transforms: bool = True):
    return thunder.jit(module, executors=fusecut.thunder.executors(),
                       transforms=fusecut.thunder.transforms() if transforms else None)


def assert_step_like_eager(module: nn.Module, *args: torch.Tensor, **kwargs) -> None:
    """One training step of ``module`` jitted with fusecut's executors and transforms: its output
    and every parameter's gradient as eager torch's (fp32)."""
    reference = copy.deepcopy(module)
    want = reference(*args, **kwargs)
    want.square().mean().backward()
    jitted = jit(module)
    got = jitted(*args, **kwargs)
    got.square().mean().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(module.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert not [r.summary() for r in region_reports(jitted) if r.fallback is not None]


def encoder(norm_first: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(D, HEADS, 64, dropout=0.0, batch_first=True,
                                      norm_first=norm_first)


def test_thunder_alone_cannot_differentiate_the_call_the_transform_replaces():
    x = torch.randn(2, 8, D)
    jitted = jit(encoder(False), transforms=False)
    with pytest.raises(NotImplementedError, match="multi_head_attention_forward"):
        jitted(x).sum().backward()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_an_encoder_layer_trains_like_eager(norm_first):
    assert_step_like_eager(encoder(norm_first), torch.randn(2, 8, D))


def test_a_causal_encoder_layer_trains_like_eager():
    mask = nn.Transformer.generate_square_subsequent_mask(8)
    assert_step_like_eager(encoder(True), torch.randn(2, 8, D), src_mask=mask, is_causal=True)


def test_an_additive_float_mask_is_added_to_the_scores():
    torch.manual_seed(1)
    mask = torch.randn(8, 8)  # any float mask: added, as torch adds it
    assert_step_like_eager(encoder(False), torch.randn(2, 8, D), src_mask=mask)


def test_a_decoder_layer_with_cross_attention_trains_like_eager():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, HEADS, 64, dropout=0.0, batch_first=True)
    memory, target = torch.randn(2, 6, D), torch.randn(2, 8, D)
    assert_step_like_eager(layer, target, memory,
                           tgt_mask=nn.Transformer.generate_square_subsequent_mask(8),
                           tgt_is_causal=True)


def test_a_call_asking_for_weights_stays_thunders():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True)
    x = torch.randn(2, 8, D)
    jitted = jit(mha)
    with torch.no_grad():
        out, weights = jitted(x, x, x, need_weights=True)
        want, want_weights = mha(x, x, x, need_weights=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)
    names = [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]
    assert "multi_head_attention_forward" in names, names


@pytest.mark.gpu
def test_a_bf16_encoder_layer_trains_on_the_gpu_as_close_to_fp32_as_eager_bf16():
    # attention then runs on fusecut's cuDNN executor (bf16, no mask), the rest in its regions
    fp32 = encoder(True).cuda()
    x = torch.randn(4, 64, D, device="cuda")
    exact = copy.deepcopy(fp32)
    exact(x).square().mean().backward()
    eager, ours = copy.deepcopy(fp32).bfloat16(), copy.deepcopy(fp32).bfloat16()
    eager(x.bfloat16()).float().square().mean().backward()
    jit(ours)(x.bfloat16()).float().square().mean().backward()
    assert_as_close_to_fp32([n for n, _ in ours.named_parameters()],
                            [p.grad for p in ours.parameters()],
                            [p.grad for p in eager.parameters()],
                            [p.grad for p in exact.parameters()], torch.bfloat16)
