"""nvFuser frontend forms that its own tests write: grammar, ops and dtypes beyond the corpus."""

from __future__ import annotations

import pytest
import torch

from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from fusecut.runtime.tensors import make_input
from tests.helpers import fusion
from tests.sample_inputs import sample_metas


def _run_both(f, metas=None, seed=0):
    """Outputs of the plan and of the reference on the same small inputs."""
    metas = metas or sample_metas(f)
    gen = torch.Generator().manual_seed(seed)
    args = [make_input(m, generator=gen) for m in metas]
    ref = run_reference(f, list(args))
    got = run_plan(make_plan(f, metas), list(args)).outputs
    return got, ref


def test_integer_flags_are_bools():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[0, 1], end_indices=[4, 3], strides=[1, 1],
                  manual_normalization=0)
T2 = fd.ops.cat([T1, T1], dim=1, manual_padding=0)
fd.add_output(T2)
""")
    assert f.ops[0].attrs["manual_normalization"] is False
    assert f.ops[1].attrs["manual_padding"] is False
    with pytest.raises(DefinitionError, match="manual_padding must be True or False, got 2"):
        fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T2 = fd.ops.cat([T0, T0], dim=0, manual_padding=2)
fd.add_output(T2)
""")


def test_same_output_twice_is_returned_twice():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.ops.neg(T0)
fd.add_output(T1)
fd.add_output(T1)
""")
    assert f.outputs == ["T1", "T1"]
    got, ref = _run_both(f)
    assert len(got) == 2
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[0], got[1])


def test_reshape_to_sizes_computed_from_scalars():
    # nvFuser's test_reshape_dynamic: the second extent is 192 * reciprocal(S0), a float
    f = fusion("""
S0 = fd.define_scalar(None, dtype=DataType.Int)
T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
S2 = fd.define_scalar(192, dtype=DataType.Int)
S3 = fd.ops.reciprocal(S0)
S4 = fd.ops.mul(S2, S3)
T5 = fd.ops.reshape(T1, new_shape=[S0, S4])
fd.add_output(T5)
""")
    from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
    metas = [ScalarMeta(DType.int64, 4), tensor_meta((4, 6, 8), DType.float32)]
    got, ref = _run_both(f, metas)
    assert got[0].shape == ref[0].shape == (4, 48)
    torch.testing.assert_close(got[0], ref[0])


def test_define_scalar_without_value_or_dtype_is_a_double_input():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
s0 = fd.define_scalar()
T1 = fd.ops.mul(T0, s0)
fd.add_output(T1)
""")
    assert f.inputs == ["T0", "s0"] and f.scalars["s0"].dtype is DType.float64


def test_tuple_targets_with_a_starred_name():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
var, mean = fd.ops.var_mean(T0, dims=[1], correction=0, keepdim=False)
(first, *rest) = fd.ops.var_mean(T0, dims=[0], correction=0, keepdim=False)
(*_, last) = fd.ops.var_mean(T0, dims=[0], correction=1, keepdim=False)
fd.add_output(mean)
fd.add_output(last)
""")
    assert f.outputs == ["mean", "last"]
    with pytest.raises(DefinitionError, match="cannot unpack 2 values into 3 names"):
        fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
a, b, c = fd.ops.var_mean(T0, dims=[1], correction=0, keepdim=False)
fd.add_output(a)
""")
    with pytest.raises(DefinitionError, match="assignment targets must be names"):
        fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T0.x = fd.ops.neg(T0)
""")


DROPOUT = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
S2 = fd.define_scalar(None, dtype=DataType.Int)
V = fd.ops.shape(T0)
T3 = fd.ops.uniform(0.0, 1.0, shape=V, dtype=DataType.Float, rng_seed=S1, rng_offset=S2)
S4 = fd.define_scalar(0.9, dtype=DataType.Double)
T5 = fd.ops.lt(T3, S4)
T6 = fd.ops.where(T5, T0, 0.0)
T7 = fd.ops.mul(T6, 1.1111111111111112)
fd.add_output(T7)
"""


def _dropout_args(seed, offset, n=256):
    return [torch.ones(n, n), seed, offset]


def test_uniform_with_seed_and_offset_is_deterministic_and_plans():
    f = fusion(DROPOUT)
    assert f.inputs == ["T0", "S1", "S2"]
    a = run_reference(f, _dropout_args(7, 0))[0]
    b = run_reference(f, _dropout_args(7, 0))[0]
    c = run_reference(f, _dropout_args(7, 4))[0]
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
    kept = (a != 0).float().mean().item()
    assert 0.88 < kept < 0.92  # keep probability 0.9
    from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
    metas = [tensor_meta((64, 64), DType.float32), ScalarMeta(DType.int64, 7),
             ScalarMeta(DType.int64, 0)]
    plan = make_plan(f, metas)
    assert [seg.kind.value for seg in plan.segments] == ["pointwise"]  # dropout is one kernel
    got = run_plan(plan, [torch.ones(64, 64), 7, 0]).outputs[0]
    torch.testing.assert_close(got, run_reference(f, [torch.ones(64, 64), 7, 0])[0])


def test_normal_has_its_mean_and_std():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
T2 = fd.ops.normal(3.0, 2.0, T0.shape(), dtype=DataType.Double, rng_seed=S1, rng_offset=0)
fd.add_output(T2)
""")
    (x,) = run_reference(f, [torch.zeros(100_000), 1])
    assert x.dtype == torch.float64 and x.shape == (100_000,)
    assert abs(x.mean().item() - 3.0) < 0.05 and abs(x.std().item() - 2.0) < 0.05


def test_shape_at_stride_order_and_cumsum():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
V1 = fd.ops.shape(T0)
S2 = fd.ops.at(V1, 1)
T3 = fd.ops.reshape(T0, new_shape=[S2, -1])
T4 = fd.ops.stride_order(T3, stride_order=[0, 1])
T5 = fd.ops.cumsum(T4, 0)
fd.add_output(T4)
fd.add_output(T5)
""")
    x = torch.arange(12.0).reshape(3, 4)
    got, ref = _run_both(f)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    t4, t5 = run_reference(f, [x])
    assert t4.shape == (4, 3) and t4.stride() == (1, 4)  # column-major, as stride_order asks
    torch.testing.assert_close(t5, torch.cumsum(x.reshape(4, 3), 0))
    with pytest.raises(DefinitionError, match=r"ops.at\(\): index 2 out of range"):
        fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.ops.at(fd.ops.shape(T0), 2)
""")


def test_narrow_and_wide_dtypes_plan_with_their_bytes_and_run_through_the_reference():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.cast(T0, dtype=DataType.Float8_e4m3fn)
T2 = fd.ops.cast(T1, dtype=DataType.Float)
T3 = fd.ops.relu(T2)
fd.add_output(T1)
fd.add_output(T3)
""")
    assert f.tensors["T1"].dtype is DType.float8_e4m3fn
    got, ref = _run_both(f)
    assert got[0].dtype == torch.float8_e4m3fn
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.float(), b.float())
    from fusecut.optimizer.ir.inputs import tensor_meta
    plan = make_plan(f, [tensor_meta((64, 64), DType.float32)])
    assert [s.kind.value for s in plan.segments] == ["pointwise"]  # fp8 casts in a kernel
    assert DType.float4_e2m1fn.itemsize == 0.5 and DType.float4_e2m1fn_x2.itemsize == 1
    assert tensor_meta((4, 8), DType.float4_e2m1fn).nbytes == 16
    for name in ("Float8_e8m0fnu", "ComplexFloat", "ComplexDouble", "UInt64"):
        g = fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{name})
T1 = fd.ops.set(T0)
fd.add_output(T1)
""")
        assert g.tensors["T1"].dtype.reference_only
    with pytest.raises(DefinitionError, match="DataType.Int8 is not supported"):
        fusion("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int8)")


@pytest.mark.parametrize("manual", [False, True])
@pytest.mark.parametrize("starts, ends, message", [
    ([-1, 0], [5, 5], "start_indices must be greater than or equal to 0"),
    ([3, 4], [1, 2], "end_indices must be greater than or equal to start_indices"),
])
def test_slice_refuses_negative_or_backward_constant_indices(starts, ends, message, manual):
    # as nvFuser's frontends do whatever manual_normalization says (its test_errors_slice_*)
    with pytest.raises(DefinitionError, match=f"op #0 slice: Slice operation {message}"):
        fusion(f"""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices={starts}, end_indices={ends}, manual_normalization={manual})
fd.add_output(T1)
""")


def test_slice_normalises_symbolic_negative_indices():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
T1 = fd.ops.slice(T0, start_indices=[S1], end_indices=[8])
fd.add_output(T1)
""")
    x = torch.arange(8.0)
    (out,) = run_reference(f, [x, -3])
    assert torch.equal(out, x[-3:])
