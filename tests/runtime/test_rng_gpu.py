"""Random numbers and 8-bit floats on the GPU: generated kernels equal the torch reference (and
the CPU), their numbers pass statistical tests, and fp8 casts match torch's.

Run with ``pytest -s -m gpu tests/runtime/test_rng_gpu.py`` to see the measured statistics.
"""

from __future__ import annotations

import math

import pytest
import torch

from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.kernels import cuda_runner
from fusecut.runtime.reference import run_reference
from tests.helpers import fusion
from tests.runtime.test_rng import DROPOUT, RECOMPUTED, SOFTMAX_DROPOUT

pytestmark = pytest.mark.gpu
DEV = "cuda"
N_STATS = 1 << 22  # samples per statistical test (>= 1e6)
KS_CRITICAL = 1.63  # / sqrt(n): Kolmogorov-Smirnov at alpha 0.01


def _random_fusion(name: str, dtype: str, a: float, b: float) -> object:
    return fusion(f"""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
S2 = fd.define_scalar(None, dtype=DataType.Int)
T3 = fd.ops.{name}({a}, {b}, shape=T0.shape(), dtype=DataType.{dtype}, rng_seed=S1, rng_offset=S2)
fd.add_output(T3)
""")


def _run(f, shape, seed, offset, dtype=DType.float32):
    metas = [tensor_meta(shape, dtype), ScalarMeta(DType.int64, seed),
             ScalarMeta(DType.int64, offset)]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    args = [torch.zeros(shape, device=DEV).to(torch.float32), seed, offset]
    got = execute_plan(plan, args, cuda_runner, "cuda").outputs
    return plan, got, run_reference(f, args), run_reference(f, [args[0].cpu(), seed, offset])


@pytest.mark.parametrize("shape", [(3, 1001), (1, 7), (64, 4096), (5, 8)])
@pytest.mark.parametrize("dtype", ["Float", "Half", "BFloat16", "Double"])
def test_uniform_kernel_equals_the_reference_exactly(shape, dtype):
    f = _random_fusion("uniform", dtype, -2.0, 3.0)
    plan, got, want, cpu = _run(f, shape, 1234, 7)
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    assert torch.equal(got[0], want[0]) and torch.equal(got[0].cpu(), cpu[0])


@pytest.mark.parametrize("shape", [(3, 1001), (64, 4096)])
@pytest.mark.parametrize("dtype", ["Float", "Half", "Double"])
def test_normal_kernel_equals_the_reference(shape, dtype):
    """Box-Muller goes through log, sin and cos: equal up to their last bits (of the larger of
    mean and std * z: the sum cancels where they are close)."""
    f = _random_fusion("normal", dtype, 1.0, 2.0)
    _, got, want, cpu = _run(f, shape, 99, 3)
    x, y, z = got[0].double(), want[0].double().to(DEV), cpu[0].double().to(DEV)
    ulp = {"Float": 2.0 ** -23, "Half": 2.0 ** -10, "Double": 2.0 ** -52}[dtype]
    bound = 4 if dtype == "Double" else 2  # double: GPU and CPU libm differ in the last bit
    for ref in (y, z):
        err = ((x - ref).abs() / ((ref - 1.0).abs() + 1.0)).max().item()
        assert err <= bound * ulp, (dtype, err / ulp)
    exact = (x == z).double().mean().item()
    print(f"\nnormal {dtype} {shape}: kernel == CPU reference for {exact:.6f} of the elements, "
          f"at most {err / ulp:.2f} ulp apart")


def _ks_statistic(x: torch.Tensor, cdf) -> float:
    s, _ = torch.sort(x.double())
    n = s.numel()
    f = cdf(s)
    i = torch.arange(1, n + 1, device=s.device, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


@pytest.mark.parametrize("name,dtype", [("uniform", "Float"), ("uniform", "Double"),
                                        ("normal", "Float"), ("normal", "Double")])
def test_statistics_of_a_million_samples(name, dtype):
    f = _random_fusion(name, dtype, 0.0, 1.0)
    _, got, _, _ = _run(f, (N_STATS // 1024, 1024), 2026, 0)
    x = got[0].double().reshape(-1)
    n = x.numel()
    mean, var = x.mean().item(), x.var().item()
    if name == "uniform":
        want_mean, want_var = 0.5, 1 / 12
        fourth = 1 / 80  # E[(x - 1/2)^4]
        cdf = lambda s: s.clamp(0, 1)  # noqa: E731
    else:
        want_mean, want_var, fourth = 0.0, 1.0, 3.0
        cdf = lambda s: 0.5 * (1 + torch.erf(s / math.sqrt(2)))  # noqa: E731
    d = _ks_statistic(x, cdf)
    critical = KS_CRITICAL / math.sqrt(n)
    print(f"\n{name} {dtype}: n={n} mean={mean:.6f} (want {want_mean}) var={var:.6f} "
          f"(want {want_var:.6f}) KS D={d:.6f} (critical {critical:.6f})")
    assert abs(mean - want_mean) < 5 * math.sqrt(want_var / n)
    assert abs(var - want_var) < 5 * math.sqrt((fourth - want_var ** 2) / n)
    assert d < critical


def test_different_offsets_and_seeds_are_different_streams():
    f = _random_fusion("uniform", "Float", 0.0, 1.0)
    shape = (256, 1024)
    base = _run(f, shape, 5, 0)[1][0]
    assert torch.equal(base, _run(f, shape, 5, 0)[1][0])
    for seed, offset in ((5, 1), (6, 0), (5, 1 << 40)):
        other = _run(f, shape, seed, offset)[1][0]
        same = (other == base).double().mean().item()
        corr = torch.corrcoef(torch.stack([base.reshape(-1), other.reshape(-1)]))[0, 1].item()
        print(f"\nseed {seed} offset {offset}: equal fraction {same:.2e}, correlation {corr:.2e}")
        assert same < 1e-4 and abs(corr) < 5 / math.sqrt(base.numel())


@pytest.mark.parametrize("body,shape,scalars", [(DROPOUT, (512, 4096), (7, 0)),
                                                (SOFTMAX_DROPOUT, (256, 1000), (7, 3)),
                                                (RECOMPUTED, (33, 130), (9,))])
def test_dropout_kernels_equal_the_reference(body, shape, scalars):
    f = fusion(body)
    metas = [tensor_meta(shape, DType.float32)] + [ScalarMeta(DType.int64, s) for s in scalars]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    args = [torch.randn(shape, device=DEV), *scalars]
    got = execute_plan(plan, args, cuda_runner, "cuda").outputs[0]
    want = run_reference(f, args)[0]
    if body is SOFTMAX_DROPOUT:  # reductions sum in another order: the mask must agree
        assert torch.equal(got == 0, want == 0)
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)
    if body is DROPOUT:
        kept = (got != 0).double().mean().item()
        print(f"\ndropout p=0.1 on {shape}: kept {kept:.5f}")
        assert abs(kept - 0.9) < 5 * math.sqrt(0.09 / got.numel())


# ---- fp8 ---------------------------------------------------------------------------------------

FP8_TYPES = {"Float8_e4m3fn": torch.float8_e4m3fn, "Float8_e5m2": torch.float8_e5m2}
FP8_DTYPES = {"Float8_e4m3fn": DType.float8_e4m3fn, "Float8_e5m2": DType.float8_e5m2}


def _cast_kernel(src: str, dst: str, src_dtype: DType, x: torch.Tensor) -> torch.Tensor:
    f = fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{src})
T1 = fd.ops.cast(T0, dtype=DataType.{dst})
fd.add_output(T1)
""")
    plan = make_plan(f, [tensor_meta(tuple(x.shape), src_dtype)])
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    return execute_plan(plan, [x], cuda_runner, "cuda").outputs[0]


def _same_floats(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal bits, or both NaN."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())


@pytest.mark.parametrize("name", list(FP8_TYPES))
def test_fp8_to_float_over_all_256_bit_patterns(name):
    bits = torch.arange(256, dtype=torch.int32, device=DEV).to(torch.uint8)
    x = bits.view(FP8_TYPES[name])
    got = _cast_kernel(name, "Float", FP8_DTYPES[name], x)
    assert _same_floats(got, x.float()).all()
    assert _same_floats(got.cpu(), x.cpu().float()).all()


def _float_sweep() -> torch.Tensor:
    """Every float16 value (subnormals, inf, NaN), random float32s over a wide range, and the
    fp8 formats' edges and midpoints."""
    halves = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(1 << 16, generator=gen) * torch.exp2(torch.randint(-30, 30, (1 << 16,),
                                                                          generator=gen).float())
    edges = torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 464.01, 470.0, 479.99, 480.0, 1e4,
                          57344.0, 61439.0, 61440.0, 65535.0, 65536.0, 1e30, 3.4e38,
                          2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10,
                          2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 1.5 * 2.0 ** -17, 1e-45,
                          float("inf"), float("nan")])
    sub = torch.tensor([1, 2, 3, 0x7FFFFF], dtype=torch.int32).view(torch.float32)
    x = torch.cat([halves, wide, edges, sub])
    return torch.cat([x, -x]).to(DEV)


@pytest.mark.parametrize("name", list(FP8_TYPES))
def test_float_to_fp8_matches_torch(name):
    x = _float_sweep()
    dt = FP8_TYPES[name]
    got = _cast_kernel("Float", name, DType.float32, x).view(torch.uint8)
    cpu = x.cpu().to(dt).view(torch.uint8).to(DEV)  # torch's c10 conversion
    gpu = x.to(dt).view(torch.uint8)  # torch's CUDA cast kernel
    nan = (got & 0x7F) == 0x7F
    assert torch.equal(nan[x.isnan()], torch.ones_like(nan[x.isnan()]))
    finite = ~x.isnan()
    print(f"\n{name}: {x.numel()} floats; kernel != torch CPU at "
          f"{int((got != cpu)[finite].sum())}, != torch CUDA at {int((got != gpu)[finite].sum())}")
    # e4m3 past 448: +-448 on torch >= 2.12, NaN before (runtime.compile.defines matches it)
    assert torch.equal(got[finite], gpu[finite]) and torch.equal(got[finite], cpu[finite])
    back = _cast_kernel(name, "Float", FP8_DTYPES[name], got.view(dt))
    assert _same_floats(back, got.view(dt).float()).all()


def test_double_to_fp8_goes_through_float_as_torch_does():
    x = _float_sweep().double() * (1 + 2.0 ** -30)  # between floats: rounded twice
    got = _cast_kernel("Double", "Float8_e5m2", DType.float64, x).view(torch.uint8)
    want = x.cpu().to(torch.float8_e5m2).view(torch.uint8).to(DEV)
    finite = ~x.isnan()
    assert torch.equal(got[finite], want[finite])


# ---- unseeded random ops draw from torch's CUDA generator (issue 18, item 6) ------------------


def test_unseeded_random_ops_draw_from_the_cuda_generator():
    """Consecutive calls differ, manual_seed reproduces, the generator's Philox offset moves by
    4 per op (nvFuser's increment), and the numbers are the hand-seeded fusion's with the
    generator's seed and offsets ``offset / 4 + j`` - on the planned path and the warm one."""
    from fusecut import FusionDefinition
    from tests.runtime.test_rng import SEEDED_BY_HAND, UNSEEDED

    fd = FusionDefinition.from_fusion(fusion(UNSEEDED))
    x = torch.randn(64, 1000, device=DEV)
    gen = torch.cuda.default_generators[x.device.index]
    torch.manual_seed(99)
    seed, start = gen.initial_seed(), gen.get_offset()
    calls = [fd.execute([x]) for _ in range(4)]  # the first plans; the others are warm calls
    assert gen.get_offset() == start + 4 * 2 * len(calls)
    for k, outs in enumerate(calls):
        offset = start + 8 * k
        want = run_reference(fusion(SEEDED_BY_HAND), [x, seed, offset // 4, offset // 4 + 1])
        assert torch.equal(outs[0], want[0])
        assert torch.allclose(outs[1], want[1], rtol=0, atol=1e-5)
    assert not torch.equal(calls[1][0], calls[2][0])
    torch.manual_seed(99)
    again = fd.execute([x])
    assert torch.equal(again[0], calls[0][0]) and torch.equal(again[1], calls[0][1])
    torch.cuda.manual_seed(7)
    torch.randn(1000, device=DEV)  # torch's own draws move the same offset
    before = gen.get_offset()
    assert before > 0
    fd.execute([x])
    assert gen.get_offset() == before + 8
