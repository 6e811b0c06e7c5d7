"""Architectures beyond the language models through Thunder with fusecut's executors and
transforms (``tests.thunder.model_zoo``): ViT, BERT, mixture of experts, ResNet block, GPT-NeoX
block, diffusion UNet block, T5 block, MLP-Mixer, an unrolled GRU, BART's self-attention.

In fp32 a training step's loss and every gradient match eager torch (and batch norm's running
statistics), and so does inference (eval, no_grad); no region with inputs falls back to torch. In
bf16 the step runs. In both, every
region Thunder hands fusecut plans, and every generated segment compiles with NVRTC for sm_90,
as the GPU would compile it.
"""

from __future__ import annotations

import copy

import pytest
import torch

import fusecut.thunder
from fusecut.thunder.executor import thunder
from fusecut.thunder.reports import region_reports
from tests.thunder.model_zoo import ZOO
from tests.thunder.test_whole_models import compile_failures, regions_of
from tests.thunder.thunder_steps import assert_as_close_to_fp32


def jitted_step(model: torch.nn.Module, args: tuple):
    jitted = thunder.jit(model, executors=fusecut.thunder.executors(),
                         transforms=fusecut.thunder.transforms())
    loss = jitted(*args)
    loss.backward()
    return jitted, loss


def assert_every_region_runs_on_fusecut_and_compiles(jitted) -> None:
    reports = region_reports(jitted)
    assert reports, "Thunder handed fusecut no region"
    # a region of factories alone (the GRU's zero state) has no input to plan for: torch makes it
    fell_back = [r.summary() for r in reports
                 if r.fallback is not None and "without input tensors" not in r.fallback]
    assert not fell_back, fell_back
    failures = compile_failures(regions_of(jitted))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_training_step_matches_eager_and_every_region_compiles(name):
    torch.manual_seed(0)
    model, args = ZOO[name]()
    reference = copy.deepcopy(model)
    want = reference(*args)
    want.backward()
    jitted, loss = jitted_step(model, args)
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5,
                                   msg=lambda m, n=n: f"{n}: {m}")
    for (n, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(b, c, msg=lambda m, n=n: f"buffer {n}: {m}")
    assert_every_region_runs_on_fusecut_and_compiles(jitted)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_inference_matches_eager_and_every_region_compiles(name):
    # in eval under no_grad, nn.TransformerEncoderLayer and nn.MultiheadAttention take PyTorch's
    # fused fast paths, which Thunder cannot trace: fusecut's executor has them traced as ops
    torch.manual_seed(0)
    model, args = ZOO[name]()
    model.eval()
    jitted = thunder.jit(model, executors=fusecut.thunder.executors(),
                         transforms=fusecut.thunder.transforms())
    with torch.no_grad():
        torch.testing.assert_close(jitted(*args), model(*args), rtol=1e-4, atol=1e-5)
    assert_every_region_runs_on_fusecut_and_compiles(jitted)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_bf16_training_step_runs_and_every_region_compiles(name):
    torch.manual_seed(0)
    model, args = ZOO[name]()
    model = model.to(torch.bfloat16)
    args = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)
    jitted, loss = jitted_step(model, args)
    assert torch.isfinite(loss.float())
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters())
    assert_every_region_runs_on_fusecut_and_compiles(jitted)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_bf16_step_on_the_gpu_is_as_close_to_fp32_as_eager_bf16(name):
    # fusecut's kernels (and its cuDNN attention) run: the same checks as the language models
    torch.manual_seed(0)
    model, args = ZOO[name]()
    model, args = model.cuda(), tuple(a.cuda() for a in args)

    def step(module, inputs, jit=False):
        if jit:
            loss = jitted_step(module, inputs)[1]
        else:
            loss = module(*inputs)
            loss.backward()
        return [loss.detach()] + [p.grad for p in module.parameters()]

    def low(a):
        return a.to(torch.bfloat16) if a.is_floating_point() else a

    exact = step(copy.deepcopy(model), args)
    eager = step(copy.deepcopy(model).to(torch.bfloat16), tuple(map(low, args)))
    ours = step(copy.deepcopy(model).to(torch.bfloat16), tuple(map(low, args)), jit=True)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    zero = ZERO_IN_EXACT_ARITHMETIC.get(name, ())
    kept = [i for i, n in enumerate(names) if n not in zero]
    assert_as_close_to_fp32(*([xs[i] for i in kept] for xs in (names, ours, eager, exact)),
                            torch.bfloat16)
    largest = max(g.abs().max().item() for g in exact[1:])
    for n, g, want in zip(names, ours, exact):
        if n in zero:  # rounding noise: as small beside the step's gradients as a bf16 rounding
            assert want.abs().max().item() < largest * 2**-20, f"{n} is not zero in fp32"
            assert g.float().abs().max().item() <= largest / 256, f"{n}: {g.abs().max()}"


# Gradients that are zero in exact arithmetic: BART's key bias adds q.b_k to every key of a query's
# row, which softmax does not see. Their bf16 values are rounding noise (5e-6 where fp32 gives
# 2e-10), which no tolerance relative to their own size can judge: they are held to a bf16
# rounding of the step's largest gradient instead.
ZERO_IN_EXACT_ARITHMETIC = {"bart": ("attn.k_proj.bias",)}
