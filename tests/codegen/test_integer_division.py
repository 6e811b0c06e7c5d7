"""Integer div, fmod and remainder in generated kernels, to torch's and nvFuser's semantics: C's
truncating ``/`` and ``%`` (remainder then takes the divisor's sign), and a zero divisor left to
the GPU as torch's CUDA kernels and nvFuser's leave it. A guard returning 0 for a zero divisor
made nvFuser's test_integer_division see 0 where torch's CUDA ``a / 0`` gives the hardware's
value."""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.helpers import fusion
from tests.host_kernels import run_on_host

OPS = {"div": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "fmod": torch.fmod,
       "remainder": torch.remainder}
DTYPES = {"Int32": (DType.int32, torch.int32), "Int": (DType.int64, torch.int64)}


def _plan(op: str, dtype: str, n: int):
    f = fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{dtype})
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{dtype})
T2 = fd.ops.{op}(T0, T1)
fd.add_output(T2)
""")
    d = DTYPES[dtype][0]
    plan = make_plan(f, [tensor_meta((n,), d), tensor_meta((n,), d)],
                     PlanOptions(time_limit_s=2, segmenter="greedy"))
    return f, plan


def _operands(dtype: torch.dtype, zeros: bool, device: str = "cpu"):
    a = torch.arange(-9, 10, dtype=dtype).repeat_interleave(19)
    b = torch.arange(-9, 10, dtype=dtype).repeat(19)
    if not zeros:
        b = torch.where(b == 0, torch.ones_like(b), b)
    return a.to(device), b.to(device)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_the_kernel_divides_without_a_zero_guard(op, dtype):
    _, plan = _plan(op, dtype, 361)
    (seg,) = plan.segments
    source = generate_segment(plan, seg).source
    assert "b == 0" not in source, source


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_signed_operands_truncate_as_torch_does(op, dtype, tmp_path):
    # on the host a zero divisor traps: only the signs are checked here
    a, b = _operands(DTYPES[dtype][1], zeros=False)
    f, plan = _plan(op, dtype, a.numel())
    (seg,) = plan.segments
    out = torch.empty_like(a)
    run_on_host(generate_segment(plan, seg), {f.inputs[0]: a, f.inputs[1]: b,
                                              f.outputs[0]: out}, tmp_path)
    assert torch.equal(out, OPS[op](a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_zero_divisors_on_the_gpu_give_what_torch_gives(op, dtype):
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.kernels import cuda_runner

    a, b = _operands(DTYPES[dtype][1], zeros=True, device="cuda")
    _, plan = _plan(op, dtype, a.numel())
    (out,) = execute_plan(plan, [a, b], cuda_runner, "cuda").outputs
    assert torch.equal(out, OPS[op](a, b))
