"""Tied parameters traced as one value (issue 30): the embedding and the head that shares its
weight get one gradient, summed inside the backward trace, where autograd summed two outside it.

On the CPU, through the real Thunder: whole models' loss and gradients against eager torch (fp32),
the backward's one gradient, and a module untied after it was jitted (the prologue's
check sends it to a new trace, which gives the head its own gradient again).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusecut.thunder
from benchmarks.whole_models import whole_model
from fusecut.thunder.executor import thunder
from fusecut.thunder.tied_parameters import tied_groups
from tests.thunder.thunder_steps import assert_same_lm_step, lm_step

TIED = {"llama3": ["embed.weight", "head.weight"],
        "nanogpt": ["model.transformer.wte.weight", "model.lm_head.weight"]}


def jit(model: nn.Module):
    return thunder.jit(model, executors=fusecut.thunder.executors(),
                       transforms=fusecut.thunder.transforms())


def eager(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor):
    """The reference: the loss and gradients of a copy of ``model`` in eager torch (fp32),
    where autograd sums the tied weight's two gradients."""
    copy_ = copy.deepcopy(model)
    loss, grads = lm_step(copy_, copy_, tokens, targets)
    return lambda dtype: [loss] + grads


def returned_gradients(jitted) -> list:
    """What the last backward trace returns, one entry per input of the forward."""
    return list(thunder.last_backward_traces(jitted)[-1].bound_symbols[-1].args[0])


@pytest.mark.parametrize("name", sorted(TIED))
def test_a_tied_weight_gets_one_gradient_summed_inside_the_backward(name):
    model, make_batch = whole_model(name, "tiny")
    assert tied_groups(model) == [TIED[name]]
    tokens, targets = make_batch(2, 16, "cpu")
    jitted = jit(model)
    assert_same_lm_step(jitted, model, tokens, targets, eager(model, tokens, targets))

    # the forward's inputs: one per name (Thunder unpacks each), the second unused now
    prologue = str(thunder.last_prologue_traces(jitted)[-1])
    assert "fusecut_check_same_tensor" in prologue, prologue[-2000:]
    gradients = returned_gradients(jitted)
    computed = [g for g in gradients if g is not None]
    # every parameter tensor once (the tied one once for both names), no input's gradient
    assert len(computed) == len(list(model.parameters())), (len(computed), gradients)


def test_without_the_transform_the_backward_returns_two_gradients_for_the_tied_weight():
    # the cost the transform removes, as Thunder alone traces it
    model, make_batch = whole_model("llama3", "tiny")
    tokens, targets = make_batch(2, 16, "cpu")
    jitted = thunder.jit(model, executors=fusecut.thunder.executors())
    jitted(tokens, targets).backward()
    computed = [g for g in returned_gradients(jitted) if g is not None]
    assert len(computed) == len(list(model.parameters())) + 1


def test_a_module_untied_after_jit_is_traced_again_with_a_gradient_per_weight():
    model, make_batch = whole_model("llama3", "tiny")
    tokens, targets = make_batch(2, 16, "cpu")
    jitted = jit(model)
    jitted(tokens, targets).backward()
    assert thunder.cache_misses(jitted) == 1
    model.head.weight = nn.Parameter(model.embed.weight.detach() * 2)  # untied
    assert tied_groups(model) == []
    assert_same_lm_step(jitted, model, tokens, targets, eager(model, tokens, targets))
    assert thunder.cache_misses(jitted) == 2
    assert model.head.weight.grad is not None and model.embed.weight.grad is not None
    assert not torch.equal(model.head.weight.grad, model.embed.weight.grad)


def test_a_function_without_a_module_is_left_as_it_is():
    # no module, no parameters to tie: the transform changes nothing
    def f(x, w):
        return (x @ w).sum()

    jitted = thunder.jit(f, executors=fusecut.thunder.executors(),
                         transforms=fusecut.thunder.transforms())
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    jitted(x, w).backward()
    torch.testing.assert_close(w.grad, x.sum(0)[:, None].expand(3, 2))
