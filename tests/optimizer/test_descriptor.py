"""Tensor descriptors nvFuser's way: contiguity and stride order from sizes and strides, and
contiguity read in allocation order when a stride order is given (issue 31)."""

from __future__ import annotations

import pytest

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir import FusionBuilder, parse_text, print_fusion
from fusecut.optimizer.ir.descriptor import (
    allocation_contiguity,
    compute_contiguity,
    compute_tensor_descriptor,
    logical_contiguity,
)
from fusecut.optimizer.ir.inputs import TensorMeta
from fusecut.optimizer.ir.wire import fusion_from_json, fusion_to_json

# (sizes, strides, contiguity in allocation order, stride order): nvFuser's own table
DESCRIPTORS = [
    ([2, 1, 3, 1, 4, 3], [12, 4, 4, 4, 1, 0], [True, None, True, None, True, None],
     [5, 4, 3, 2, 1, 0]),
    ([2, 3, 1, 5, 4], [28, 4, 14, 0, 1], [False, None, True, None, True], [4, 2, 3, 1, 0]),
    ([2, 2, 1, 1, 2, 2, 2], [8, 4, 3, 9, 2, 0, 1], [None, True, True, None, True, None, True],
     [5, 4, 3, 6, 2, 1, 0]),
    ([2, 2, 1, 2, 4, 2], [2, 32, 1, 8, 0, 4], [False, True, True, False, None, None],
     [2, 5, 0, 4, 1, 3]),
    ([2, 2, 2, 2], [8, 4, 2, 1], [True, True, True, True], [3, 2, 1, 0]),
    ([2, 1, 3, 1, 4], [24, 4, 8, 4, 2], [True, True, None, None, False], [4, 2, 3, 1, 0]),
    ([2, 2, 2, 2], [8, 4, 0, 2], [True, True, None, False], [3, 2, 1, 0]),
]


@pytest.mark.parametrize("sizes, strides, contiguity, order", DESCRIPTORS)
def test_compute_tensor_descriptor_matches_nvfuser(sizes, strides, contiguity, order):
    assert compute_tensor_descriptor(sizes, strides) == (contiguity, order)


def test_compute_contiguity_is_per_logical_axis():
    sizes = [2, 1, 3, 1, 4, 5, 6]
    assert compute_contiguity(sizes, [80, 30, 30, 456456465465, 0, 6, 1]) == \
        [False, None, True, None, None, True, True]
    assert compute_contiguity(sizes, [800, 300, 300, 456456465465, 0, 60, 10]) == \
        [False, None, True, None, None, True, False]


def test_contiguity_orders_are_inverse():
    order = [1, 2, 0]
    alloc = [True, None, True]  # allocation order (outermost first): axis 1, axis 0, axis 2
    logical = logical_contiguity(alloc, order)
    assert logical == [None, True, True]
    assert allocation_contiguity(logical, order) == alloc


def test_contiguity_is_read_in_allocation_order_with_a_stride_order():
    # the newcomer's repro: refused before with "axis 1 is declared broadcast but has extent 16"
    b = FusionBuilder()
    t = b.define_tensor(shape=[1, -1, -1], contiguity=[True, None, True],
                        stride_order=[1, 2, 0])
    (out,) = b.op("neg", [t], {})
    b.add_output(out)
    tv = b.fusion.tensors[t.name]
    assert tv.broadcast == (True, False, False)  # axis 0 (extent 1) is the broadcast one
    bound = bind(b.fusion, [TensorMeta((1, 16, 8), (8, 8, 1), tv.dtype)])
    assert bound.shapes[out.name] == (1, 16, 8)
    # printing and the wire keep nvFuser's order, so both round trips give the same tensor
    again = parse_text(print_fusion(b.fusion)).fusion.tensors[t.name]
    assert (again.contiguity, again.stride_order) == (tv.contiguity, tv.stride_order)
    wired = fusion_from_json(fusion_to_json(b.fusion)).tensors[t.name]
    assert (wired.contiguity, wired.stride_order) == (tv.contiguity, tv.stride_order)


def test_define_tensor_from_sizes_and_strides():
    b = FusionBuilder()
    t = b.define_tensor(sizes=[2, 3, 4], strides=[1, 8, 2])
    tv = b.fusion.tensors[t.name]
    assert tv.declared_shape == (-1, -1, -1)
    assert tv.stride_order == (0, 2, 1)
    static = b.define_tensor(sizes=[2, 1], strides=[1, 1], static_sizes=True)
    assert b.fusion.tensors[static.name].declared_shape == (2, 1)


@pytest.mark.parametrize("kwargs, needle", [
    ({"shape": [-1, -2], "contiguity": [True, True]}, "The value -2 at index 1 was neither"),
    ({"shape": [-1, -1], "contiguity": [True, True, True]},
     "Length of contiguity argument (3) must match that of shape argument (2)"),
    ({"shape": [-1, -1, -1], "stride_order": [0, 1, 1]}, "duplicated stride_order entries"),
    ({"shape": [-1, -1, -1], "stride_order": [0, 1, 5]}, "stride_order argument is out of range"),
])
def test_define_tensor_errors_use_nvfusers_words(kwargs, needle):
    with pytest.raises(DefinitionError) as info:
        FusionBuilder().define_tensor(**kwargs)
    assert needle in str(info.value)


def test_a_float_extent_is_a_type_error():
    with pytest.raises(TypeError, match=r"define_tensor\(\): incompatible function arguments"):
        FusionBuilder().define_tensor(shape=[10.0], contiguity=[True])
