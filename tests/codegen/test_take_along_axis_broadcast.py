"""take_along_axis broadcasts its input and index against each other on the axes other than
``dim``, as torch.take_along_dim and nvFuser's takeAlongAxis do (nvFuser's opinfo
test_correctness_take_along_dim: an index of shape (8, 2, 1) into an input of shape (4, 2, 3)
along dim 0 gives (8, 2, 3)). The shape rule refused it; the kernels read a broadcast operand at
index 0 already."""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.reference import run_reference
from tests.helpers import fusion
from tests.host_kernels import host_runnable, run_on_host

TAKE = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Int)
T2 = fd.ops.take_along_axis(T0, T1, {dim})
fd.add_output(T2)
"""

CASES = [((4, 2, 3), 0, (8, 2, 1)), ((4, 2, 3), 0, (8, 1, 3)), ((4, 1, 3), 0, (8, 5, 3)),
         ((4, 2, 3), 2, (1, 2, 5)), ((4, 2, 3), 1, (4, 1, 3))]


def _inputs(src, dim, idx):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(src, generator=gen)
    index = torch.randint(0, src[dim], idx, generator=gen)
    return x, index


@pytest.mark.parametrize("src, dim, idx", CASES)
def test_the_output_takes_the_broadcast_extents(src, dim, idx):
    f = fusion(TAKE.format(dim=dim))
    x, index = _inputs(src, dim, idx)
    want = torch.take_along_dim(x, index, dim)
    bound = bind(f, [tensor_meta(src, DType.float32), tensor_meta(idx, DType.int64)])
    assert bound.shapes[f.outputs[0]] == tuple(want.shape)
    (got,) = run_reference(f, [x, index])
    assert torch.equal(got, want)


@pytest.mark.parametrize("src, dim, idx", CASES)
def test_the_kernel_reads_broadcast_operands_at_index_zero(src, dim, idx, tmp_path):
    f = fusion(TAKE.format(dim=dim))
    x, index = _inputs(src, dim, idx)
    want = torch.take_along_dim(x, index, dim)
    plan = make_plan(f, [tensor_meta(src, DType.float32), tensor_meta(idx, DType.int64)],
                     PlanOptions(time_limit_s=2, segmenter="greedy"))
    (seg,) = plan.segments
    sk = generate_segment(plan, seg)
    assert host_runnable(sk, sk.kernels[0].name)
    out = torch.empty(want.shape)
    run_on_host(sk, {f.inputs[0]: x, f.inputs[1]: index, f.outputs[0]: out}, tmp_path)
    assert torch.equal(out, want)


def test_extents_that_neither_match_nor_broadcast_are_refused():
    f = fusion(TAKE.format(dim=0))
    with pytest.raises(InputError, match="index axis 2 has extent 2; it must equal the input's "
                                         "extent 3 or either must be 1"):
        bind(f, [tensor_meta((4, 2, 3), DType.float32), tensor_meta((8, 2, 2), DType.int64)])
