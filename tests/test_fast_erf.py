"""``fc_erf_fast``: the erf a kernel computes where the result reaches only 16-bit outputs
(``codegen.precision``). Its error over a float32 sweep, in ulp of float32, from the generated
kernel itself: compiled as C++ and run on the host (``tests.host_kernels``), and on the GPU,
where its 2^x is the special-function unit's. And where codegen uses it, and where not.
"""

from __future__ import annotations

import pytest
import torch

import codegen.pointwise
from codegen import generate_segment
from codegen.precision import fast_math_tensors
from optimizer.ir.dtypes import DType
from optimizer.ir.inputs import tensor_meta
from optimizer.planner import PlanOptions, make_plan
from tests.helpers import fusion
from tests.host_kernels import run_on_host

MAX_ULP = 3  # the bound fc_erf_fast's comment states


def erf_fusion(out_dtype: str):
    return fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.ops.erf(T0)
T2 = fd.ops.cast(T1, dtype=DataType.{out_dtype})
fd.add_output(T2)
""")


def sweep() -> torch.Tensor:
    """Float32 values across erf's shapes: dense over [-5, 5] (both fits, the switch between
    them at 0.75, the clamp at 4), tiny and subnormal magnitudes, and the edges."""
    dense = torch.linspace(-5, 5, 1_000_001, dtype=torch.float64)
    tiny = torch.logspace(-44, 0, 4001, dtype=torch.float64)
    near = torch.tensor([0.75, 4.0], dtype=torch.float64)
    near = torch.cat([near, torch.nextafter(near.float(), torch.tensor(0.0)).double()])
    edges = torch.tensor([0.0, 1e30, float("inf")], dtype=torch.float64)
    x = torch.cat([dense, tiny, near, edges]).float()
    return torch.cat([x, -x])


def ulp_errors(got: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|got - erf(x)| in units of the float32 spacing at the true value."""
    true = torch.erf(x.double())
    spacing = (torch.nextafter(true.abs().float(), torch.tensor(float("inf"))).double()
               - true.abs().float().double())
    return (got.double() - true).abs() / spacing


@pytest.fixture
def forced_fast(monkeypatch):
    """Fast math for every op that has a fast form: a float32 output then shows fc_erf_fast's
    own values, which a 16-bit output would round away."""
    from codegen.precision import FAST_OPS

    def every_fast_op(bound, schedule):
        ops = [bound.fusion.ops[i] for i in schedule.ops]
        return frozenset(op.outputs[0] for op in ops if op.name in FAST_OPS)

    monkeypatch.setattr(codegen.pointwise, "fast_math_tensors", every_fast_op)
    import runtime.kernels

    runtime.kernels._code.clear()
    yield
    runtime.kernels._code.clear()


def erf_kernel(n: int):
    f = erf_fusion("Float")
    plan = make_plan(f, [tensor_meta((n,), DType.float32)], PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    sk = generate_segment(plan, seg)
    assert "fc_erf_fast(" in sk.source
    return f, plan, sk


def assert_within_bound(got: torch.Tensor, x: torch.Tensor) -> None:
    finite = ~x.isnan()
    errors = ulp_errors(got[finite], x[finite])
    worst = int(errors.argmax())
    assert errors.max() <= MAX_ULP, (
        f"erf({x[finite][worst].item()!r}) = {got[finite][worst].item()!r}, "
        f"{errors.max().item():.2f} ulp from {torch.erf(x[finite][worst].double()).item()!r}")
    assert got[x == float("inf")].eq(1).all() and got[x == -float("inf")].eq(-1).all()
    zeros = x == 0  # the sign of zero kept, as erf does
    assert got[zeros].eq(0).all() and (got[zeros].signbit() == x[zeros].signbit()).all()


def test_fast_erf_on_the_host_is_within_its_bound(forced_fast, tmp_path):
    x = torch.cat([sweep(), torch.tensor([float("nan")])])
    f, plan, sk = erf_kernel(x.numel())
    out = torch.empty_like(x)
    run_on_host(sk, {f.inputs[0]: x, f.outputs[0]: out}, tmp_path)
    assert out[-1].isnan()
    assert_within_bound(out, x)


@pytest.mark.gpu
def test_fast_erf_on_the_gpu_is_within_its_bound(forced_fast):
    from runtime.executor import execute_plan
    from runtime.kernels import cuda_runner

    x = torch.cat([sweep(), torch.tensor([float("nan")])]).cuda()
    _, plan, _ = erf_kernel(x.numel())
    (out,) = execute_plan(plan, [x], cuda_runner, "cuda").outputs
    assert out[-1].isnan()
    assert_within_bound(out.cpu(), x.cpu())


@pytest.mark.parametrize("out_dtype, fast", [("BFloat16", True), ("Half", True),
                                             ("Float", False), ("Double", False)])
def test_fast_erf_only_where_outputs_are_16_bit(out_dtype, fast):
    f = erf_fusion(out_dtype)
    plan = make_plan(f, [tensor_meta((1024,), DType.float32)], PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    assert bool(fast_math_tensors(plan.bound, seg.schedule)) == fast
    source = generate_segment(plan, seg).source
    assert ("fc_erf_fast(" in source) == fast and ("erff(" in source) == (not fast)
