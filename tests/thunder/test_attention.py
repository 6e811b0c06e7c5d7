"""fusecut's cuDNN attention for Thunder (issue 30): torch's own cuDNN SDPA kernels behind a Thunder
operator with a grad transform, listed first by ``fusecut.thunder.executors()`` where cuDNN's
fused attention exists.

On the CPU: which calls it claims, and where it stands in the executor list. On the GPU: a bf16
training step's gradients against the fp32 step, the traces naming its operators, and cuDNN's
kernels in the profile.
"""

from __future__ import annotations

import pytest
import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx

import fusecut.thunder
import fusecut.thunder.attention as attention
from benchmarks.whole_models import Size
from fusecut.thunder.executor import thunder
from tests.thunder.test_cudnn_attention import Named, gradient_error
from tests.thunder.test_thunder_executor import block

OPERATORS = {"fusecut_cudnn_attention_forward", "fusecut_cudnn_attention_backward",
             "fusecut_cudnn_attention"}


@pytest.fixture
def cudnn_here(monkeypatch):
    monkeypatch.setattr(attention, "cudnn_attention_available", lambda: True)


def proxy(shape, dtype=dtypes.bfloat16, device="cuda:0"):
    return TensorProxy(shape=shape, dtype=dtype, device=devices.Device(device),
                       requires_grad=True)


def test_it_claims_dense_half_precision_attention_on_cuda_only(cudnn_here):
    with tracectx(TraceCtx()):
        q = proxy((2, 4, 64, 64))
        assert attention.claims(q, proxy((2, 4, 64, 64)), proxy((2, 4, 64, 64)), is_causal=True)
        assert attention.claims(q, proxy((2, 4, 32, 64)), proxy((2, 4, 32, 64)))  # cross
        refused = {
            "a mask": (q, q, q, proxy((2, 4, 64, 64))),
            "dropout": (q, q, q, None, 0.1),
            "the CPU": (proxy((2, 4, 64, 64), device="cpu"),) * 3,
            "fp32": (proxy((2, 4, 64, 64), dtypes.float32),) * 3,
            "mixed dtypes": (q, proxy((2, 4, 64, 64), dtypes.float16), q),
            "3-d": (proxy((8, 64, 64)),) * 3,
            "grouped heads": (q, proxy((2, 2, 64, 64)), proxy((2, 2, 64, 64))),
            "head size 60": (proxy((2, 4, 64, 60)),) * 3,
            "head size 256": (proxy((2, 4, 64, 256)),) * 3,
            "a causal rectangle": (q, proxy((2, 4, 32, 64)), proxy((2, 4, 32, 64)), None, 0.0,
                                   True),
        }
        for why, args in refused.items():
            assert not attention.claims(*args), why


def test_without_cudnn_attention_it_claims_nothing_and_is_not_listed(monkeypatch):
    monkeypatch.setattr(attention, "cudnn_attention_available", lambda: False)
    with tracectx(TraceCtx()):
        q = proxy((2, 4, 64, 64))
        assert not attention.claims(q, q, q)
    assert "fusecut_attention" not in [e.name for e in fusecut.thunder.executors()]


def test_listed_first_where_cudnn_attention_exists(cudnn_here, monkeypatch):
    listed = (Named("cudnn"), Named("sdpa"), Named("nvfuser"))
    monkeypatch.setattr(thunder, "get_default_executors", lambda: listed)
    assert [e.name for e in fusecut.thunder.executors(cross_entropy=False)] == [
        "fusecut_attention", "sdpa", "fusecut"]
    assert [e.name for e in fusecut.thunder.executors(attention=False)] == [
        "fusecut_cross_entropy", "sdpa", "fusecut"]


def test_a_cpu_model_keeps_its_attention_on_sdpa_or_torch(cudnn_here):
    model = block(seed=3)
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch.testing.assert_close(ours(x), model(x))
    names = {b.sym.name for b in thunder.last_traces(ours)[-1].bound_symbols}
    assert not names & OPERATORS


def attention_runs(jitted) -> set[str]:
    traces = [thunder.last_traces(jitted)[-1]]
    try:
        traces.append(thunder.last_backward_traces(jitted)[-1])
    except Exception:
        pass
    return {b.sym.name for t in traces for b in t.bound_symbols} & OPERATORS


@pytest.mark.gpu
@pytest.mark.skipif(not attention.cudnn_attention_available(), reason="no cuDNN attention here")
def test_a_bf16_training_step_trains_on_cudnn_attention():
    size = Size(layers=2, width=128, heads=2, kv_heads=2, vocab=200, max_seq=128)
    ours = gradient_error(fusecut.thunder.executors(), size, 128)
    sdpa = gradient_error(fusecut.thunder.executors(attention=False), size, 128)
    assert ours < 0.05 and ours < 3 * max(sdpa, 0.01), f"cuDNN {ours:.3g}, SDPA {sdpa:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not attention.cudnn_attention_available(), reason="no cuDNN attention here")
def test_attention_runs_on_cudnn_forward_backward_and_inference():
    model = block(seed=5).to("cuda", torch.bfloat16)
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    x = torch.randn(2, 16, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ours(x).float().sum().backward()
        torch.cuda.synchronize()
    assert attention_runs(ours) == {"fusecut_cudnn_attention_forward",
                                    "fusecut_cudnn_attention_backward"}
    kernels = [e.key for e in prof.key_averages()]
    assert any("cudnn" in k.lower() or "sdpa" in k.lower() for k in kernels), kernels
    assert not any("flash" in k.lower() and "cudnn" not in k.lower() for k in kernels), kernels

    served = thunder.jit(model, executors=fusecut.thunder.executors())
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x), atol=2e-2, rtol=2e-2)
    assert attention_runs(served) == {"fusecut_cudnn_attention"}
