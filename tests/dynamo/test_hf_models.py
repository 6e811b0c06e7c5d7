"""Hugging Face transformers models train and infer through ``torch.compile(model,
backend="fusecut")`` on the CPU exactly as in eager: the loss and every gradient (a training
step), the logits (inference under no_grad); no region ran on ATen, and every generated segment
of every region compiles with NVRTC (which needs no GPU). On the CPU the regions run fusecut's
torch reference (issue 42)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.dynamo.hf_models import MODELS, batch
from tests.dynamo.regions_made import last_serial, regions_since
from tests.helpers import compile_failures

pytest.importorskip("transformers", minversion="5.0")


def assert_close_gradients(model: torch.nn.Module, reference: torch.nn.Module,
                           tolerance: float = 2e-5, where: str = "") -> None:
    """Every parameter's gradient as eager's, relative to its largest element (with a floor:
    a key projection's bias has a gradient of zero in exact arithmetic, rounding noise in
    either)."""
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is None:
            continue
        scale = max(q.grad.abs().max().item(), 1e-4)
        error = (p.grad - q.grad).abs().max().item() / scale
        assert error <= tolerance, \
            f"{where}{name}: gradient off by {error:.2e} of its largest element"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_training_step_and_inference_match_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]().float().train()
    reference = copy.deepcopy(model)
    inputs = batch(name, torch.Generator().manual_seed(1))
    before = last_serial()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fusecut")
    loss = compiled(**inputs).loss
    loss.backward()
    want = reference(**inputs).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    assert_close_gradients(model, reference)
    model.eval()
    reference.eval()
    with torch.no_grad():
        logits = compiled(**inputs).logits
        torch.testing.assert_close(logits, reference(**inputs).logits, rtol=1e-5, atol=1e-5)
    regions = regions_since(before)
    directions = {r.direction for r in regions}
    assert {"forward", "backward", "inference"} <= directions, directions
    fell_back = [r.report().summary() for r in regions if r.fallback_reason]
    assert not fell_back, fell_back
    # every op of every region in a generated kernel: a segment through the torch reference (a
    # layout change written as ``stride_order``, once) costs a kernel launch and a copy
    on_torch = [r.report().summary() for r in regions if "fallback" in r.report().segments]
    assert not on_torch, on_torch
    distinct = {repr(r.definition): (r.name, r.definition, r.first_args) for r in regions
                if r.first_args is not None}
    assert compile_failures(distinct) == []


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_the_gpu_a_training_step_runs_fusecuts_kernels_as_eager(name):
    # the same step with the regions on fusecut's generated kernels (NVRTC, launched), fp32,
    # against eager on the GPU: the loss and every gradient
    torch.manual_seed(0)
    model = MODELS[name]().float().cuda().train()
    reference = copy.deepcopy(model)
    inputs = {k: v.cuda() for k, v in batch(name, torch.Generator().manual_seed(1)).items()}
    before = last_serial()
    torch._dynamo.reset()
    loss = torch.compile(model, backend="fusecut")(**inputs).loss
    loss.backward()
    want = reference(**inputs).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    assert_close_gradients(model, reference, tolerance=1e-4)
    regions = regions_since(before)
    assert regions and not [r.report().summary() for r in regions if r.fallback_reason]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_on_the_gpu_cuda_graphs_record_and_replay_the_step_as_eager(name):
    # mode="reduce-overhead": the first step runs as it is, the second is recorded, the third
    # replays; each step's loss and gradients as eager's, and no graph skipped recording
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = MODELS[name]().float().cuda().train()
    reference = copy.deepcopy(model)
    counters.clear()
    torch._dynamo.reset()
    torch._inductor.cudagraph_trees.reset_cudagraph_trees()
    compiled = torch.compile(model, backend="fusecut", mode="reduce-overhead")
    for step in range(3):
        inputs = {k: v.cuda() for k, v in
                  batch(name, torch.Generator().manual_seed(10 + step)).items()}
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(**inputs).loss
        loss.backward()
        want = reference(**inputs).loss
        want.backward()
        torch.testing.assert_close(loss.detach().clone(), want, rtol=1e-5, atol=1e-5)
        assert_close_gradients(model, reference, tolerance=1e-4, where=f"step {step}, ")
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert _recorded_graphs() >= 2  # a forward and its backward, at least


def _recorded_graphs() -> int:
    """The CUDA graphs recorded in this process's tree on device 0."""
    manager = torch._inductor.cudagraph_trees.get_manager(0, create_if_none_exists=False)
    if manager is None:
        return 0
    nodes = [n for roots in manager.roots.values() for n in roots]
    count = 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes.extend(c for children in node.children.values() for c in children)
    return count
