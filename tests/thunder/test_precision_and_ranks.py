"""Issue 41's cases that run through Thunder + fusecut without a wrong kernel, on the CPU too.

- A rounding the program performs is kept: ``logsumexp(log_softmax(a) + b)`` in bf16 had every
  gradient NaN when regions dropped f32 -> bf16 -> f32 round trips (Thunder's amax backward finds
  the maximum by equality with a value saved from a forward that skipped the rounding).
- A gradient Thunder labels 0-d but computes at a broadcast shape gets the sum it lacks:
  ``(scale.exp().clamp(max=100) * w) @ y.t()`` with a 0-d ``scale`` made a region that could not
  plan and fell back to torch.
- ``scaled_dot_product_attention`` with a 2-d or 3-d mask, 3-d inputs or repeated key heads is
  traced in the 4-d form Thunder's sdpa executor takes; its executor claims nothing its kernels
  refuse later (the Mistral-style decoder is in the model zoo).

On the CPU fusecut's regions run on the torch reference: these check what fusecut decides (what
the regions compute, what is summed, which form attention takes). The ``gpu`` tests run the same
steps on CUDA, where fusecut's kernels and Thunder's sdpa executor run, against Thunder alone.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusecut.thunder
from fusecut.thunder.executor import fusecut_ex, thunder
from fusecut.thunder.reports import region_reports
from tests.thunder.model_zoo import ZOO
from tests.thunder.thunder_steps import assert_as_close_to_fp32

EXECUTORS = {"executors()": fusecut.thunder.executors, "[fusecut_ex]": lambda: [fusecut_ex]}


def run_step(model: nn.Module, args: tuple, executors: list | None):
    """Loss and every parameter's gradient of one step: eager where ``executors`` is None, else
    through Thunder with those executors (and fusecut's transforms). Also the jitted module."""
    for p in model.parameters():
        p.grad = None
    jitted = None
    if executors is None:
        loss = model(*args)
    else:
        jitted = thunder.jit(model, executors=executors, transforms=fusecut.thunder.transforms())
        loss = jitted(*args)
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()], jitted


def assert_no_region_fell_back(jitted) -> None:
    reports = region_reports(jitted)
    assert reports, "Thunder handed fusecut no region"
    fell_back = [r.summary() for r in reports if r.fallback is not None]
    assert not fell_back, fell_back


def assert_fp32_step_is_eagers(make, args: tuple, executors: list) -> None:
    torch.manual_seed(0)
    model = make()
    want, _ = run_step(copy.deepcopy(model), args, None)
    got, jitted = run_step(model, args, executors)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for name, g, w in zip(names, got, want, strict=True):
        assert g.shape == w.shape, f"{name}: {tuple(g.shape)} against eager's {tuple(w.shape)}"
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert_no_region_fell_back(jitted)


def assert_bf16_step_is_as_close_to_fp32_as_eagers(make, args: tuple, executors: list) -> None:
    """The zoo's bf16 criterion: finite, and each value at most twice as far from the fp32 step
    as eager bf16's, plus a bf16 rounding of its largest element."""
    torch.manual_seed(0)
    model = make()

    def low(a):
        return a.to(torch.bfloat16) if a.is_floating_point() else a

    exact, _ = run_step(copy.deepcopy(model), args, None)
    eager, _ = run_step(copy.deepcopy(model).to(torch.bfloat16), tuple(map(low, args)), None)
    ours, jitted = run_step(model.to(torch.bfloat16), tuple(map(low, args)), executors)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for name, g in zip(names, ours, strict=True):
        assert torch.isfinite(g.float()).all(), f"{name} is not finite: {g}"
    assert_as_close_to_fp32(names, ours, eager, exact, torch.bfloat16)
    assert_no_region_fell_back(jitted)


# ---- 1. a rounding the program performs is kept ------------------------------------------------


class LogSumExpOfLogSoftmax(nn.Module):
    """``logsumexp(log_softmax(a) + b)``: in bf16 the log-softmax is rounded to bf16 (a region
    output the backward recomputes from), and logsumexp's max is found again by equality."""

    def __init__(self, rows: int = 6, cols: int = 40):
        super().__init__()
        self.a = nn.Parameter(torch.randn(rows, cols))
        self.b = nn.Parameter(torch.randn(rows, cols))

    def forward(self):
        return torch.logsumexp(torch.log_softmax(self.a, -1) + self.b, -1).sum()


@pytest.mark.parametrize("which", sorted(EXECUTORS))
def test_logsumexp_after_log_softmax_in_bf16_has_finite_gradients(which):
    # every gradient was NaN: the forward's saved max lacked the bf16 rounding the backward's
    # recomputation had, so eq(x, max) matched nothing and the backward divided 0 by 0
    assert_bf16_step_is_as_close_to_fp32_as_eagers(LogSumExpOfLogSoftmax, (), EXECUTORS[which]())


@pytest.mark.parametrize("which", sorted(EXECUTORS))
def test_logsumexp_after_log_softmax_in_fp32_matches_eager(which):
    assert_fp32_step_is_eagers(LogSumExpOfLogSoftmax, (), EXECUTORS[which]())


def test_a_rounding_through_bf16_inside_a_region_is_computed():
    # f32 -> bf16 -> f32 inside one region: the result is the bf16-rounded value, bit for bit
    # (a region that dropped the round trip returned 3 * x unrounded, 1e-3 relative off)
    def f(x):
        return (x * 3).to(torch.bfloat16).float() * 2

    x = torch.randn(64, 33)
    got = thunder.jit(f, executors=[fusecut_ex])(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    assert not torch.equal(got, x * 6), "the inputs must be ones the rounding changes"


def test_a_rounding_nothing_sees_is_dropped_and_one_a_comparison_sees_is_kept():
    # rounded to bf16 again before it leaves the region, with nothing compared: the f32 -> bf16
    # -> f32 round trip is dropped (one cast left: the output's), as Thunder's nvFuser pass does
    # (keeping every one put a Llama-2 block's bf16 norm-weight gradient 3.5 times as far from
    # the fp32 step as torch's on the H200). A max of the round trip's result keeps it.
    def unseen(x):
        return ((x * 3).to(torch.bfloat16).float() * 2).to(torch.bfloat16)

    def compared(x):
        y = (x * 3).to(torch.bfloat16).float()
        return (y * 2).to(torch.bfloat16), torch.amax(y, -1)

    x = torch.randn(8, 16)
    for f, casts in ((unseen, 1), (compared, 3)):
        jitted = thunder.jit(f, executors=[fusecut_ex])
        torch.testing.assert_close(jitted(x), f(x), rtol=0, atol=0)
        (report,) = region_reports(jitted)
        assert report.definition.count("ops.cast(") == casts, (f.__name__, report.definition)


def test_a_widening_round_trip_still_costs_nothing():
    # bf16 -> f32 -> bf16 is the bf16 value exactly: dropped, and a region with nothing else to
    # compute is no kernel at all (torch returns the input)
    def f(x):
        return x.float().to(torch.bfloat16)

    x = torch.randn(8, 16).to(torch.bfloat16)
    jitted = thunder.jit(f, executors=[fusecut_ex])
    got = jitted(x)
    torch.testing.assert_close(got, x, rtol=0, atol=0)
    assert not region_reports(jitted)


# ---- 2. a gradient labelled 0-d gets the sum Thunder left out ----------------------------------


class ZeroDimScale(nn.Module):
    """A 0-d parameter broadcast into a matrix, then a matmul: Thunder 0.2.6's backward labels
    the scale's gradient 0-d while computing it at w's shape."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.w = nn.Parameter(torch.randn(4, 16))

    def forward(self, y):
        return ((self.scale.exp().clamp(max=100) * self.w) @ y.t()).square().mean()


def _y() -> torch.Tensor:
    return torch.randn(32, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("which", sorted(EXECUTORS))
def test_a_0d_parameter_in_bf16_runs_on_fusecut_with_eagers_gradient(which):
    # the region after the mislabelled value fell back to torch ("expected rank 0, got shape
    # [4, 16]"); with the sum put in, every region plans and the scale's gradient is 0-d
    assert_bf16_step_is_as_close_to_fp32_as_eagers(ZeroDimScale, (_y(),), EXECUTORS[which]())


@pytest.mark.parametrize("which", sorted(EXECUTORS))
def test_a_0d_parameter_in_fp32_matches_eager(which):
    assert_fp32_step_is_eagers(ZeroDimScale, (_y(),), EXECUTORS[which]())


def test_the_missing_sum_goes_in_where_the_label_says_0d():
    # the pass itself: a bf16 backward of the block has a mislabelled prim, and none after it
    from fusecut.thunder.claims import POINTWISE
    from fusecut.thunder.missing_sums import mislabelled_shape

    seen: list[int] = []
    original = type(fusecut_ex).fusion_pass

    def everywhere(bsyms):  # inside fusecut's regions too
        return [b for top in bsyms for b in [top, *everywhere(top.subsymbols)]]

    def counting(self, trace):
        seen.append(sum(mislabelled_shape(b, POINTWISE) is not None for b in trace.bound_symbols))
        fused = original(self, trace)
        left = [b for b in everywhere(fused.bound_symbols)
                if mislabelled_shape(b, POINTWISE) is not None]
        assert not left, left
        return fused

    model = ZeroDimScale().to(torch.bfloat16)
    try:
        type(fusecut_ex).fusion_pass = counting
        thunder.jit(model, executors=[fusecut_ex])(_y().to(torch.bfloat16)).backward()
    finally:
        type(fusecut_ex).fusion_pass = original
    assert sum(seen) >= 1, "Thunder labelled every gradient right: the case is gone"
    assert model.scale.grad.shape == ()


# ---- 3. attention in the form Thunder's sdpa executor takes ------------------------------------


class Attention(nn.Module):
    """Self-attention whose query, key and value are shaped and masked as ``kind`` says."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.kind == "3-d inputs":  # one head: (batch, sequence, size), a 3-d mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).square().mean()
        q, k, v = (u.view(b, t, 4, 4).transpose(1, 2) for u in (q, k, v))
        if self.kind == "grouped heads":  # 2 key/value heads serve 4 query heads
            k, v = k[:, :2], v[:, :2]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.square().mean()


def _mask(shape: tuple[int, ...], boolean: bool = False) -> torch.Tensor:
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(2)) > 0.3
    keep |= torch.eye(shape[-1], dtype=torch.bool)  # every query attends somewhere
    if boolean:
        return keep
    return torch.zeros(shape).masked_fill(~keep, float("-inf"))


MASKS = {
    "2-d additive": ("4-d", lambda: _mask((6, 6))),
    "2-d boolean": ("4-d", lambda: _mask((6, 6), boolean=True)),
    "3-d over heads": ("4-d", lambda: _mask((4, 6, 6))),
    "4-d broadcast over the batch": ("4-d", lambda: _mask((1, 1, 6, 6))),
    "3-d inputs, 3-d mask": ("3-d inputs", lambda: _mask((2, 6, 6))),
    "grouped heads, 2-d mask": ("grouped heads", lambda: _mask((6, 6))),
}


@pytest.mark.parametrize("case", sorted(MASKS))
def test_attention_is_traced_in_the_form_thunders_sdpa_kernels_take(case):
    from thunder.executors.utils import _input_shape_check_fused_scaled_dot_product_attention

    kind, mask = MASKS[case]
    model = Attention(kind)
    x, m = torch.randn(2, 6, 16), mask()
    want, _ = run_step(copy.deepcopy(model), (x, m), None)
    got, jitted = run_step(model, (x, m), fusecut.thunder.executors())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    calls = [b for b in thunder.last_traces(jitted)[0].bound_symbols
             if b.sym.id == thunder.torch.scaled_dot_product_attention.id]
    assert calls, "no scaled_dot_product_attention in the trace"
    for call in calls:  # the checks Thunder's sdpa kernels make after claiming: now they pass
        _input_shape_check_fused_scaled_dot_product_attention(*call.args[:4])


def test_thunders_sdpa_executor_claims_no_call_its_kernels_refuse(monkeypatch):
    # on the CPU torch picks no fused kernel, so the guarded checker is checked with torch's
    # choice made the GPU's (memory-efficient attention, the one that takes a mask)
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.executors import sdpaex

    monkeypatch.setattr(sdpaex, "_fused_sdp_choice",
                        lambda *args: sdpaex.SpdaBackend.MEMORY_EFFICIENT)
    fusecut.thunder.executors()  # guards the sdpa executor, once
    checker = sdpaex.sdpa_ex.implmap[thunder.torch.scaled_dot_product_attention.id].checker
    with tracectx(TraceCtx()):
        def tensor(*shape):
            return TensorProxy(shape=shape, device=devices.Device("cuda:0"),
                               dtype=dtypes.float32, requires_grad=True)

        q, k, v = tensor(2, 4, 6, 8), tensor(2, 4, 6, 8), tensor(2, 4, 6, 8)
        assert checker(q, k, v, tensor(2, 4, 6, 6), 0.0, False, scale=None)
        assert checker(q, k, v, None, 0.0, False, scale=None)
        assert not checker(q, k, v, tensor(6, 6), 0.0, False, scale=None)
        assert not checker(q, k, v, tensor(1, 4, 6, 6), 0.0, False, scale=None)  # batch 1
        assert not checker(tensor(2, 6, 8), tensor(2, 6, 8), tensor(2, 6, 8), None, 0.0, False,
                           scale=None)


# ---- the same on the GPU, against Thunder alone ------------------------------------------------


def _cuda_step(make, args: tuple, executors: list, dtype: torch.dtype):
    torch.manual_seed(0)
    model = make().cuda().to(dtype)
    args = tuple(a.cuda().to(dtype) if a.is_floating_point() else a.cuda() for a in args)
    return run_step(model, args, executors)


GPU_CASES = {  # name: (the module, its inputs)
    "logsumexp after log_softmax": (LogSumExpOfLogSoftmax, lambda: ()),
    "0-d parameter": (ZeroDimScale, lambda: (_y(),)),
    "mistral": (lambda: ZOO["mistral"]()[0], lambda: ZOO["mistral"]()[1]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_on_the_gpu_fp32_gradients_equal_thunder_alones_and_bf16_is_finite(case):
    # fusecut's kernels and Thunder's sdpa executor run here: the Mistral-style mask reaches
    # the sdpa executor, which refused it after claiming it before
    make, args = GPU_CASES[case]
    alone, _ = _cuda_step(make, args(), [thunder.pytorch_executor], torch.float32)
    ours, jitted = _cuda_step(make, args(), fusecut.thunder.executors(), torch.float32)
    for g, w in zip(ours, alone, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert_no_region_fell_back(jitted)
    low, jitted = _cuda_step(make, args(), fusecut.thunder.executors(), torch.bfloat16)
    assert all(torch.isfinite(g.float()).all() for g in low)
    assert_no_region_fell_back(jitted)
