"""GELU in GEMM epilogues: the runtime's two fused calls (cuBLASLt on the GPU, torch elsewhere),
and the Thunder rewrite that finds a tanh GELU after a linear, and its derivative after the
backward's matmul, by value."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fusecut.thunder.fused_gemm as gemm_epilogues
from fusecut.thunder.executor import FusecutExecutor, fusecut_ex, thunder
from fusecut.thunder.fused_gemm import linear_gelu_tanh, linear_residual, matmul_dgelu_tanh
from tests.thunder.thunder_steps import assert_same_step

GPU = torch.cuda.is_available()


def reference(x, w, b, dy, w2):
    h = F.linear(x, w, b)
    g = F.gelu(h.float(), approximate="tanh").to(h.dtype)
    dg = dy.reshape(-1, w2.shape[0]) @ w2
    dh = torch.ops.aten.gelu_backward(dg.float(), h.reshape(dg.shape).float(),
                                      approximate="tanh").to(h.dtype).reshape(h.shape)
    return g, h, dh


def operands(device, dtype, tokens=64, width=32, hidden=128, bias=True):
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype)
    return (torch.randn(2, tokens // 2, width, **kw), torch.randn(hidden, width, **kw) * 0.2,
            torch.randn(hidden, **kw) if bias else None, torch.randn(tokens, width, **kw),
            torch.randn(width, hidden, **kw) * 0.2)


@pytest.mark.parametrize("bias", [True, False])
def test_calls_compute_the_unfused_values_on_the_cpu(bias):
    x, w, b, dy, w2 = operands("cpu", torch.float32, bias=bias)
    g, h = linear_gelu_tanh(x, w, b)
    dh = matmul_dgelu_tanh(dy, w2, h)
    torch.testing.assert_close(linear_residual(x, w, b, h), h + F.linear(x, w, b))
    g_ref, h_ref, dh_ref = reference(x, w, b, dy, w2)
    assert g.shape == h.shape == dh.shape == (2, 32, 128)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(dh, dh_ref)


class Refusing:
    """A cuBLASLt that offers no algorithm, or whose call fails."""

    def __init__(self, plan):
        self.plan_result = plan

    def plan(self, *args):
        return self.plan_result

    def run(self, *args, **kwargs):
        raise gemm_epilogues.CublasLtError("cublasLtMatmul failed: cublasStatus 15")


def unloadable():
    raise gemm_epilogues.CublasLtError("libcublasLt not found")


@pytest.mark.parametrize("cublaslt", [unloadable, lambda: Refusing(None),
                                      lambda: Refusing(object())],
                         ids=["not-loadable", "no-algorithm", "call-fails"])
def test_calls_fall_back_to_the_same_values_when_cublaslt_cannot_run_them(cublaslt, monkeypatch):
    monkeypatch.setattr(gemm_epilogues, "_fusable", lambda *tensors: True)
    monkeypatch.setattr(gemm_epilogues, "cublaslt", cublaslt)
    x, w, b, dy, w2 = operands("cpu", torch.float32)
    g, h = linear_gelu_tanh(x, w, b)
    g_ref, h_ref, dh_ref = reference(x, w, b, dy, w2)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(matmul_dgelu_tanh(dy, w2, h), dh_ref)
    torch.testing.assert_close(linear_residual(x, w, b, h), h + F.linear(x, w, b))


@pytest.mark.skipif(GPU, reason="needs a machine without CUDA")
def test_cublaslt_that_cannot_load_says_why_once(monkeypatch):
    import fusecut.thunder.cublaslt as binding

    monkeypatch.setattr(binding, "_instance", None)
    monkeypatch.setattr(binding, "_unavailable", None)
    loads = []
    real = binding._load
    monkeypatch.setattr(binding, "_load", lambda: loads.append(1) or real())
    for _ in range(3):
        with pytest.raises(binding.CublasLtError, match="no cuBLAS"):
            binding.cublaslt()
    assert loads == [1]


def test_derivative_call_names_a_shape_mismatch():
    x, w, b, dy, w2 = operands("cpu", torch.float32)
    h = F.linear(x, w, b)
    with pytest.raises(ValueError, match=r"grad @ weight is \[64, 128\], h is \[2, 16, 128\]"):
        matmul_dgelu_tanh(dy, w2, h[:, :16])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_calls_run_as_one_cublaslt_gemm_each_on_the_gpu(dtype, bias, monkeypatch):
    x, w, b, dy, w2 = operands("cuda", dtype, tokens=256, width=128, hidden=512, bias=bias)
    g_ref, h_ref, dh_ref = reference(x, w, b, dy, w2)

    def unfused(*args, **kwargs):
        raise AssertionError("the unfused path ran")

    # The fused path never reaches torch's linear, matmul or GELU backward.
    monkeypatch.setattr(gemm_epilogues, "F", type("NoF", (), {"linear": unfused}))
    monkeypatch.setattr(gemm_epilogues.torch.ops.aten, "gelu_backward", unfused, raising=False)
    g, h = linear_gelu_tanh(x, w, b)
    dh = matmul_dgelu_tanh(dy, w2, h_ref)
    residual = torch.randn_like(dy).view(2, -1, dy.shape[-1])
    b2 = b[: w2.shape[0]] if bias else None
    summed = linear_residual(g, w2, b2, residual)
    monkeypatch.undo()
    torch.cuda.synchronize()
    torch.testing.assert_close(
        summed, residual + F.linear(g, w2, b2), atol=6e-2, rtol=2e-2)
    torch.testing.assert_close(h, h_ref)
    # cuBLASLt applies GELU to the fp32 accumulator, the reference to the rounded h
    torch.testing.assert_close(g, g_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(dh, dh_ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_operands_cublaslt_cannot_take_run_unfused_with_the_same_values():
    x, w, b, dy, w2 = operands("cuda", torch.bfloat16, tokens=256, width=136, hidden=512)
    shifted = torch.randn(257, 136, device="cuda", dtype=torch.bfloat16)[1:]  # 272-byte offset
    strided = torch.randn(136, 256, device="cuda", dtype=torch.bfloat16).t()  # column-major
    for rows in (shifted, strided):
        g, h = linear_gelu_tanh(rows, w, b)
        g_ref, h_ref, _ = reference(rows, w, b, dy[:, :136], w2[:136])
        torch.testing.assert_close(h, h_ref)
        torch.testing.assert_close(g, g_ref)


# ---- the Thunder rewrite ------------------------------------------------------------------------


class MLP(torch.nn.Module):
    """A linear, an activation, a linear."""

    def __init__(self, activation):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.proj, self.activation = (torch.nn.Linear(32, 128),
                                               torch.nn.Linear(128, 32), activation)

    def forward(self, x):
        return self.proj(self.activation(self.fc(x)))


def by_hand(k: float, c: float):
    """tanh GELU written out, with its two constants."""
    return lambda h: 0.5 * h * (1.0 + torch.tanh(k * (h + c * torch.pow(h, 3))))


SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
# These GEMMs are tiny: an executor that fuses whatever the size.
any_size = FusecutExecutor("fusecut_epilogues_any_size", epilogue_min_bytes=0)


def fused_calls(jitted) -> list[str]:
    names = []
    for trace in (thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]):
        names += [b.sym.name for b in trace.bound_symbols if "gelu_tanh" in b.sym.name]
    return names


def same_step_as_torch(model: torch.nn.Module, dtype: torch.dtype, executor=any_size):
    """``model`` jitted with ``executor`` takes the step Thunder's torch executor takes on a
    copy (``assert_same_step``). The jitted model."""
    model = model.to(dtype)
    ours = thunder.jit(model, executors=[executor])
    torch.manual_seed(0)
    assert_same_step(ours, model, torch.randn(2, 8, 32, dtype=dtype))
    return ours


def run_mlp(activation, dtype=torch.float32, executor=any_size):
    return same_step_as_torch(MLP(activation), dtype, executor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("activation", [torch.nn.GELU(approximate="tanh"),
                                        by_hand(SQRT_2_OVER_PI, 0.044715)],
                         ids=["nn.GELU", "written-out"])
def test_tanh_gelu_moves_into_both_gemms_and_gradients_stay_equal(activation, dtype):
    ours = run_mlp(activation, dtype)
    assert fused_calls(ours) == ["fusecut_epilogues_any_size_linear_gelu_tanh",
                                 "fusecut_epilogues_any_size_matmul_dgelu_tanh"]
    # Nothing of GELU is left in a region: no tanh anywhere in either trace.
    for trace in (thunder.last_traces(ours)[-1], thunder.last_backward_traces(ours)[-1]):
        assert "tanh(" not in str(trace).replace("gelu_tanh(", "")


@pytest.mark.parametrize("activation", [torch.nn.GELU(), by_hand(SQRT_2_OVER_PI, 0.0447),
                                        by_hand(0.79788, 0.044715), torch.nn.Tanh()],
                         ids=["exact-erf-GELU", "wrong-cubic", "rounded-sqrt", "tanh"])
def test_anything_else_is_left_alone(activation):
    assert fused_calls(run_mlp(activation)) == []


def test_inference_fuses_the_forward_only():
    model = MLP(torch.nn.GELU(approximate="tanh"))
    jitted = thunder.jit(model, executors=[any_size])
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), model(x), atol=2e-5, rtol=2e-5)
    names = [b.sym.name for b in thunder.last_traces(jitted)[-1].bound_symbols]
    assert "fusecut_epilogues_any_size_linear_gelu_tanh" in names
    assert not any("dgelu" in n for n in names)


class Residual(torch.nn.Module):
    """``x + proj(x)``, or a variant where the projection has another use."""

    def __init__(self, reuse: bool = False, broadcast: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.reuse, self.broadcast = torch.nn.Linear(32, 32), reuse, broadcast

    def forward(self, x):
        y = self.proj(x)
        out = (x[:, :1] if self.broadcast else x) + y
        return out * y if self.reuse else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
# A broadcast residual folds too: the call takes the expanded view (and, not being dense,
# adds it unfused through torch).
@pytest.mark.parametrize(("variant", "folded"), [({}, True), ({"reuse": True}, False),
                                                 ({"broadcast": True}, True)],
                         ids=["residual", "projection-reused", "broadcast-residual"])
def test_residual_add_is_read_by_the_gemm_only_when_nothing_else_needs_the_product(
        variant, folded, dtype):
    ours = same_step_as_torch(Residual(**variant), dtype)
    names = [b.sym.name for b in thunder.last_traces(ours)[-1].bound_symbols]
    fused = "fusecut_epilogues_any_size_linear_residual"
    assert (fused in names) == folded
    # the GEMM runs once either way
    assert names.count(fused) + sum("linear" == n.split(".")[-1] for n in names) == 1


def test_gemms_below_the_size_threshold_stay_unfused():
    # 16 tokens x 128 bf16 outputs: far below fusecut_ex's 16 MiB, where the library call's host
    # time outweighs the pass it removes; the threshold at exactly this size fuses.
    assert fused_calls(run_mlp(torch.nn.GELU(approximate="tanh"), executor=fusecut_ex)) == []
    exact = FusecutExecutor("fusecut_epilogues_at_threshold", epilogue_min_bytes=16 * 128 * 4)
    assert len(fused_calls(run_mlp(torch.nn.GELU(approximate="tanh"), executor=exact))) == 2
    above = FusecutExecutor("fusecut_epilogues_above_threshold",
                            epilogue_min_bytes=16 * 128 * 4 + 1)
    assert fused_calls(run_mlp(torch.nn.GELU(approximate="tanh"), executor=above)) == []


def test_epilogues_can_be_switched_off():
    plain = FusecutExecutor("fusecut_plain_gemms", gemm_epilogues=False)
    assert fused_calls(run_mlp(torch.nn.GELU(approximate="tanh"), executor=plain)) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_nanogpt_block_runs_its_gelu_and_both_residuals_in_gemms(dtype):
    from benchmarks.models import blocks

    [module] = [m for name, m, _ in blocks(32, 8, dropout=False) if name == "nanogpt_block"]
    ours = same_step_as_torch(module, dtype)
    forward = [b.sym.name for b in thunder.last_traces(ours)[-1].bound_symbols]
    backward = [b.sym.name for b in thunder.last_backward_traces(ours)[-1].bound_symbols]
    prefix = "fusecut_epilogues_any_size_"
    assert forward.count(prefix + "linear_gelu_tanh") == 1
    assert forward.count(prefix + "linear_residual") == 2  # attention's and the MLP's
    assert backward.count(prefix + "matmul_dgelu_tanh") == 1
