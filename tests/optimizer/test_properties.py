"""Properties over random well-formed definitions (see tests/strategies.py)."""

from __future__ import annotations

import torch
from hypothesis import given

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir import fusion_from_json, fusion_to_json, parse_text, print_fusion
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import TORCH_DTYPE, make_input
from tests.strategies import fusions


@given(fusions())
def test_text_ir_json_ir_is_identity(drawn):
    text = print_fusion(drawn.fusion, inputs=drawn.inputs)
    parsed = parse_text(text)
    assert parsed.inputs == drawn.inputs
    data = fusion_to_json(parsed.fusion)
    assert data == fusion_to_json(drawn.fusion)
    assert fusion_to_json(fusion_from_json(data)) == data


@given(fusions())
def test_shape_inference_agrees_with_the_reference(drawn):
    bound = bind(drawn.fusion, drawn.inputs)
    trace: dict[str, torch.Tensor] = {}
    args = [make_input(m) for m in drawn.inputs]
    run_reference(drawn.fusion, args, trace=trace)
    for name, value in trace.items():
        assert tuple(value.shape) == bound.shapes[name], name
        assert value.dtype == TORCH_DTYPE[drawn.fusion.tensors[name].dtype], name
        # a tensor bind calls broadcast along an axis really is constant along it
        for axis, flag in enumerate(bound.broadcast[name]):
            if flag and value.shape[axis] > 1:
                first = value.narrow(axis, 0, 1)
                assert torch.equal(value.float().nan_to_num(), first.expand_as(value).float()
                                   .nan_to_num()), (name, axis)
