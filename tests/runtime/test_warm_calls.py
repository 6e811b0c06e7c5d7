"""The warm path of ``fd.execute``: repeated calls do no planning and no compilation, and give
the reference's outputs (GPU tests marked gpu; the planning count also runs on the CPU path)."""

from __future__ import annotations

import threading

import pytest
import torch

import fusecut.engine
import fusecut.runtime.compile
from fusecut import DataType, FusionDefinition
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir import parse_text
from fusecut.runtime import launcher
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input
from tests.conftest import CORPUS
from tests.helpers import small_metas
from tests.runtime.test_gpu_kernels import close


class Counted:
    def __init__(self, monkeypatch, module, name):
        self.calls = 0
        real = getattr(module, name)

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, counted)


def definition(name: str, max_numel: int = 1 << 14, device: str = "cpu"):
    parsed = parse_text((CORPUS / f"{name}.py").read_text())
    metas = small_metas(parsed, max_numel)  # or full size, where the definition fixes it
    torch.manual_seed(0)
    return parsed.fusion, FusionDefinition.from_fusion(parsed.fusion), \
        [make_input(m, device) for m in metas]


def test_repeated_calls_plan_once_on_the_cpu_path(monkeypatch):
    planned = Counted(monkeypatch, fusecut.engine, "make_plan")
    fusion, fd, args = definition("layernorm_fwd")
    for _ in range(3):
        outs = fd.execute(args)
    assert planned.calls == 1
    close(outs, run_reference(fusion, args))
    # another shape of the same range (rows rounded up to a power of two): its range's plan,
    # rebound to it, no search (issue 44); a shape of another range: a search
    stats = fusecut.engine.default_engine().stats
    rebound = stats.plans_rebound
    fewer = [a[:-1] if a.dim() == 2 else a for a in args]
    close(fd.execute(fewer), run_reference(fusion, fewer))
    assert planned.calls == 1 and stats.plans_rebound == rebound + 1
    more = [torch.cat([a, a[:1]]) if a.dim() == 2 else a for a in args]
    close(fd.execute(more), run_reference(fusion, more))
    assert planned.calls == 2


def test_a_wrong_argument_is_named_not_run():
    _, fd, args = definition("softmax_fwd")
    fd.execute(args)
    with pytest.raises(InputError, match="dtype"):
        fd.execute([args[0].double()])


gpu = pytest.mark.gpu


@pytest.fixture
def native_built():
    module = launcher.native(wait=True)
    assert module is not None, launcher.failure()
    return module


@gpu
@pytest.mark.parametrize("name", ["softmax_fwd", "layernorm_fwd", "layernorm_bwd", "adam_step",
                                  "seed_2146_rmsnorm_bwd", "mlp_gelu", "gelu_tanh_fwd"])
def test_warm_calls_neither_plan_nor_compile(name, monkeypatch, native_built):
    fusion, fd, args = definition(name, device="cuda")
    first = fd.execute(args)
    planned = Counted(monkeypatch, fusecut.engine, "make_plan")
    built = Counted(monkeypatch, fusecut.engine, "compile_plan")
    compiled = Counted(monkeypatch, fusecut.runtime.compile, "_nvrtc")
    cached = fusecut.runtime.compile.STATS.memory_hits + fusecut.runtime.compile.STATS.disk_hits
    for _ in range(5):
        outs = fd.execute(args)
    assert (planned.calls, built.calls, compiled.calls) == (0, 0, 0)
    stats = fusecut.runtime.compile.STATS
    assert stats.memory_hits + stats.disk_hits == cached
    torch.cuda.synchronize()
    close(outs, run_reference(fusion, args), name)
    close(outs, first, name)
    program = fd.handle.programs()[0]
    assert program.native is not None  # C++ runs kernel and linear/matmul plans


@gpu
def test_python_and_native_paths_agree(monkeypatch, native_built):
    fusion, fd, args = definition("layernorm_bwd", device="cuda")
    native_outs = fd.execute(args)
    program = fd.handle.programs()[0]
    assert program.native is not None
    python_outs = program.run_python(args)
    torch.cuda.synchronize()
    for a, b in zip(native_outs, python_outs):
        assert torch.equal(a, b)


@gpu
def test_signature_changes_take_the_slow_path(native_built):
    fusion, fd, args = definition("softmax_fwd", device="cuda")
    fd.execute(args)
    x = args[0]
    others = [x[:-1].contiguous(),  # another shape
              torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape)
              .copy_(x)]  # misaligned for vector loads: the scalar kernel runs
    for other in others:
        (got,) = fd.execute([other])
        close([got], run_reference(fusion, [other]))
    (again,) = fd.execute(args)
    close([again], run_reference(fusion, args))
    assert len(fd.handle.programs()) == 3


@gpu
def test_runs_on_the_current_stream_and_threads(native_built):
    fusion, fd, args = definition("layernorm_fwd", max_numel=1 << 20, device="cuda")
    want = run_reference(fusion, args)
    fd.execute(args)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        outs = fd.execute(args)
    side.synchronize()
    close(outs, want)
    errors = []

    def worker():
        try:
            for _ in range(20):
                got = fd.execute(args)
            torch.cuda.synchronize()
            close(got, want)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@gpu
def test_scalar_inputs_change_without_replanning(monkeypatch, native_built):
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s1 = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, s1), dims=[1], keepdim=False))
    x = torch.randn(64, 256, device="cuda")
    fd.execute([x, 1.0])
    planned = Counted(monkeypatch, fusecut.engine, "make_plan")
    for factor in (2.0, -3.5):
        (got,) = fd.execute([x, factor])
        torch.testing.assert_close(got, (x * factor).sum(1), rtol=1e-5, atol=1e-4)
    assert planned.calls == 0


@gpu
def test_a_thread_with_no_current_context_compiles_and_launches_a_new_definition():
    # autograd's backward thread has no current driver context until its first CUDA runtime
    # call: a backward that starts with a fusecut region loads its module there (seen as
    # CUDA_ERROR_INVALID_CONTEXT in a Hugging Face GPT-2 step on the H200)
    from cuda.bindings import driver

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        # a constant no other test uses: a kernel this process has not loaded
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.exp(t0), 1.0 + 2.0 ** -19), dims=[1],
                                 keepdim=False))
    x = torch.randn(32, 96, device="cuda")
    torch.cuda.synchronize()
    seen: dict[str, object] = {}

    def worker():
        try:
            _, seen["context before"] = driver.cuCtxGetCurrent()
            (seen["out"],) = fd.execute([x])
            torch.cuda.synchronize()
        except Exception as e:  # reported below
            seen["error"] = e

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert int(seen["context before"]) == 0  # else this test does not test the fresh thread
    assert "error" not in seen, seen.get("error")
    torch.testing.assert_close(seen["out"], (torch.exp(x) * (1.0 + 2.0 ** -19)).sum(1),
                               rtol=1e-5, atol=1e-4)
