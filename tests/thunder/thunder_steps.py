"""One training step through Thunder, and the check that an executor's step is Thunder's torch
executor's step.

In fp32 the two agree to 2e-5. In 16-bit they round at different places, so neither is the
truth and a fixed tolerance is either loose or flaky (about one draw of weights in 30 put one
gradient element of a block past 5e-2). Both are then measured against the same step in fp32,
as FlashAttention's tests measure their kernels: ours may be off by at most twice the torch
executor's own error, plus 1/256 of the tensor's largest value (a bf16 rounding of it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from fusecut.thunder.executor import thunder

FP32_TOLERANCE = 2e-5


def step(jitted, model: torch.nn.Module, x: torch.Tensor, *extra: torch.Tensor,
         seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward and backward; the output and the gradients of the input and every parameter."""
    torch.manual_seed(seed)
    x = x.detach().clone().requires_grad_(True)
    for p in model.parameters():
        p.grad = None
    y = jitted(x, *extra)
    y.backward(torch.ones_like(y))
    return y.detach(), [x.grad] + [p.grad for p in model.parameters()]


def torch_executor_step(model: torch.nn.Module, *args: torch.Tensor, seed: int = 0,
                        dtype: torch.dtype | None = None):
    """The step of a copy of ``model`` (in ``dtype``, if given) through Thunder's torch
    executor."""
    reference = copy.deepcopy(model) if dtype is None else copy.deepcopy(model).to(dtype)
    return step(thunder.jit(reference, executors=[thunder.pytorch_executor]), reference, *args,
                seed=seed)


def assert_same_step(ours, model: torch.nn.Module, *args: torch.Tensor,
                     seed: int = 0) -> torch.Tensor:
    """One step of ``ours`` (``model`` jitted with the executor under test) gives the output
    and the gradients that Thunder's torch executor gives on a copy of ``model``. The output."""
    dtype = next(model.parameters()).dtype
    names = ["output", "input's gradient"] + [f"{n}'s gradient" for n, _ in
                                               model.named_parameters()]
    y, grads = step(ours, model, *args, seed=seed)
    y_low, grads_low = torch_executor_step(model, *args, seed=seed)
    got, low = [y] + grads, [y_low] + grads_low
    assert len(got) == len(low) == len(names)
    assert all(g is not None for g in got), [n for n, g in zip(names, got) if g is None]
    if dtype == torch.float32:
        for name, g, want in zip(names, got, low):
            torch.testing.assert_close(g, want, atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE,
                                       msg=lambda m, name=name: f"{name}: {m}")
        return y
    exact_args = [a.float() if a.dtype == dtype else a for a in args]
    y_exact, grads_exact = torch_executor_step(model, *exact_args, seed=seed,
                                               dtype=torch.float32)
    assert_as_close_to_fp32(names, got, low, [y_exact] + grads_exact, dtype)
    return y


def assert_as_close_to_fp32(names: list[str], got: list[torch.Tensor],
                            low: list[torch.Tensor], exact: list[torch.Tensor],
                            dtype: torch.dtype) -> None:
    """16-bit results ``got`` are at most twice as far from the fp32 step ``exact`` as Thunder's
    torch executor's ``low``, plus a 16-bit rounding of the largest value."""
    for name, g, g_low, want in zip(names, got, low, exact):
        want = want.float()
        ours_off = (g.float() - want).abs().max().item()
        torch_off = (g_low.float() - want).abs().max().item()
        allowed = 2 * torch_off + want.abs().max().item() / 256
        assert ours_off <= allowed, (
            f"{name}: {ours_off:.3g} off the fp32 step, over the {allowed:.3g} allowed (Thunder's "
            f"torch executor in {dtype} is {torch_off:.3g} off)")


def lm_step(jitted, model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor | None
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A language model's training step (``targets`` given: the loss and every parameter's
    gradient) or inference step (under no_grad: the logits)."""
    if targets is None:
        with torch.no_grad():
            return jitted(tokens).detach(), []
    for p in model.parameters():
        p.grad = None
    loss = jitted(tokens, targets)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def torch_executor_lm_step(model: torch.nn.Module, tokens: torch.Tensor,
                           targets: torch.Tensor | None, dtype: torch.dtype) -> list[torch.Tensor]:
    """The step of a copy of ``model`` in ``dtype`` through Thunder's torch executor: the loss
    and gradients (or the logits)."""
    copy_ = copy.deepcopy(model).to(dtype)
    y, grads = lm_step(thunder.jit(copy_, executors=[thunder.pytorch_executor]), copy_, tokens,
                       targets)
    return [y] + grads


def assert_same_lm_step(ours, model: torch.nn.Module, tokens: torch.Tensor,
                        targets: torch.Tensor | None,
                        reference: Callable[[torch.dtype], list[torch.Tensor]] | None = None
                        ) -> torch.Tensor:
    """``ours`` (``model`` jitted with the executor under test) gives the loss and gradients (or
    the logits) of Thunder's torch executor on a copy of ``model``: to 2e-5 relative in fp32
    (1e-4 for the loss and gradients of a whole model, summed over many more terms); in 16-bit
    as close to the fp32 step as ``assert_as_close_to_fp32`` asks. ``reference(dtype)``: the
    torch executor's step in ``dtype`` (``torch_executor_lm_step`` by default; a caller may
    keep the fp32 one, which every dtype's check takes)."""
    dtype = next(model.parameters()).dtype
    what = "loss" if targets is not None else "logits"
    names = [what] + ([f"{n}'s gradient" for n, _ in model.named_parameters()]
                      if targets is not None else [])
    got_y, got_grads = lm_step(ours, model, tokens, targets)
    got = [got_y] + got_grads
    assert all(g is not None for g in got), [n for n, g in zip(names, got) if g is None]

    if reference is None:
        def reference(dt: torch.dtype) -> list[torch.Tensor]:
            return torch_executor_lm_step(model, tokens, targets, dt)

    low = reference(dtype)
    if dtype == torch.float32:
        tolerance = 1e-4 if targets is not None else FP32_TOLERANCE
        for name, g, want in zip(names, got, low):
            torch.testing.assert_close(g, want, atol=tolerance, rtol=tolerance,
                                       msg=lambda m, name=name: f"{name}: {m}")
    else:
        assert_as_close_to_fp32(names, got, low, reference(torch.float32), dtype)
    return got_y
