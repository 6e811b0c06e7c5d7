"""fd.validate's tolerances, nvFuser's (csrc/validator_utils.cpp): bfloat16 (and 8- and 4-bit
floats) after a reduction get ten times the half table, and a reduction's size multiplies the
sizes of the reductions before it. Both were missing: a bf16 normalization backward whose output
rounded one bf16 step (0.0625 near 8) from the reference failed nvFuser's
test_ws_tma_normalization2, which nvFuser's own validation accepts."""

from __future__ import annotations

import pytest
import torch

from fusecut import DataType, FusionDefinition
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.validation import ValidationError, reduction_sizes, tolerance
from tests.helpers import fusion


def test_bf16_after_a_reduction_gets_ten_times_the_half_tolerance():
    half = tolerance(DType.float16, 128)
    assert tolerance(DType.bfloat16, 128) == pytest.approx((half[0] * 10, half[1] * 10))
    assert tolerance(DType.float8_e4m3fn, 128) == tolerance(DType.bfloat16, 128)
    # without a reduction, the half table's first entries for both
    assert tolerance(DType.bfloat16, 1) == tolerance(DType.float16, 1)


def test_reduction_sizes_multiply_along_the_way():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[2])
T2 = fd.ops.broadcast_in_dim(T1, shape=[4, 8, 128], broadcast_dims=[0, 1])
T3 = fd.ops.mul(T0, T2)
T4 = fd.ops.sum(T3, dims=[2])
T5 = fd.ops.sum(T4, dims=[0, 1])
fd.add_output(T4)
fd.add_output(T5)
""")
    sizes = reduction_sizes(bind(f, [tensor_meta((4, 8, 128), DType.float32)]))
    assert sizes[f.outputs[0]] == 128 * 128
    assert sizes[f.outputs[1]] == 128 * 128 * 32


def _sum_of_sums() -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1, -1], dtype=DataType.BFloat16)
        t1 = fd.ops.cast(t0, DataType.Float)
        t2 = fd.ops.sum(t1, dims=[1])
        t3 = fd.ops.broadcast_in_dim(t2, shape=t1.shape(), broadcast_dims=[0])
        t4 = fd.ops.add(t1, t3)
        fd.add_output(fd.ops.cast(t4, DataType.BFloat16))
    return fd


def test_a_bf16_output_one_rounding_step_off_after_a_reduction_validates():
    fd = _sum_of_sums()
    x = torch.full((4, 128), 0.0625, dtype=torch.bfloat16)  # rows sum to 8
    want = (x.float() + 8.0).to(torch.bfloat16)
    off = want.clone()
    off[0, 0] += 0.0625  # the next bf16 value up
    assert float(off[0, 0]) - float(want[0, 0]) == 0.0625
    fd.validate([x], [off])
    with pytest.raises(ValidationError, match="output 0"):
        fd.validate([x], [want + 1])
