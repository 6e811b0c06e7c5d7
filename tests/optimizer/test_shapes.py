"""Binding input metadata: validation against the definition and concrete shape inference."""

from __future__ import annotations

import pytest

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, TensorMeta

F32 = DType.float32


def fusion(body: str):
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return parse_text("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n" + lines).fusion


def test_input_checks_name_the_input():
    f = fusion("T0 = fd.define_tensor(shape=[-1, 4], contiguity=[True, True], "
               "dtype=DataType.Float)\nfd.add_output(fd.ops.neg(T0))")
    with pytest.raises(InputError, match=r"input 0 \(T0\): expected dtype float32, got bfloat16"):
        bind(f, [tensor_meta((2, 4), DType.bfloat16)])
    with pytest.raises(InputError, match="expected rank 2"):
        bind(f, [tensor_meta((2,), F32)])
    with pytest.raises(InputError, match="axis 1 is fixed to 4 by the definition, got 5"):
        bind(f, [tensor_meta((2, 5), F32)])
    with pytest.raises(InputError, match=r"has 1 input \(T0\) but 0 were given"):
        bind(f, [])
    with pytest.raises(InputError, match="is a tensor but a scalar"):
        bind(f, [ScalarMeta(F32, 1.0)])


def test_declared_broadcast_needs_stride_zero():
    f = fusion("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], "
               "dtype=DataType.Float)\nfd.add_output(fd.ops.neg(T0))")
    bound = bind(f, [TensorMeta((5, 3), (0, 1), F32)])
    assert bound.compact_numel("T0") == 3 and bound.broadcast["T0"] == (True, False)
    with pytest.raises(InputError, match="declared broadcast"):
        bind(f, [TensorMeta((5, 3), (3, 1), F32)])


def test_shapes_through_view_resize_and_reductions():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[0, 1, 6], end_indices=[2, 100, 8], strides=[1, 1, 1])
T2 = fd.ops.pad(T1, [1, 2, 0, 3])
T3 = fd.ops.permute(T2, dims=[2, 0, 1])
T4 = fd.ops.reshape(T3, new_shape=[-1, 7])
T5 = fd.ops.sum(T0, dims=[0, 2], keepdim=True)
T6, T7 = fd.ops.var_mean(T0, dims=[1], correction=1, keepdim=False)
T8 = fd.ops.cat([T0, T0], dim=1)
T9 = fd.ops.expand(T5, shape=[-1, -1, 9])
T10 = fd.ops.squeeze(T5, dims=[0, 2])
fd.add_output(T4)
fd.add_output(T5)
fd.add_output(T6)
fd.add_output(T8)
fd.add_output(T9)
fd.add_output(T10)
""")
    b = bind(f, [tensor_meta((3, 5, 9), F32)])
    assert b.shapes["T1"] == (2, 4, 2)  # slice end clamps to the extent; 6:8 is 2 wide
    assert b.shapes["T2"] == (2, 7, 5)  # pad [1, 2] on the last axis, [0, 3] on the middle one
    assert b.shapes["T3"] == (5, 2, 7)
    assert b.shapes["T4"] == (10, 7)
    assert b.shapes["T5"] == (1, 5, 1) and b.broadcast["T5"] == (True, False, True)
    assert b.shapes["T6"] == (3, 9) and b.shapes["T8"] == (3, 10, 9)
    assert b.shapes["T9"] == (1, 5, 9) and b.broadcast["T9"] == (True, False, True)
    assert b.compact_numel("T9") == 5  # an expanded broadcast is stored compactly
    assert b.shapes["T10"] == (5,)


def test_reshape_and_broadcast_mismatches_are_input_errors():
    f = fusion("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
               "T1 = fd.ops.reshape(T0, new_shape=[4, 4])\nfd.add_output(T1)")
    with pytest.raises(InputError, match=r"op #0 reshape\(T0\) -> T1: cannot reshape"):
        bind(f, [tensor_meta((15,), F32)])
    g = fusion("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
               "dtype=DataType.Float)\nT1 = fd.define_tensor(shape=[-1, -1], contiguity=[True,"
               " True], dtype=DataType.Float)\nfd.add_output(fd.ops.add(T0, T1))")
    with pytest.raises(InputError, match="extents do not match"):
        bind(g, [tensor_meta((2, 3), F32), tensor_meta((2, 4), F32)])


def test_scalars_are_evaluated_on_the_host():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.ops.reciprocal(T0.size(1))
S2 = fd.define_scalar(None, dtype=DataType.Double)
S3 = fd.ops.mul(S1, S2)
T4 = fd.ops.mul(T0, S3)
fd.add_output(T4)
""")
    b = bind(f, [tensor_meta((2, 8), F32), ScalarMeta(DType.float64, 3.0)])
    assert b.scalars["S1"] == 0.125 and b.scalars["S3"] == 0.375
    unknown = bind(f, [tensor_meta((2, 8), F32), ScalarMeta(DType.float64, None)])
    assert unknown.scalars["S3"] is None


def test_counts_in_messages_are_singular_for_one():
    # issue 32: "the definition has 1 inputs"
    from fusecut.optimizer.errors import DefinitionError, counted

    assert [counted(n, "input") for n in (0, 1, 2)] == ["0 inputs", "1 input", "2 inputs"]
    assert counted(1, "entry", "entries") == "1 entry" and counted(3, "axis", "axes") == "3 axes"
    two = fusion("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
                 "T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
                 "fd.add_output(fd.ops.add(T0, T1))")
    with pytest.raises(InputError, match=r"has 2 inputs \(T0, T1\) but 1 was given"):
        bind(two, [tensor_meta((2,), F32)])
    # nvFuser's own words here (issue 31), which count without a noun
    with pytest.raises(DefinitionError, match=r"Length of contiguity argument \(1\) must match "
                                              r"that of shape argument \(2\)"):
        fusion("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True], dtype=DataType.Float)")
    with pytest.raises(DefinitionError, match=r"broadcast_dims \[0\] has 1 entry but T0 has "
                                              r"rank 2"):
        fusion("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
               "dtype=DataType.Float)\n"
               "T1 = fd.ops.broadcast_in_dim(T0, shape=[2, 3, 4], broadcast_dims=[0])")
    with pytest.raises(DefinitionError, match="cannot unpack 2 values into 1 name$"):
        fusion("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
               "(a,) = (T0, T0)")
