"""Definitions the planner must refuse with a fusecut error (a 422 from the service), never crash
on (a 500): issue 32's defect 5 (0-d tensors given axes, narrowed segment kinds, a packed-fp4
tensor of an odd size) and the planning half of defect 6 (op and dtype pairs nothing runs)."""

from __future__ import annotations

import pytest

from fusecut.optimizer.errors import DefinitionError, FusecutError, PlanError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, TensorMeta
from fusecut.optimizer.ir.nvtext import parse_text
from fusecut.optimizer.planner import PlanOptions, make_plan


def _plan(body: str, metas, **options):
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    fusion = parse_text(f"def f(fd):\n{lines}").fusion
    return make_plan(fusion, metas, PlanOptions(**options))


SCALAR_TENSOR = "T0 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float)\n"
ZERO_D = [TensorMeta((), (), DType.float32)]


@pytest.mark.parametrize("body, needle", [
    ("T1 = fd.ops.sum(T0, dims=[0])", "Reduction on invalid axis"),
    ("T1 = fd.ops.prod(T0, 0)", "Reduction on invalid axis"),
    ("T1 = fd.ops.max(T0, dims=[0])", "Reduction on invalid axis"),
    ("T1 = fd.ops.var(T0, dims=[0], correction=0)", "Reduction on invalid axis"),
    ("T1 = fd.ops.squeeze(T0, dims=[0])", "squeeze"),
    ("S1 = fd.ops.size(T0, 0)\nT1 = fd.ops.mul(T0, S1)", "out of boundary index"),
    ("T1 = fd.ops.cat([T0, T0], 0, manual_padding=True)", "Invalid dimension to cat"),
    ("T1 = fd.ops.linear(T0, T0)", "rank 1 or 2"),
])
def test_axes_of_a_0d_tensor_are_refused(body, needle):
    # before: IndexError (tuple index out of range) from the planner, a 500
    with pytest.raises(DefinitionError, match=needle):
        _plan(SCALAR_TENSOR + body + "\nfd.add_output(T1)", ZERO_D)


def test_linear_with_a_0d_input_is_refused():
    body = (SCALAR_TENSOR + "T1 = fd.define_tensor(shape=[-1], contiguity=[True], "
            "dtype=DataType.Float)\nT2 = fd.ops.linear(T0, T1)\nfd.add_output(T2)")
    with pytest.raises(DefinitionError, match="Input A must be at least 1D"):
        _plan(body, ZERO_D + [TensorMeta((3,), (1,), DType.float32)])


def test_kinds_that_cannot_run_an_op_are_a_plan_error():
    # before: AttributeError: 'Rejection' object has no attribute 'ops'
    body = ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)"
            "\nT1 = fd.ops.sum(T0, dims=[1])\nT2 = fd.ops.exp(T1)\nfd.add_output(T2)")
    metas = [TensorMeta((4, 8), (8, 1), DType.float32)]
    with pytest.raises(PlanError, match=r"options.kinds=\['library', 'fallback'\] leaves no "
                                        r"segment kind that can run sum: reduction"):
        _plan(body, metas, kinds=("library", "fallback"))
    assert _plan(body, metas, kinds=("pointwise", "reduction", "library", "fallback")).segments


@pytest.mark.parametrize("segmenter", ["cpsat", "mincut"])
def test_an_odd_sized_fp4_tensor_plans(segmenter):
    # before: 1,048,577 half-byte elements made a float capacity, which OR-Tools refuses
    body = ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float4_e2m1fn)"
            "\nT1 = fd.ops.neg(T0)\nT2 = fd.ops.neg(T1)\nfd.add_output(T2)")
    metas = [TensorMeta((1_048_577,), (1,), DType.float4_e2m1fn)]
    plan = _plan(body, metas, segmenter=segmenter)
    assert plan.segments
    assert DType.float4_e2m1fn.nbytes(1_048_577) == 524_289  # whole bytes, rounded up


def _unary(op: str, dtype: str) -> str:
    return (f"T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{dtype})\n"
            f"T1 = fd.ops.{op}(T0)\nfd.add_output(T1)")


def _binary(op: str, dtype: str) -> str:
    return (f"T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.{dtype})\n"
            f"T1 = fd.ops.{op}(T0, T0)\nfd.add_output(T1)")


@pytest.mark.parametrize("body, op, dtype", [
    (_unary("neg", "Bool"), "neg", "bool"),
    (_unary("abs", "Bool"), "abs", "bool"),
    (_unary("relu", "Bool"), "relu", "bool"),
    (_binary("bitwise_left_shift", "Bool"), "bitwise_left_shift", "bool"),
    (_binary("bitwise_right_shift", "Bool"), "bitwise_right_shift", "bool"),
    (_binary("nextafter", "Int"), "nextafter", "int64"),
    (_binary("add", "UInt64"), "add", "uint64"),
    (_binary("lt", "ComplexFloat"), "lt", "complex64"),
    (_unary("erf", "ComplexDouble"), "erf", "complex128"),
])
def test_op_and_dtype_pairs_nothing_runs_are_refused_when_planning(body, op, dtype):
    # before: planned, then torch's NotImplementedError when run (a 500 from /v1/execute)
    with pytest.raises(DefinitionError, match=f"{op} is not supported for {dtype} operands"):
        _plan(body, [TensorMeta((4,), (1,), DType(dtype))])


def test_the_pairs_that_run_still_plan():
    for body, dtype in ((_binary("add", "Bool"), DType.bool), (_unary("abs", "Int"), DType.int64),
                        (_binary("nextafter", "Float"), DType.float32),
                        (_binary("eq", "UInt64"), DType.uint64),
                        (_unary("exp", "ComplexFloat"), DType.complex64)):
        assert _plan(body, [TensorMeta((4,), (1,), dtype)]).segments
    # a scalar operand promotes first: bool tensor minus an int is an int subtraction
    body = ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Bool)\n"
            "S1 = fd.define_scalar(None, dtype=DataType.Int)\nT1 = fd.ops.sub(T0, S1)\n"
            "fd.add_output(T1)")
    assert _plan(body, [TensorMeta((4,), (1,), DType.bool), ScalarMeta(DType.int64)]).segments


def test_every_refusal_is_a_fusecut_error():
    assert issubclass(DefinitionError, FusecutError) and issubclass(PlanError, FusecutError)


def test_a_real_pad_value_for_a_complex_tensor_is_refused():
    body = ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.ComplexFloat)\n"
            "S1 = fd.define_scalar(1.5, dtype=DataType.Double)\n"
            "T1 = fd.ops.pad(T0, [1, 1], S1)\nfd.add_output(T1)")
    with pytest.raises(DefinitionError, match="Tensor arg and pad value must have the same dtype"):
        _plan(body, [TensorMeta((4,), (1,), DType.complex64)])


@pytest.mark.parametrize("body", [
    "T1, T2 = fd.ops.topk(T0, fd.define_scalar(1), 0)",
    "T1 = fd.ops.index_select(T0, I0, 0)",
    "T1 = fd.ops.take_along_axis(T0, I0, 0)",
    "T1 = fd.ops.gather(T0, I0, 0)",
    "T1 = fd.ops.scatter(T0, I0, T0, 0)",
    "T1 = fd.ops.select(T0, fd.define_scalar(0), 0)",
])
def test_indexing_a_0d_tensor_along_an_axis_is_refused(body):
    # before: a ZeroDivisionError (axis % rank) when binding or running: scatter's was a 500
    index = "I0 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Int)\n"
    metas = ZERO_D + [TensorMeta((), (), DType.int64)]
    with pytest.raises(DefinitionError, match="out of boundary index|outside it"):
        _plan(SCALAR_TENSOR + index + body + "\nfd.add_output(T1)", metas)


def test_argsort_of_a_0d_tensor_plans():
    # nvFuser (and torch) take dim 0 of a 0-d tensor here; its opinfo samples include one
    assert _plan(SCALAR_TENSOR + "T1 = fd.ops.argsort(T0, 0)\nfd.add_output(T1)", ZERO_D).segments
