"""Generated kernels on a real GPU against the torch reference (marked gpu: skipped without one).

Every corpus case at its own sizes, random fusions over the vocabulary, odd sizes (not multiples
of the vector width, size-1 axes, empty tensors), non-contiguous and stride-0 inputs, tensors of
more than 2**31 elements, and the compile cache (a warm process never recompiles; a new process
reuses the disk cache).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings

from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import TensorMeta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.kernels import cuda_runner
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input
from tests.conftest import CORPUS, CORPUS_FILES
from tests.helpers import fusion
from tests.strategies import fusions

pytestmark = pytest.mark.gpu
DEV = "cuda"


def close(got, want, name=""):
    """Outputs match the reference: exactly for integers and bools; for floats within a few
    rounding errors of the output's scale (reductions sum in a different order)."""
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (name, k, a.shape, b.shape)
        assert a.dtype == b.dtype, (name, k)
        if a.dtype == torch.bool or not a.is_floating_point():
            assert torch.equal(a, b), (name, k)
            continue
        tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}.get(a.dtype, 1e-9)
        finite = b[torch.isfinite(b)]
        scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
        where = f"{name} output {k}"
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * scale,
                                   equal_nan=True, msg=lambda m, where=where: f"{where}: {m}")


def run_both(f, metas, seed=0, **options):
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2.0, **options))
    gen = torch.Generator(device=DEV).manual_seed(seed)
    args = [make_input(m, DEV, gen) for m in metas]
    got = execute_plan(plan, args, cuda_runner, "cuda").outputs
    want = run_reference(f, args)
    return plan, got, want


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus_full_size(path):
    parsed = parse_text(path.read_text())
    plan, got, want = run_both(parsed.fusion, parsed.inputs)
    close(got, want, path.stem)


@settings(max_examples=int(os.environ.get("FUSECUT_GPU_EXAMPLES", "150")), deadline=None)
@given(fusions(max_ops=10, extents=[1, 2, 3, 5, 8, 13, 16, 33, 64, 130]))
def test_random_fusions(drawn):
    plan, got, want = run_both(drawn.fusion, drawn.inputs)
    close(got, want, str([s.kind.value for s in plan.segments]))


NORM = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.ops.cast(T0, dtype=DataType.Float)
T2 = fd.ops.max(T1, dims=[1])
T3 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[0])
T4 = fd.ops.exp(fd.ops.sub(T1, T3))
T5 = fd.ops.sum(T4, dims=[1])
T6 = fd.ops.div(T4, fd.ops.broadcast_in_dim(T5, shape=T0.shape(), broadcast_dims=[0]))
fd.add_output(fd.ops.cast(T6, dtype=DataType.BFloat16))
fd.add_output(T5)
"""
REDUCE_COLS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.sum(fd.ops.mul(T0, T0), dims=[0])
T2, T3 = fd.ops.var_mean(T0, dims=[0], correction=1, keepdim=False)
fd.add_output(T1)
fd.add_output(T2)
fd.add_output(T3)
"""
REDUCE_ROWS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[1])
T2 = fd.ops.max(T0, dims=[1])
T3, T4 = fd.ops.var_mean(T0, dims=[1], correction=0, keepdim=False)
fd.add_output(T1)
fd.add_output(T2)
fd.add_output(T3)
fd.add_output(T4)
"""
POINTWISE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1])
T3 = fd.ops.mul(fd.ops.cast(T0, dtype=DataType.Float), fd.ops.cast(T2, dtype=DataType.Float))
fd.add_output(fd.ops.cast(fd.ops.tanh(T3), dtype=DataType.BFloat16))
"""


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (5, 1000), (1000, 5), (7, 4099),
                                       (130, 2050), (2, 70000), (0, 16), (16, 0)])
def test_odd_sizes(rows, cols):
    for body, dtype in ((NORM, DType.bfloat16), (REDUCE_COLS, DType.float32),
                        (REDUCE_ROWS, DType.float32)):
        f = fusion(body)
        _, got, want = run_both(f, [tensor_meta((rows, cols), dtype)])
        close(got, want, f"{rows}x{cols}")
    f = fusion(POINTWISE)
    _, got, want = run_both(f, [tensor_meta((rows, cols), DType.bfloat16),
                                tensor_meta((cols,), DType.bfloat16)])
    close(got, want, f"pointwise {rows}x{cols}")


@pytest.mark.parametrize("rows,cols", [(4096, 4096), (3, 70000), (70000, 3), (9, 1)])
def test_variance_when_the_mean_dwarfs_the_spread(rows, cols):
    """var_mean accumulates shifted data: 1000 + 0.01 * noise must give the noise's variance
    (a naive sum of squares would lose it to cancellation), across rows and across columns."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    x = 1000.0 + 0.01 * torch.randn(rows, cols, device=DEV, generator=gen)
    for body in (REDUCE_ROWS, REDUCE_COLS):
        f = fusion(body)
        plan = make_plan(f, [tensor_meta((rows, cols), DType.float32)],
                         PlanOptions(time_limit_s=2.0))
        got = execute_plan(plan, [x], cuda_runner, "cuda").outputs
        dim, correction = (1, 0) if body is REDUCE_ROWS else (0, 1)
        var, mean = torch.var_mean(x.double(), dim=dim, correction=correction)
        got_var, got_mean = (got[2], got[3]) if body is REDUCE_ROWS else (got[1], got[2])
        torch.testing.assert_close(got_mean.double(), mean, rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(got_var.double(), var, rtol=2e-3, atol=1e-7,
                                   equal_nan=True)


def test_non_contiguous_and_stride_zero_inputs():
    f = fusion(POINTWISE)
    transposed = TensorMeta((64, 48), (1, 64), DType.bfloat16)
    expanded = TensorMeta((48,), (0,), DType.bfloat16)
    _, got, want = run_both(f, [transposed, expanded])
    close(got, want, "transposed")
    g = fusion(NORM.replace("contiguity=[True, True]", "contiguity=[True, False]"))
    strided = TensorMeta((40, 300), (600, 2), DType.bfloat16)
    _, got, want = run_both(g, [strided])
    close(got, want, "strided rows")


MERGED = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1, 2])
fd.add_output(fd.ops.add(T0, T2))
fd.add_output(fd.ops.neg(T0))
"""


@pytest.mark.parametrize("shape", [(4, 6, 10), (3, 1, 7), (1, 7, 9), (5, 3, 1), (2, 3, 4099),
                                   (130, 1, 2)])
def test_merged_axes(shape):
    """Axes 1 and 2 share one index (T1 is broadcast along axis 0 only), with unit axes, odd
    extents, and an expanded (stride-0) T1 that keeps the axes apart."""
    f = fusion(MERGED)
    _, got, want = run_both(f, [tensor_meta(shape, DType.float32),
                                tensor_meta(shape[1:], DType.float32)])
    close(got, want, f"merged {shape}")
    expanded = TensorMeta(shape[1:], (0, 1), DType.float32)
    _, got, want = run_both(f, [tensor_meta(shape, DType.float32), expanded])
    close(got, want, f"merged {shape}, expanded rows")


def test_misaligned_inputs_fall_back_to_scalar_loads():
    f = fusion(POINTWISE)
    plan = make_plan(f, [tensor_meta((32, 64), DType.bfloat16),
                         tensor_meta((64,), DType.bfloat16)])
    base = torch.randn(32 * 64 + 1, device=DEV).to(torch.bfloat16)
    x = base[1:].view(32, 64)  # 2-byte offset: not 16-byte aligned
    w = torch.randn(64, device=DEV).to(torch.bfloat16)
    got = execute_plan(plan, [x, w], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [x, w]), "misaligned")


@pytest.mark.slow
def test_more_than_2_31_elements():
    n = 2**31 + 64
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T1 = fd.ops.neg(fd.ops.cast(T0, dtype=DataType.Float))
fd.add_output(fd.ops.cast(T1, dtype=DataType.BFloat16))
""")
    plan = make_plan(f, [tensor_meta((n,), DType.bfloat16)])
    x = torch.empty(n, dtype=torch.bfloat16, device=DEV)
    x[: 1 << 20].normal_()
    x[-(1 << 20):].normal_()
    (y,) = execute_plan(plan, [x], cuda_runner, "cuda").outputs
    assert torch.equal(y[-(1 << 20):], -x[-(1 << 20):])
    assert torch.equal(y[: 1 << 20], -x[: 1 << 20])
    del x, y
    torch.cuda.empty_cache()
    rows = (2**31) // 1024 + 3
    g = fusion(REDUCE_ROWS.replace("DataType.Float", "DataType.BFloat16"))
    meta = tensor_meta((rows, 1024), DType.bfloat16)
    plan = make_plan(g, [meta])
    x = torch.randn(rows, 1024, device=DEV).to(torch.bfloat16)
    got = execute_plan(plan, [x], cuda_runner, "cuda").outputs
    close(got, run_reference(g, [x]), "2**31 rows")


def test_warm_process_never_recompiles(tmp_path, monkeypatch):
    import fusecut.runtime.compile as rc

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    rc.clear_memory_cache()
    parsed = parse_text((CORPUS / "softmax_bwd.py").read_text())
    metas = [tensor_meta((256, 4096), DType.bfloat16)] * 2
    plan = make_plan(parsed.fusion, metas)
    args = [make_input(m, DEV) for m in metas]
    before = rc.STATS.compiles
    execute_plan(plan, args, cuda_runner, "cuda")
    first = rc.STATS.compiles - before
    execute_plan(plan, args, cuda_runner, "cuda")
    assert rc.STATS.compiles - before == first  # the second run compiled nothing
    code = ("import fusecut.runtime.compile as rc, torch\n"
            "from fusecut import load\nfrom fusecut.optimizer.planner import make_plan\n"
            "from fusecut.optimizer.ir import tensor_meta\n"
            "from fusecut.optimizer.ir.dtypes import DType\n"
            "from fusecut.runtime.executor import execute_plan\n"
            "from fusecut.runtime.kernels import cuda_runner\n"
            "from fusecut.runtime.tensors import make_input\n"
            f"p = load({str(CORPUS / 'softmax_bwd.py')!r})\n"
            "m = [tensor_meta((256, 4096), DType.bfloat16)] * 2\n"
            "plan = make_plan(p.fusion, m)\n"
            "execute_plan(plan, [make_input(x, 'cuda') for x in m], cuda_runner, 'cuda')\n"
            "print(rc.STATS.compiles, rc.STATS.disk_hits)\n")
    env = dict(os.environ, FUSECUT_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    compiles, disk_hits = map(int, out.stdout.split())
    assert compiles == 0 and disk_hits >= 1


def test_bound_metadata_checked():
    f = fusion(POINTWISE)
    plan = make_plan(f, [tensor_meta((8, 16), DType.bfloat16), tensor_meta((16,), DType.bfloat16)])
    x = torch.randn(8, 32, device=DEV).to(torch.bfloat16)
    with pytest.raises(Exception, match="plan was made for"):
        execute_plan(plan, [x, torch.randn(32, device=DEV).to(torch.bfloat16)], cuda_runner)


def test_scalar_inputs_are_kernel_parameters():
    from fusecut.optimizer.ir.inputs import ScalarMeta

    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Double)
S2 = fd.ops.mul(S1, 2.0)
T3 = fd.ops.mul(T0, S2)
fd.add_output(T3)
""")
    plan = make_plan(f, [tensor_meta((1000,), DType.float32), ScalarMeta(DType.float64, 0.5)])
    x = torch.randn(1000, device=DEV)
    for v in (0.5, -3.0):  # one kernel, any value: scalar inputs are not compiled in
        (y,) = execute_plan(plan, [x, v], cuda_runner, "cuda").outputs
        torch.testing.assert_close(y, x * (2 * v))


# ---- tiled transpose and grouped normalization --------------------------------------------------

TRANSPOSE_ADD = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.{dt})
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.{dt})
T2 = fd.ops.permute(T1, dims=[1, 0])
T3 = fd.ops.add(fd.ops.cast(T0, dtype=DataType.Float), fd.ops.cast(T2, dtype=DataType.Float))
fd.add_output(fd.ops.cast(T3, dtype=DataType.{dt}))
fd.add_output(fd.ops.permute(T3, dims=[1, 0]))
"""


def _tiled(plan) -> bool:
    from fusecut.codegen import generate_segment

    return any(generate_segment(plan, s).notes.get("scheme") == "transpose"
               for s in plan.segments if s.kind.value == "pointwise")


@pytest.mark.parametrize("dt", ["BFloat16", "Float", "Double"])
@pytest.mark.parametrize("rows,cols", [(64, 48), (33, 130), (130, 33), (1000, 17), (257, 4099),
                                       (4096, 2048)])
def test_transpose_add_through_tiles(dt, rows, cols):
    """Tiles cut by the edges (odd extents, a 17-long axis), widths that forbid vectors, both
    a staged input and an output written through a tile."""
    f = fusion(TRANSPOSE_ADD.format(dt=dt))
    dtype = {"BFloat16": DType.bfloat16, "Float": DType.float32, "Double": DType.float64}[dt]
    plan, got, want = run_both(f, [tensor_meta((rows, cols), dtype),
                                   tensor_meta((cols, rows), dtype)])
    assert _tiled(plan)
    close(got, want, f"transpose {dt} {rows}x{cols}")


def test_tiled_permutes_of_three_axes_and_cat_of_a_transpose():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.exp(T0)
fd.add_output(T1)
fd.add_output(fd.ops.permute(T1, dims=[0, 2, 1]))
fd.add_output(fd.ops.permute(T0, dims=[2, 1, 0]))
""")
    for shape in [(3, 100, 70), (2, 33, 65), (40, 17, 129)]:
        plan, got, want = run_both(f, [tensor_meta(shape, DType.float32)])
        assert _tiled(plan)
        close(got, want, f"permutes {shape}")
    g = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T2 = fd.ops.permute(T0, dims=[1, 0])
fd.add_output(fd.ops.cat([T2, T1], dim=0))
fd.add_output(fd.ops.cat([T1, T2], dim=0))
""")
    for a, b in [((512, 256), (128, 512)), ((50, 30), (7, 50))]:
        plan, got, want = run_both(g, [tensor_meta(a, DType.bfloat16),
                                       tensor_meta(b, DType.bfloat16)])
        assert _tiled(plan)
        close(got, want, f"cat {a} {b}")


def test_tiled_transpose_of_misaligned_inputs():
    f = fusion(TRANSPOSE_ADD.format(dt="BFloat16"))
    metas = [tensor_meta((256, 128), DType.bfloat16), tensor_meta((128, 256), DType.bfloat16)]
    plan = make_plan(f, metas)
    base = torch.randn(128 * 256 + 1, device=DEV).to(torch.bfloat16)
    y = base[1:].view(128, 256)  # not 16-byte aligned: regenerated without vectors
    x = torch.randn(256, 128, device=DEV).to(torch.bfloat16)
    got = execute_plan(plan, [x, y], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [x, y]), "misaligned transpose")


def group_norm(n: int, c: int, length: int, groups: int) -> str:
    return f"""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T2 = fd.ops.reshape(T0, new_shape=[{n}, {groups}, {c // groups}, {length}])
T3 = fd.ops.cast(T2, dtype=DataType.Float)
T4, T5 = fd.ops.var_mean(T3, dims=[2, 3], correction=0, keepdim=False)
T6 = fd.ops.broadcast_in_dim(T5, shape=T2.shape(), broadcast_dims=[0, 1])
T7 = fd.ops.broadcast_in_dim(fd.ops.rsqrt(fd.ops.add(T4, 1e-5)), shape=T2.shape(),
                             broadcast_dims=[0, 1])
T8 = fd.ops.mul(fd.ops.sub(T3, T6), T7)
T9 = fd.ops.reshape(T8, new_shape=T0.shape())
T10 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1])
T11 = fd.ops.mul(T9, fd.ops.cast(T10, dtype=DataType.Float))
fd.add_output(fd.ops.cast(T11, dtype=DataType.BFloat16))
fd.add_output(T5)
"""


@pytest.mark.parametrize("n,c,length,groups", [(4, 48, 32, 8), (3, 30, 7, 5), (2, 64, 4099, 32),
                                               (1, 6, 1, 3), (16, 320, 4096, 32),
                                               (6, 64, 1024, 4), (3, 96, 2050, 6),
                                               (2, 60, 1023, 2)])
def test_group_norm_in_one_kernel(n, c, length, groups):
    """Rows in registers, and long rows streamed through shared memory (by bulk copies, by
    per-thread copies, and read directly when a row's vectors cannot be copied)."""
    f = fusion(group_norm(n, c, length, groups))
    plan, got, want = run_both(f, [tensor_meta((n, c, length), DType.bfloat16),
                                   tensor_meta((c,), DType.bfloat16)])
    assert [s.kind.value for s in plan.segments] == ["normalization"]
    close(got, want, f"group norm {n}x{c}x{length} / {groups}")


@pytest.mark.parametrize("shape", [(8, 16, 64), (5, 7, 33), (16, 64, 1024)])
def test_rows_that_skip_the_kept_axis(shape):
    """Batch-norm style rows: each channel's [N, L] values."""
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1, T2 = fd.ops.var_mean(T0, dims=[0, 2], correction=0, keepdim=False)
T3 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[1])
T4 = fd.ops.broadcast_in_dim(fd.ops.rsqrt(fd.ops.add(T1, 1e-5)), shape=T0.shape(),
                             broadcast_dims=[1])
fd.add_output(fd.ops.mul(fd.ops.sub(T0, T3), T4))
""")
    plan, got, want = run_both(f, [tensor_meta(shape, DType.float32)])
    assert [s.kind.value for s in plan.segments] == ["normalization"]
    close(got, want, f"batch-norm rows {shape}")
