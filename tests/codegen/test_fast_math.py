"""``fc_erf_fast`` and ``fc_tanh_fast``: the erf and tanh a kernel computes where the result
reaches only 16-bit outputs (``codegen.precision``). Their error over a float32 sweep, from the
generated kernel itself: compiled as C++ and run on the host (``tests.host_kernels``), and on
the GPU, where 2^x and the reciprocal are the special-function unit's. And where codegen uses
them, and where not.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import fusecut.codegen.pointwise
from fusecut.codegen import generate_segment
from fusecut.codegen.precision import fast_math_tensors
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.helpers import fusion
from tests.host_kernels import run_on_host


@dataclass(frozen=True)
class Fast:
    op: str
    helper: str  # the fast function's name in the source
    precise: str  # the C function it replaces
    exact: object  # float64 reference
    max_ulp: float | None  # bound in float32 ulp of the true value, or
    max_relative: float | None  # a relative bound
    max_absolute: float  # and an absolute one (near +-1 it keeps 1 + f(x) accurate)


FAST = [Fast("erf", "fc_erf_fast", "erff(", torch.erf, 3, None, 2.4e-7),
        Fast("tanh", "fc_tanh_fast", "tanhf(", torch.tanh, None, 1e-5, 2.4e-7)]
IDS = [f.op for f in FAST]


def unary_fusion(op: str, out_dtype: str):
    return fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.ops.{op}(T0)
T2 = fd.ops.cast(T1, dtype=DataType.{out_dtype})
fd.add_output(T2)
""")


def sweep() -> torch.Tensor:
    """Float32 values across both functions' shapes: dense over [-5, 5] (each switch between
    forms, erf's clamp at 4), tiny and subnormal magnitudes, both sides of every switch, the
    edges, and a NaN last."""
    dense = torch.linspace(-5, 5, 1_000_001, dtype=torch.float64)
    tiny = torch.logspace(-44, 0, 4001, dtype=torch.float64)
    switches = torch.tensor([0.0625, 0.75, 4.0])
    near = torch.cat([switches, torch.nextafter(switches, torch.tensor(0.0))]).double()
    edges = torch.tensor([0.0, 20.0, 1e30, float("inf")], dtype=torch.float64)
    x = torch.cat([dense, tiny, near, edges]).float()
    return torch.cat([x, -x, torch.tensor([float("nan")])])


@pytest.fixture
def forced_fast(monkeypatch):
    """Fast math for every op that has a fast form: a float32 output then shows the fast
    function's own values, which a 16-bit output would round away."""
    from fusecut.codegen.precision import FAST_OPS

    def every_fast_op(bound, schedule):
        ops = [bound.fusion.ops[i] for i in schedule.ops]
        return frozenset(op.outputs[0] for op in ops if op.name in FAST_OPS)

    monkeypatch.setattr(fusecut.codegen.pointwise, "fast_math_tensors", every_fast_op)
    from fusecut.runtime import kernels

    kernels._code.clear()
    yield
    kernels._code.clear()


def fast_kernel(fast: Fast, n: int):
    f = unary_fusion(fast.op, "Float")
    plan = make_plan(f, [tensor_meta((n,), DType.float32)], PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    sk = generate_segment(plan, seg)
    assert f"{fast.helper}(" in sk.source
    return f, plan, sk


def assert_within_bounds(fast: Fast, got: torch.Tensor, x: torch.Tensor) -> None:
    assert got[-1].isnan()  # the sweep's NaN
    got, x = got[:-1].double(), x[:-1]
    true = fast.exact(x.double())
    error = (got - true).abs()
    spacing = (torch.nextafter(true.abs().float(), torch.tensor(float("inf"))).double()
               - true.abs().float().double())
    bounds = {"absolute": (error, fast.max_absolute)}
    if fast.max_ulp is not None:
        bounds["ulp"] = (error / spacing, fast.max_ulp)
    if fast.max_relative is not None:
        bounds["relative"] = (error / true.abs().clamp_min(1e-38), fast.max_relative)
    for name, (measured, bound) in bounds.items():
        worst = int(measured.argmax())
        assert measured[worst] <= bound, (
            f"{fast.op}({x[worst].item()!r}) = {got[worst].item()!r} against "
            f"{true[worst].item()!r}: {name} error {measured[worst].item():.3g} > {bound}")
    assert got[x == float("inf")].eq(1).all() and got[x == -float("inf")].eq(-1).all()
    zeros = x == 0  # the sign of zero kept, as erf and tanh do
    assert got[zeros].eq(0).all() and (got[zeros].signbit() == x[zeros].signbit()).all()


@pytest.mark.parametrize("fast", FAST, ids=IDS)
def test_fast_function_on_the_host_is_within_its_bounds(fast, forced_fast, tmp_path):
    x = sweep()
    f, plan, sk = fast_kernel(fast, x.numel())
    out = torch.empty_like(x)
    run_on_host(sk, {f.inputs[0]: x, f.outputs[0]: out}, tmp_path)
    assert_within_bounds(fast, out, x)


@pytest.mark.gpu
@pytest.mark.parametrize("fast", FAST, ids=IDS)
def test_fast_function_on_the_gpu_is_within_its_bounds(fast, forced_fast):
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.kernels import cuda_runner

    x = sweep().cuda()
    _, plan, _ = fast_kernel(fast, x.numel())
    (out,) = execute_plan(plan, [x], cuda_runner, "cuda").outputs
    assert_within_bounds(fast, out.cpu(), x.cpu())


@pytest.mark.parametrize("fast", FAST, ids=IDS)
@pytest.mark.parametrize("out_dtype, used", [("BFloat16", True), ("Half", True),
                                             ("Float", False), ("Double", False)])
def test_fast_function_only_where_outputs_are_16_bit(fast, out_dtype, used):
    f = unary_fusion(fast.op, out_dtype)
    plan = make_plan(f, [tensor_meta((1024,), DType.float32)], PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    assert bool(fast_math_tensors(plan.bound, seg.schedule)) == used
    source = generate_segment(plan, seg).source
    assert (f"{fast.helper}(" in source) == used and (fast.precise in source) == (not used)
