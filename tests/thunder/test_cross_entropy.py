"""fusecut's cross-entropy for Thunder (issue 30): the loss and its gradient written out in
primitives fusecut fuses, around the per-row log-sum-exp, so that the backward recomputes the
softmax from the logits instead of reading a saved log-softmax.

On the CPU: which calls it claims, its place in the executor list, loss and gradients against
torch (ignored rows, both reductions, bf16 against the fp32 loss), and what the forward keeps for
the backward. On the GPU: a bf16 step against torch's, and the backward as one fusecut kernel.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx

import fusecut.thunder
from fusecut.thunder.cross_entropy import claims, cross_entropy_ex
from fusecut.thunder.executor import thunder
from fusecut.thunder.regions import fusecut_regions
from fusecut.thunder.reports import region_reports


def proxy(shape, dtype=dtypes.bfloat16, device="cpu"):
    return TensorProxy(shape=shape, dtype=dtype, device=devices.Device(device),
                       requires_grad=False)


def test_it_claims_row_class_logits_with_integer_targets_and_plain_reductions():
    with tracectx(TraceCtx()):
        logits, target = proxy((8, 50)), proxy((8,), dtypes.int64)
        assert claims(logits, target)
        assert claims(logits, target, ignore_index=-1, reduction="sum")
        assert claims(proxy((8, 50), dtypes.float32), proxy((8,), dtypes.int32))
        refused = {
            "class weights": ((logits, target, proxy((50,), dtypes.float32)), {}),
            "label smoothing": ((logits, target), {"label_smoothing": 0.1}),
            "no reduction": ((logits, target), {"reduction": "none"}),
            "3-d logits": ((proxy((2, 8, 50)), proxy((2, 8), dtypes.int64)), {}),
            "probability targets": ((logits, proxy((8, 50))), {}),
            "float targets": ((logits, proxy((8,), dtypes.float32)), {}),
            "rows that differ": ((logits, proxy((7,), dtypes.int64)), {}),
            "no classes": ((proxy((8, 0)), target), {}),
            "another device": ((logits, proxy((8,), dtypes.int64, "cuda:0")), {}),
        }
        for why, (args, kwargs) in refused.items():
            assert not claims(*args, **kwargs), why


def test_it_is_first_in_the_executor_list_unless_left_out():
    names = [e.name for e in fusecut.thunder.executors()]
    assert names.index("fusecut_cross_entropy") < names.index("torchcompile_xentropy")
    assert "fusecut_cross_entropy" not in [e.name for e in
                                           fusecut.thunder.executors(cross_entropy=False)]


def _step(dtype, reduction, ignore_index=-1, rows=24, classes=37, ignored=(3, 7)):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, classes, generator=g).to(dtype).requires_grad_()
    target = torch.randint(0, classes, (rows,), generator=g)
    target[list(ignored)] = ignore_index

    def loss_fn(a, t):
        return F.cross_entropy(a, t, ignore_index=ignore_index, reduction=reduction)

    jitted = thunder.jit(loss_fn, executors=fusecut.thunder.executors())
    loss = jitted(logits, target)
    loss.backward()
    want, want_grad = _torch_loss(loss_fn, logits, target, torch.float64)
    return jitted, loss, logits.grad, want, want_grad


def _torch_loss(loss_fn, logits, target, dtype):
    """torch's loss and gradient of ``logits`` taken in ``dtype``: the reference."""
    exact = logits.detach().to(dtype).requires_grad_()
    want = loss_fn(exact, target)
    want.backward()
    return want, exact.grad


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradient_match_torch_and_skip_ignored_rows(reduction):
    jitted, loss, grad, want, want_grad = _step(torch.float32, reduction)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-5, atol=1e-6)
    assert grad[3].abs().max() == 0 and grad[7].abs().max() == 0  # the ignored rows
    forward = thunder.last_traces(jitted)[-1]
    assert fusecut_regions(forward), "the loss should run in fusecut's kernels"
    names = {b.sym.name for t in (forward, thunder.last_backward_traces(jitted)[-1])
             for b in t.bound_symbols}
    assert not names & {"log_softmax", "nll_loss", "log_softmax_backward", "nll_loss_backward"}


def test_bf16_logits_are_reduced_in_float32():
    # torch's bf16 cross_entropy rounds the log-softmax to bf16; the float32 sums here are
    # closer to the exact loss than that
    _, loss, grad, want, want_grad = _step(torch.bfloat16, "mean", rows=64, classes=1000)
    assert loss.dtype == torch.bfloat16 and grad.dtype == torch.bfloat16
    assert abs(float(loss) - float(want)) <= 2 ** -7 * abs(float(want))  # one bf16 rounding
    assert (grad.double() - want_grad).abs().max() <= 2 ** -8 * want_grad.abs().max()


def test_every_row_ignored_gives_nan_like_torch():
    _, loss, grad, _, _ = _step(torch.float32, "mean", rows=4, ignored=(0, 1, 2, 3))
    assert torch.isnan(loss) and not grad.isnan().any()


def test_the_forward_keeps_the_logits_and_the_row_log_sum_exp_not_a_log_softmax():
    jitted, *_ = _step(torch.bfloat16, "mean", rows=16, classes=40)
    forward = thunder.last_traces(jitted)[-1]
    saved = [t for t in forward.output[1][0] if isinstance(t, TensorProxy)]
    shapes = {(tuple(t.shape), t.dtype) for t in saved}
    assert ((16, 40), dtypes.float32) not in shapes  # no float32 (log-)softmax or upcast kept
    assert any(shape == (16,) and dtype == dtypes.float32 for shape, dtype in shapes)  # the lse
    backward = region_reports(jitted)[-1]
    assert backward.direction == "backward" and backward.segments == ["pointwise"]


def test_a_language_model_loss_reads_its_logits_once_each_way():
    # logits.view(-1, vocab) of [batch, sequence, vocab]: the reshape is torch's view before the
    # kernel (fusecut.thunder.layout), so the forward is one online log-sum-exp pass over the
    # logits and the backward one pass that reads them and writes their gradient
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 64, 3000, generator=g).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 3000, (2, 64), generator=g)

    def loss_fn(a, t):
        return F.cross_entropy(a.view(-1, a.size(-1)).float(), t.view(-1))

    jitted = thunder.jit(loss_fn, executors=fusecut.thunder.executors())
    jitted(logits, target).backward()
    size = logits.numel() * logits.element_size()
    big = [r for r in region_reports(jitted) if r.planned_bytes >= size]
    assert [r.direction for r in big] == ["forward", "backward"]
    forward, backward = big
    assert forward.planned_bytes < 1.1 * size  # read once: no copy into the 2-d shape
    assert backward.segments == ["pointwise"] and backward.planned_bytes < 2.1 * size


@pytest.mark.gpu
def test_a_bf16_step_on_the_gpu_matches_torch_in_one_backward_kernel():
    torch.manual_seed(0)
    logits = torch.randn(2048, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 32000, (2048,), device="cuda")
    target[:7] = -100

    def loss_fn(a, t):
        return F.cross_entropy(a.float(), t)

    jitted = thunder.jit(loss_fn, executors=fusecut.thunder.executors())
    for _ in range(2):  # the second step takes the warm path
        logits.grad = None
        loss = jitted(logits, target)
        loss.backward()
    want, want_grad = _torch_loss(loss_fn, logits, target, torch.float32)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad.float(), want_grad, rtol=2 ** -7, atol=1e-7)
    backward = [r for r in region_reports(jitted) if r.direction == "backward"]
    assert [r.segments for r in backward] == [["pointwise"]]
    assert cross_entropy_ex in fusecut.thunder.executors()
